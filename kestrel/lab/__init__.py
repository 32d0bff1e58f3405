"""kestrel.lab: the book's laboratory, beside the core and never imported by it.

    sweep.py      every size and k, the 27B runs, each live where a GPU holds it, else recorded
    roofline.py   what a step reads and launches, the read bandwidth, the floor, where a size fits
    results.py    results files: the writer the benchmark scripts use, the validating readers
    records*.py   the typed records those readers return; checks.py their field checks
    plots.py      offline plotly figures, provenance stamps, tables, the spread of repeats
    sizes.py      state and weight sizes per shape (chapter 1), projection uses (chapter 10)
    undo.py       chapter 8's storage, traffic and timing of the three ways to undo
    serving.py    chapter 8's projection to many sequences, the fits, the decision table
    primer.py     the back-of-envelope speedup of the primer chapter
    wiring.py     four wrong wirings of the MTP head, each bit-exact (chapter 4)
    batching.py   greedy and the undo strategies at batch sizes B (chapter 9, scripts/bench_batch.py)
    story.py      the 27B decomposition, one fix at a time, and the pairing x undo 2 x 2
    autosim.py    k = "auto"'s decisions priced by the cost model, no model run (tests, dev/adaptive_sim.py)
    exercises.py  each chapter's answer check: hidden until answered, then right or wrong
    diagrams/     the mechanism drawn by code: round timelines, the state ring, the cursors
    widgets/      the live replay and the cost explorer, each with a static twin

The lab reads the core (kestrel.*) and the repository's results/ folder; the core needs neither.
It imports plotly and ipywidgets, which a plain `import kestrel` never loads.
"""
