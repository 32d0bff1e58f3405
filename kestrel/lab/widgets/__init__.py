"""kestrel.lab.widgets: live views over kestrel.speculative (ipywidgets + plotly) and the plain figures under them.

Everything a widget shows is also a plain function returning a plotly figure, so the static
book shows the same views without a kernel (display them with ``kestrel.lab.plots.show``; the two
figures with frames, ``replay_frames_figure`` and ``cost_explorer_static``, with
``kestrel.lab.plots.show_animated``)::

    from kestrel.lab import widgets
    w = widgets.spec_replay()                 # live: choose shape, k, T, start, drafter, policy; Run
    w.app.run()                               # the same, from code (w.app.result: the SpecResult)
    c = widgets.cost_explorer(u)              # live: alpha_1..4, k, unit costs, policy -> predicted speedup
    b = widgets.batch_explorer()              # live: B, k, policy -> tokens/s against greedy at that B (chapter 9)

    widgets.hist_figure([r1, r2])             # n_ok histograms (SpecResults, RunSummaries, dicts, strings)
    widgets.phase_figure([r1, r2, r3])        # stacked ms/token per phase, greedy (same run) as reference
    widgets.speedup_figure(runs, predicted=u) # measured speedup, predicted beside it
    widgets.round_figure(r)                   # ms per phase, round by round, vs greedy for the same tokens
    widgets.cost_surface_figure(u, "replay", "article", measured=runs)   # predicted speedup over (k, alpha)
    widgets.replay_frames_figure(r)           # static twin of spec_replay: slider/play over the rounds
    widgets.cost_explorer_static(u)           # static twin of cost_explorer: slider over alpha
    rep = widgets.repeat_runs(model, prompts, repeats=5, units=u)    # median and range of repeats
    widgets.spread_figure([rep1, rep2], names=[...])                 # median speedup, range, model

A run is a spec.SpecResult, a spec.RunSummary (a results row is read through
RunSummary.from_dict) or a spec.Prediction (see runs.py).

  runs.py           inputs: runs and histograms as typed objects, unit costs, profiles
  figures.py        histogram, phase, speedup and round figures
  cost_figures.py   the cost model's surface and per-policy views
  frames.py         figures with frames (a recorded run replayed round by round)
  repeats.py        repeated runs: median and range of every small-model timing
  cache.py          models and engines kept between widget runs
  view.py           a live figure (an Output) and HTML helpers
  spec_replay.py, cost_explorer.py   the two widgets of chapters 5-7
  batch_explorer.py                  chapter 9's (its static twin: batch_figure)

Nothing here imports ipywidgets or plotly at import time (``import kestrel`` never does either):
the figure functions import plotly, the two widgets ipywidgets, when called. Each live figure is
the display bundle of an ``ipywidgets.Output`` (kestrel.lab.plots.bundle), held in the kernel's
widget state, so a reloaded page or a second tab draws it as it is now.
"""
from __future__ import annotations

from .batch_explorer import batch_explorer, batch_figure
from .cache import clear_cache, get_model, model_choices
from .cost_explorer import cost_explorer
from .cost_figures import cost_explorer_static, cost_surface_figure
from .figures import PHASE_COLORS, POLICY_COLORS, hist_figure, phase_figure, round_figure, speedup_figure
from .frames import replay_frames_figure
from .repeats import Repeated, repeat_runs, spread_figure
from .spec_replay import spec_replay

__all__ = [
    # plain figures (static book and widgets)
    "hist_figure", "phase_figure", "speedup_figure", "round_figure", "cost_surface_figure",
    "replay_frames_figure", "cost_explorer_static", "spread_figure",
    # repeated runs (median and range)
    "repeat_runs", "Repeated",
    # widgets
    "spec_replay", "cost_explorer", "batch_explorer", "batch_figure",
    # models
    "get_model", "model_choices", "clear_cache",
    "PHASE_COLORS", "POLICY_COLORS",
]
