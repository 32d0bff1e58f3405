#!/usr/bin/env python3
"""k = "auto" beside every fixed k and greedy, all in one run: results/bench_adaptive.json + .md.

    python3 scripts/bench_adaptive.py --out results           # on a GPU that holds the 27B shape
    python3 scripts/bench_adaptive.py --quick --out OUTDIR    # CPU stand-ins (test-a, tiny), T = 24

Cases (checkpoint policy, trained pairing; every run bit-exact against the greedy stream):
  (a) the Qwen3.5-27B shape, random bf16 weights, the replay drafter forcing: the article's E16
      profile; 2.8 tokens a round (the cycled n_ok sequence); a profile of mean advance 3.39 at
      k = 4; nothing accepted (only the free d_1); and a switch by token position (good drafts,
      then useless ones, then good again), whose auto run's k per round is the trace.
  (b) the embedded tiny model end to end (the mtp drafter), on this device: where a round costs
      several steps (a GPU runs it launch-bound), every fixed k loses and auto should not.
Each mode (greedy, k = 2, 3, 4, auto) runs `--repeats` times on the same prompt; the table gives the
medians, speedup = greedy's median / the mode's. A profile drawn at random (E16, 3.39 tokens a
round) is drawn `--seeds` times (default 8) and each mode's ms/token is the mean over the draws of
each draw's median: one 64-token draw moves a mode by a round or two (a standard deviation of 6-7 %
of its ms/token at either profile, priced on the 27B costs by kestrel/lab/autosim.py over 40 draws),
more than the 5 % auto is held to. Auto's unit costs are measured once, before the runs, on the same
model (kestrel.speculative.measure_unit_costs).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kestrel  # noqa: E402
from kestrel import settings  # noqa: E402
from kestrel import speculative as spec  # noqa: E402
from kestrel.lab import autosim, results, sweep  # noqa: E402

KS = (2, 3, 4)


def cases_27b(T: int) -> list:
    """(name, Schedule factory (the most drafts a round takes, a seed), drawn at random?) of part
    (a). A sequence's n_ok is cut to a fixed k's (all of its drafts accepted) for the runs of
    smaller k; a profile's rounds are drawn from the seed."""
    def seq(s, **kw):
        return lambda k, seed: spec.Schedule(seq=[min(n, k) for n in s], pairing="trained", **kw)

    def profile(alphas):
        return lambda k, seed: spec.Schedule(profile=alphas, pairing="trained", seed=seed)
    return [("E16 profile", profile(spec.E16_PROFILE), True),
            ("2.8 tokens/round, cycled", seq(sweep.SEQ_2P8), False),
            ("3.39 tokens/round", profile((sweep.ALPHA_3P39,) * 3), True),
            ("nothing accepted", seq([1]), False),
            ("good, useless, good (by token)", seq(autosim.switch(T), by="token"), False)]


SAME = "greedy, auto's engine"


