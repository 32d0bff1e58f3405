#!/usr/bin/env python3
"""k = "auto" in simulation (kestrel/lab/autosim.py): each fixed k and auto over many seeds of
each acceptance case, every round priced by the cost model; a study of the chooser's decisions
before a change is measured for real (scripts/bench_adaptive.py on a GPU, chapter 10's live cell
on a CPU).

    python3 dev/adaptive_sim.py            # the 27B cases on results/bench_spec.json's unit costs, no noise
    python3 dev/adaptive_sim.py --cpu      # the tiny model's units measured here, with a CPU-like bias

--cpu prices the rounds with the bias that each k's rounds showed against their prices on a 2-core
CPU (k = 2, 3, 4 ran 0.98, 1.00, 1.02x, checkpoint + mtp over the six starts, 2026-12-07, once the
chains were timed after a verify as a round runs them; timed back to back they had run 1.03, 1.10,
1.12x, the draft phase 1.24-1.52x its price) and 8 % log-normal noise, and adds the tiny model's
own profile (teacher-forced over the six starts: d_2 0.854, d_3 0.295, d_4 0.409).

What it showed (2026-12-07, before the chains were timed after a verify): on the 27B costs auto
keeps 0.98 of the best fixed k's speed at E16 and 3.39 tokens a round and 0.98x greedy when
nothing is accepted; with the CPU bias 0.95-0.96 at E16 and the tiny model's profile. Four
variants of the chooser (climbs toward the previous depth's rate instead of a hit, no climbs, a
prior falling with depth, twice the hysteresis) moved these by 1 % or less, priced on one set of
unit costs. A fifth, the draft phase scaled apart from the rest of a round, measured live on the
CPU, did no better (0.916 of fixed k = 2's speed against the chooser's 0.923, eight repeats of the
six starts).

Later that day, on results/bench_spec_tmb.json's unit costs (the default engine's) and
bench_spec.json's, 30 seeds, without noise and with 5 % noise: hysteresis and exploring were
found taking a k predicted slower than a plain step (the opening 3, 2, 4, 3 with nothing
accepted, as the H100 run recorded it); the rule that only a probe may do so moved nothing
accepted from 0.983 to 0.984 of greedy and the rest by under 0.1 %, and was kept. Not kept: the
prior counted as half (a quarter of) an observation, which took nothing accepted to 0.990
(0.992) but E16 to 0.974 (0.953) of the best fixed k, from 0.988; exploring only a k predicted
3 % or 5 % under a plain step, which moved every case by 0.2 % or less. Priced without the
host's time, the decisions alone keep 0.98 of greedy when nothing is accepted, where the H100 run
measured 0.964: the rest of that miss is not in the decisions. Auto's engine (mmax = k_max) is
0.5 % of it (its plain steps 18.99 against 18.90 ms in that file); the remainder, about 1.4 %,
is what the simulation does not price. The host's Python a plain round is a small part of it:
0.07 ms a round on a 2-core CPU (the recorded bookkeeping of auto's plain rounds, nothing
accepted, the tiny model, against 0.002 ms for greedy's argmax), so about 0.4 % of a 27B step
if the GPU's host is as fast; the rest is not located (that run timed neither apart).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kestrel import speculative as spec  # noqa: E402
from kestrel.lab import autosim  # noqa: E402

KS = (2, 3, 4)


def main(argv=None, units=None):
    """units: UnitCosts to price with instead of measuring (--cpu) or reading them."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the tiny model's unit costs measured here, CPU-like bias")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--T", type=int, default=64)
    a = ap.parse_args(argv)
    cases = autosim.cases(a.T)
    if a.cpu:
        import kestrel
        units = units or spec.measure_unit_costs(kestrel.load("tiny", device="cpu"), k_max=4)
        kw = dict(bias={0: 1.0, 2: 0.98, 3: 1.00, 4: 1.02}, sigma=0.08)
        cases.append(("tiny mtp-like", lambda seed: spec.Schedule(profile=(0.854, 0.295, 0.409),
                                                                  pairing="trained", seed=seed)))
    else:
        from kestrel.lab import results
        units = units or results.load_spec("bench_spec").large.units
        kw = {}
    g = units.greedy_ms_per_token
    for name, make in cases:
        r = autosim.compare(units, make, a.T, KS, a.seeds, **kw)
        best = min(KS, key=lambda k: r[k])
        print(f"{name:22s} " + "  ".join(f"k={k} {g / r[k]:.3f}x" for k in KS)
              + f"  auto {g / r['auto']:.3f}x  auto/best(k={best}) {r[best] / r['auto']:.3f}  "
              + "".join(map(str, r["trace"])))


if __name__ == "__main__":
    main()
