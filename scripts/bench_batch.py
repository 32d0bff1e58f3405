#!/usr/bin/env python3
"""Many sequences at once: greedy and each undo strategy at batch sizes B, k = 2..4, in one run:
OUTDIR/bench_batch.json + .md (kestrel/lab/batching.py does the measuring).

    python3 scripts/bench_batch.py --out OUTDIR                              # the embedded model
    python3 scripts/bench_batch.py --preset test-b --B 1 4 16 --T 24 --out OUTDIR

Each sequence replays its own random draws of one acceptance profile (the article's E16 under
the trained pairing by default) with the replay drafter, which runs and pays for the real MTP
steps. The table gives tokens/s of the whole batch, ms per output token of one sequence, the
speedup over greedy at the same B, bit-exactness of every stream, and each policy's own account
of the recurrent-state bytes it moves per round and holds. The batched pass runs on the CPU
backend; the CUDA backend has no batched launch plan yet and refuses a BatchEngine.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kestrel  # noqa: E402
from kestrel import speculative as spec  # noqa: E402
from kestrel.lab import batching, results  # noqa: E402


def render(d: dict) -> str:
    L = ["# Many sequences at once: greedy and the undo strategies at batch size B", "",
         f"- device: {d['device']}", f"- date: {d['date']}", f"- command: `{d['command']}`",
         f"- commit: {d.get('commit')}",
         f"- model: {d['model']}; T = {d['T']} tokens a sequence; drafts: the replay drafter, each sequence its own "
         f"draws of the profile {d['profile']} ({d['pairing']} pairing)", "",
         "`speedup`: greedy's batch time at the same B over the row's. `moved/round`: recurrent-state bytes one "
         "sequence reads + writes per round, the policy's own account over the rounds run (mean over the "
         "sequences). `held`: recurrent-state bytes all B sequences hold (live state + what the policy keeps "
         "beside it).", "",
         "| B | mode | k | tokens/s | ms/token (one sequence) | speedup | tokens/round | moved/round (MB) | held (MB) "
         "| passes | bit-exact |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        moved = "" if r["moved_per_round"] is None else f"{r['moved_per_round'] / 1e6:.3f}"
        L.append(f"| {r['B']} | {r['mode']} | {r['k'] or ''} | {r['tokens_per_s']:.1f} | {r['ms_per_token']:.3f} | "
                 f"{r['speedup']:.2f}x | {r.get('tokens_per_round', 1.0):.2f} | {moved} | "
                 f"{r['held_bytes'] / 1e6:.3f} | {r['passes']} | {r['bit_exact']} |")
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--B", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--policies", nargs="+", default=["replay", "checkpoint", "input-cache"])
    ap.add_argument("--T", type=int, default=32)
    a = ap.parse_args(argv)
    model = kestrel.load(a.preset, device=a.device)
    rows = batching.sweep(model, Bs=a.B, policies=a.policies, ks=a.k, T=a.T, log=print)
    prov = results.Provenance(model.be.device_name, _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              results.recorded_command("scripts/bench_batch.py",
                                                       argv if argv is not None else sys.argv[1:], {}),
                              results.measured_commit(), None)
    d = {"model": model.cfg.name, "T": a.T, "profile": list(spec.E16_PROFILE), "pairing": "trained", "rows": rows}
    path = results.write(a.out, "bench_batch", d, render, prov)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