def run_case(model, prompt, T, units, repeats, drafter, schedule=None, seeds: int = 1, log=print) -> list:
    """Every mode on one case -> the rows and whether every run was bit-exact. ms/token: each seed's
    median over repeats, then the mean over the seeds (a profile drawn at random: one 64-token
    draw of it moves a mode's speed by more than auto is compared by)."""
    g_eng = kestrel.Engine(model, max_seq=len(prompt) + T + 8, mmax=1, batch="flex")
    spec.greedy_timed(model, prompt, min(T, 8), engine=g_eng)                      # warm-up
    ref, _, _ = spec.greedy_timed(model, prompt, T, engine=g_eng)
    greedy = [spec.greedy_timed(model, prompt, T, engine=g_eng)[1] / T for _ in range(repeats)]
    rows = [{"mode": "greedy", "ms_per_token": statistics.median(greedy), "bit_exact": True}]
    # one engine per k, reused by every run of it (its plans are lowered and captured once, in the
    # warm-up run); auto shares k_max's
    engines = {k: kestrel.Engine(model, max_seq=len(prompt) + T + 8 + k, mmax=k, batch="flex") for k in KS}
    # greedy again on the engine auto runs on: separates what that engine's steps cost from what
    # auto's own loop costs (an auto run that cannot pay is all plain steps on it)
    e_max = engines[max(KS)]
    spec.greedy_timed(model, prompt, min(T, 8), engine=e_max)
    same = [spec.greedy_timed(model, prompt, T, engine=e_max)[1] / T for _ in range(repeats)]
    rows.append({"mode": SAME, "ms_per_token": statistics.median(same), "bit_exact": True})
    for mode in [*[f"k={k}" for k in KS], "auto"]:
        kw = dict(k="auto", k_max=max(KS), unit_costs=units) if mode == "auto" else dict(k=int(mode[2:]))
        kw["engine"] = engines[max(KS) if mode == "auto" else kw["k"]]
        per_seed, exact, mid = [], True, None
        for seed in range(seeds):
            runs = []
            for rep in range(repeats + (seed == 0)):      # the first run warms the plans its rounds use
                sched = None if schedule is None else schedule(max(KS) if mode == "auto" else kw["k"], seed)
                r = spec.run_spec(model, prompt, T, policy="checkpoint", drafter=drafter, schedule=sched,
                                  reference=ref, greedy=False, **kw)
                if rep or seed:
                    runs.append(r)
            ms = [r.spec_ms / T for r in runs]
            per_seed.append(statistics.median(ms))
            exact = exact and all(r.bit_exact for r in runs)
            if mid is None:                               # seed 0's median run
                mid = runs[int(np.argsort(ms)[len(ms) // 2])]
        row = {"mode": mode, "ms_per_token": statistics.fmean(per_seed), "bit_exact": exact}
        if seeds > 1:
            row["ms_per_token_by_seed"] = per_seed
        if mode == "auto":
            row["k_per_round"] = [x.k for x in mid.rounds]
        rows.append(row)
    g = rows[0]["ms_per_token"]
    for row in rows:
        row["speedup"] = g / row["ms_per_token"]
        log(f"    {row['mode']:6s} {row['ms_per_token']:8.3f} ms/token  {row['speedup']:.3f}x  bit-exact {row['bit_exact']}")
    return rows


def render(d: dict) -> str:
    L = ["# k = \"auto\" beside every fixed k and greedy", "",
         f"- device: {d['device']}", f"- date: {d['date']}", f"- command: `{d['command']}`",
         f"- commit: {d.get('commit')}", "",
         f"Checkpoint policy, trained pairing; each mode run {d['repeats']} time(s) on one prompt, ms/token the "
         "median, speedup greedy's median / the mode's. `auto` picks each round's k in 0..4 (0: a plain step) "
         "from unit costs measured before the runs and the acceptance seen so far "
         "(kestrel/speculative/adaptive.py). `best fixed`: the fastest of k = 2, 3, 4."]
    if any("seeds" in c for c in d["cases"]):
        L[-1] += (" A case marked `(n draws)` is a profile drawn at random: each draw is run that many times, "
                  "and its ms/token is the mean over the n draws of each draw's median.")
    L += ["", "| model | case | T | greedy ms/token | k=2 | k=3 | k=4 | auto | auto / best fixed | auto vs greedy | "
          "bit-exact |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in d["cases"]:
        rs = {r["mode"]: r for r in c["runs"]}
        best = min((r for m, r in rs.items() if m.startswith("k=")), key=lambda r: r["ms_per_token"])
        cell = lambda m: f"{rs[m]['ms_per_token']:.3f} ({rs[m]['speedup']:.2f}x)"   # noqa: E731
        name = f"{c['name']} ({c['seeds']} draws)" if "seeds" in c else c["name"]
        L.append(f"| {c['model']} | {name} | {c['T']} | {rs['greedy']['ms_per_token']:.3f} | {cell('k=2')} | "
                 f"{cell('k=3')} | {cell('k=4')} | {cell('auto')} | "
                 f"{best['ms_per_token'] / rs['auto']['ms_per_token']:.3f} | {rs['auto']['speedup']:.3f}x | "
                 f"{all(r['bit_exact'] for r in c['runs'])} |")
    same = [(c, {r["mode"]: r for r in c["runs"]}) for c in d["cases"]]
    same = [(c, rs) for c, rs in same if SAME in rs]
    if same:
        L += ["", "Greedy again on the engine the auto runs use (mmax = k_max): what its plain steps cost, "
              "against greedy's own engine (mmax = 1):", ""]
        L += [f"- {c['model']}, {c['name']}: {rs[SAME]['ms_per_token']:.3f} ms/token against "
              f"{rs['greedy']['ms_per_token']:.3f}" for c, rs in same]
    L += ["", "k per round of each auto run (0: a plain step):", ""]
    for c in d["cases"]:
        ks = c["runs"][-1].get("k_per_round", [])
        L.append(f"- {c['model']}, {c['name']}: `{''.join(str(k) for k in ks)}`")
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--quick", action="store_true", help="CPU stand-ins: test-a for the 27B part, T = 24, one repeat")
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--seeds", type=int, default=8, help="draws of each random profile (E16, 3.39 tokens a round)")
    a = ap.parse_args(argv)
    if a.seeds < 1:
        ap.error(f"--seeds must be at least 1, got {a.seeds}")
    T, repeats = (24, 1) if a.quick else (a.T, a.repeats)
    seeds = min(a.seeds, 2) if a.quick else a.seeds
    cases = []
    parts = [] if a.skip_large else [("test-a" if a.quick else "qwen3.5-27b", "replay")]
    parts.append(("tiny", "mtp"))
    device = None
    for preset, drafter in parts:
        model = (kestrel.load(preset, device="cpu" if a.quick else "auto") if preset == "tiny" else
                 kestrel.load(preset, device="cpu" if a.quick else "cuda", dtype="bf16"))
        device = device or model.be.device_name
        prompt = (spec.default_starts(model)[0][1] if preset == "tiny" else
                  [int(t) for t in np.random.default_rng(0).integers(0, model.cfg.vocab_size, 32)])
        print(f"{preset} on {model.be.device_name}: measuring unit costs")
        units = spec.measure_unit_costs(model, k_max=max(KS), ctx=len(prompt) + T // 2)
        todo = cases_27b(T) if drafter == "replay" else [("end to end, mtp drafter", None, False)]
        for name, sched, drawn in todo:
            print(f"  {name}")
            n = seeds if drawn else 1
            runs = run_case(model, prompt, T, units, repeats, drafter, sched, seeds=n)
            what = sched(max(KS), 0).describe() if sched is not None else "the model's own drafts (mtp drafter)"
            case = {"name": name, "model": model.cfg.name, "what": what, "T": T, "runs": runs}
            if n > 1:
                case["seeds"] = n
            cases.append(case)
        del model
        sweep.free_device_memory()
    be_kernels = None if a.quick else {"gemv": settings.get("KESTREL_BF16_GEMV")}
    prov = results.Provenance(device, _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              results.recorded_command("scripts/bench_adaptive.py", argv if argv is not None else
                                                       sys.argv[1:], settings.kernel_switches()),
                              results.measured_commit(), be_kernels)
    d = {"repeats": repeats, "cases": cases}
    path = results.write(a.out, "bench_adaptive_quick" if a.quick else "bench_adaptive", d, render, prov)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
