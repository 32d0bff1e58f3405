#!/usr/bin/env python3
"""Many sequences at once: greedy and each undo strategy at batch sizes B, k = 2..4, in one run:
OUTDIR/bench_batch.json + .md (kestrel/lab/batching.py does the measuring).

    python3 scripts/bench_batch.py --out OUTDIR                              # the embedded model
    python3 scripts/bench_batch.py --preset test-b --B 1 4 16 --T 24 --out OUTDIR
    python3 scripts/bench_batch.py --preset qwen3.5-27b --dtype bf16 --gemv tmb --tiled-only --B 1 4 16 --out OUTDIR

Each sequence replays its own random draws of one acceptance profile (the article's E16 under
the trained pairing by default) with the replay drafter, which runs and pays for the real MTP
steps. The table gives tokens/s of the whole batch, ms per output token of one sequence, the
speedup over greedy at the same B, bit-exactness of every stream, and each policy's own account
of the recurrent-state bytes it moves per round and holds. On the GPU the greedy rows also give
the weight-streaming floor: B tokens a pass can go no faster than one read of the weights a pass
(kestrel/lab/roofline.py), and the table says how far each B's greedy pass is from it.
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
from kestrel.lab import batching, results, roofline  # noqa: E402
from kestrel.lab.records_bench import BatchPasses  # noqa: E402


def render(d: dict) -> str:
    L = ["# Many sequences at once: greedy and the undo strategies at batch size B", "",
         f"- device: {d['device']}", f"- date: {d['date']}", f"- command: `{d['command']}`",
         f"- commit: {d.get('commit')}",
         f"- model: {d['model']} ({d.get('weights', 'fp32')} weights, kernels {d.get('kernels')}); T = {d['T']} tokens a sequence; drafts: the replay drafter, each sequence its own "
         f"draws of the profile {d['profile']} ({d['pairing']} pairing)", "",
         "`speedup`: greedy's batch time at the same B over the row's. `moved/round`: recurrent-state bytes one "
         "sequence reads + writes per round, the policy's own account over the rounds run (mean over the "
         "sequences). `held`: recurrent-state bytes all B sequences hold (live state + what the policy keeps "
         "beside it).", "",
         "| B | mode | k | tokens/s | ms/token (one sequence) | speedup | tokens/round | moved/round (MB) | held (MB) "
         "| passes | bit-exact |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    made = any("plans_lowered_or_captured_while_timed" in r for r in d["rows"])
    if made:                     # newer files: the plans a timed run lowered or captured (0: none paid)
        L[-3] += (" `plans made`: plans lowered or graphs captured during the timed run (a GPU; each is an eager "
                  "run or a capture paid inside it).")
        L[-2] += " plans made |"
        L[-1] += "---|"
    for r in d["rows"]:
        moved = "" if r["moved_per_round"] is None else f"{r['moved_per_round'] / 1e6:.3f}"
        L.append(f"| {r['B']} | {r['mode']} | {r['k'] or ''} | {r['tokens_per_s']:.1f} | {r['ms_per_token']:.3f} | "
                 f"{r['speedup']:.2f}x | {r.get('tokens_per_round', 1.0):.2f} | {moved} | "
                 f"{r['held_bytes'] / 1e6:.3f} | {r['passes']} | {r['bit_exact']} |"
                 + (f" {r.get('plans_lowered_or_captured_while_timed', '')} |" if made else ""))
    if d.get("partial"):
        L += ["", "**Partial:** this run stopped before it finished (its file is written after each batch size); "
              "the table holds what it measured."]
    if d.get("did_not_fit"):
        L += ["", "Not measured, because the run's engine did not fit in the device's memory: "
              + "; ".join(f"B = {u['B']} {u['mode']}" + (f" k = {u['k']}" if u["k"] else "") + f" ({u['error']})"
                          for u in d["did_not_fit"]) + "."]
    fl = d.get("floor")
    if fl:
        g = {r["B"]: r for r in d["rows"] if r["mode"] == "greedy"}
        L += ["", f"## Greedy against the weight-streaming floor", "",
              f"A greedy pass reads every weight once ({fl['weight_bytes'] / 1e9:.2f} GB, whatever B is); at "
              f"{fl['Bps'] / 1e12:.2f} TB/s ({fl['kind']}, measured in this run) that is {fl['ms']:.3f} ms, the "
              "floor of one pass. `pass / floor`: the measured greedy pass over it. `x B=1`: tokens/s over "
              "tokens/s at B = 1.", "", "| B | pass (ms) | pass / floor | tokens/s | x B=1 |", "|---|---|---|---|---|"]
        one = g.get(min(g)) if g else None
        for B, r in sorted(g.items()):
            L.append(f"| {B} | {r['ms_per_token']:.3f} | {r['ms_per_token'] / fl['ms']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{r['tokens_per_s'] / one['tokens_per_s']:.1f} |")
    uc = d.get("unit_costs")
    if uc:
        k = uc[0]["k"]
        ns = range(1, k + 1)
        L += ["", "## One round's passes, each timed alone", "",
              f"Each pass over all B sequences at k = {k} rows a sequence, timed alone between a mark and a rollback "
              f"(median of {uc[0]['reps']}; kestrel/lab/batching.py unit_costs), ms. A checkpointed round pays "
              "`verify (ckpt)` + `select n`, a cached round `verify (cached)` + `fold n`, n the rows a sequence keeps; "
              "`ckpt - cached` is the first minus the second at each n (above 0: the input cache's round is cheaper).",
              "", "| B | greedy pass | verify (ckpt) | " + " | ".join(f"select {n}" for n in ns) + " | verify (cached) | "
              + " | ".join(f"fold {n}" for n in ns) + " | " + " | ".join(f"ckpt - cached, n = {n}" for n in ns) + " |",
              "|---|---|---|" + "---|" * (3 * k + 1)]
        for p in map(BatchPasses.of, uc):
            diff = [p.checkpointed_round(n) - p.cached_round(n) for n in ns]
            L.append(f"| {p.B} | {p.step:.3f} | {p.verify_ckpt:.3f} | "
                     + " | ".join(f"{p.select[n]:.3f}" for n in ns) + f" | {p.verify_cached:.3f} | "
                     + " | ".join(f"{p.fold[n]:.3f}" for n in ns) + " | " + " | ".join(f"{x:+.3f}" for x in diff) + " |")
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--B", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--policies", nargs="*", default=["replay", "checkpoint", "input-cache"],
                    help="undo strategies (none: greedy only)")
    ap.add_argument("--greedy-B", type=int, nargs="*", default=[], help="more batch sizes, greedy only")
    ap.add_argument("--T", type=int, default=32)
    ap.add_argument("--dtype", default=None, choices=("fp32", "bf16"), help="weights (default: the preset's)")
    ap.add_argument("--gemv", default=None, help="the CUDA backend's bf16 GEMV (kernel option gemv)")
    ap.add_argument("--tiled-only", action="store_true",
                    help="with --gemv tmb: keep each projection only as its tiled copy (kernel option tiled_only)")
    ap.add_argument("--no-unit-costs", action="store_true",
                    help="skip timing one round's passes alone (with checkpoint and input-cache among the policies)")
    a = ap.parse_args(argv)
    kw = {"dtype": a.dtype} if a.dtype else {}
    kernels = {"gemv": a.gemv} if a.gemv else {}
    if a.tiled_only:
        kernels["tiled_only"] = True
    if kernels:
        kw["kernels"] = kernels
    model = kestrel.load(a.preset, device=a.device, **kw)
    bw = roofline.read_bandwidth(model.be)
    wb = roofline.weight_bytes(model.cfg, model.weight_dtype)
    floor = {"weight_bytes": wb, "Bps": bw["Bps"], "kind": bw["kind"], "ms": wb / bw["Bps"] * 1e3}
    rows, units, unfit = [], [], []    # unfit: runs whose engine did not fit in the device's memory

    def write(partial: bool):
        prov = results.Provenance(model.be.device_name,
                                  _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                  results.recorded_command("scripts/bench_batch.py",
                                                           argv if argv is not None else sys.argv[1:], {}),
                                  results.measured_commit(), None)
        d = {"model": model.cfg.name, "T": a.T, "profile": list(spec.E16_PROFILE), "pairing": "trained",
             "rows": sorted(rows, key=lambda r: r["B"]),   # stable: each B's rows in the order run
             "weights": model.weight_dtype,
             "kernels": None if model.be.kernels is None else model.be.kernels.as_dict(), "floor": floor}
        if units:
            d["unit_costs"] = sorted(units, key=lambda u: u["B"])
        if unfit:
            d["did_not_fit"] = unfit
        if partial:                # written after each B, so a run stopped part-way keeps what it measured
            d["partial"] = True
        return results.write(a.out, "bench_batch", d, render, prov)

    for B in a.B:
        rows += batching.sweep(model, Bs=[B], policies=a.policies, ks=a.k, T=a.T, log=print, did_not_fit=unfit)
        write(partial=True)
    if a.greedy_B:                 # larger batches, greedy only (the undo strategies' states need more memory)
        rows += batching.sweep(model, Bs=a.greedy_B, policies=(), ks=a.k, T=a.T, log=print, did_not_fit=unfit)
    if {"checkpoint", "input-cache"} <= set(a.policies) and not a.no_unit_costs:
        ran = {(r["B"], r["mode"]) for r in rows}
        for B in [B for B in a.B if (B, "checkpoint") in ran and (B, "input-cache") in ran]:
            # what a round of each pays, pass by pass, at the largest k (where both ran)
            units.append(batching.unit_costs(model, B, max(a.k)))
            u = units[-1]
            print(f"B={B:4d} k={u['k']} passes (ms): greedy {u['step']:.3f}  verify ckpt {u['verify_ckpt']:.3f} + select "
                  + "/".join(f"{v:.3f}" for v in u["select"].values()) + f"  verify cached {u['verify_cached']:.3f} + "
                  "fold " + "/".join(f"{v:.3f}" for v in u["fold"].values()))
            write(partial=True)
    path = write(partial=False)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
