#!/usr/bin/env python3
"""Speculative decoding benchmark: writes results/bench_spec_tmb.json + .md under the default tensor-core GEMV
(a file is named by the GEMV it ran, results.stem: KESTREL_BF16_GEMV=fma writes results/bench_spec.*).

  (a) tiny model, end to end: every policy x drafter (mtp-article, mtp, replay driven by the E16
      profile) x k = 1..4 over the six starts; greedy timed in the same run (each run_spec call
      times greedy decoding of the same start right before it); teacher-forced acceptance (E16)
      of the tiny MTP, both pairings.
  (b) Qwen3.5-27B shape with random bf16 weights on the GPU: the replay drafter driven by the
      article's histogram (0:24 1:6 2:11 3:4, article pairing, k=3, 4), by the E16 profile (both
      pairings, k=2..4) and by a flat profile whose mean advance is 2.8 tokens per round (trained
      pairing, k=4: the mean acceptance length reported for Qwen3.6-27B's MTP head with three
      draft tokens) and by an n_ok sequence that advances 2.8 a round over each 5-round cycle
      (the profile's seeded draw over one run need not: sweep.SEQ_2P8), under every policy, with each phase's cost and the recurrent-state bytes
      each round moved (from the config: Policy.state_traffic). Each run is repeated --repeats
      times (single runs vary by about 10%): ms/token the medians, speedup greedy / spec of the
      medians, each with the repeats' min..max range (sweep.large_runs, which the book also runs live on a GPU that holds the shape).
  (c) the cost model: unit costs measured on each model; the prediction for each run's own
      rounds beside its measurement, and the pure prediction from the histogram/profile.
  (d) the sweep over sizes: tiny, 0.8B, 4B, 9B, 27B (random bf16 weights for the real shapes,
      each freed before the next), the replay drafter driven by the E16 profile (trained
      pairing, checkpoint policy) at k = 1..4, greedy in the same call, each size's unit costs
      and its roofline: weight bytes / bandwidth against kernels per step x launch cost, which
      says whether the size is bandwidth- or launch-bound (sweep.size_sweep).

On the H200:   python scripts/bench_spec.py
On CPU, fast:  python scripts/bench_spec.py --quick      (CPU stand-ins, T=16, one repeat; the
               sweep on test-a and test-b; tested in CI)
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kestrel  # noqa: E402
from kestrel import speculative as spec  # noqa: E402
from kestrel.lab import sweep  # noqa: E402
from kestrel.lab.records import LEGACY_PHASES  # noqa: E402
from kestrel.lab import results  # noqa: E402
from kestrel import settings  # noqa: E402
from kestrel.lab.results import repo_relative  # noqa: E402

TINY = ROOT / "kestrel" / "assets" / "tiny" / "model.safetensors"


def log(msg):
    print(msg, flush=True)


summary_of = sweep.summary_of      # the runs' RunSummary with the cost model for their own rounds


def row_of(s: spec.RunSummary, **extra) -> dict:
    """A results row: the summary's dict, its log lines, and what else the report shows."""
    return {**s.to_dict(), "log": s.log_lines(), **extra}


# ---- (a) the tiny model end to end --------------------------------------------------------------------
def bench_tiny(args):
    name = args.model_a or ("tiny" if TINY.exists() else "test-b")
    if name != "tiny" and not args.quick and not args.model_a:
        log("!! the tiny model is missing: falling back to the random preset test-b (acceptance ~ 0)")
    model = kestrel.load(name, device=args.device)
    starts = spec.default_starts(model)
    if args.quick:
        starts = starts[:1]
    T = args.T
    ks = (1, 2) if args.quick else (1, 2, 3, 4)
    P = max(len(t) for _, t in starts)
    log(f"(a) {model!r}: {len(starts)} start(s), T={T}, k={ks}")
    max_seq = P + T + max(ks) + 2
    g_eng = kestrel.Engine(model, max_seq=max_seq, mmax=1, batch="flex")
    units = spec.measure_unit_costs(model, k_max=max(ks), ctx=P + T // 2, reps=3 if args.quick else 7)
    drafters = ["mtp-article", "mtp", "replay"]

    def schedule(dname, i):          # the replay drafter: the E16 profile, trained pairing, one seed per start
        return spec.Schedule(profile=spec.E16_PROFILE, pairing="trained", seed=i) if dname == "replay" else None
    rows = []
    # engines are reused (reset between runs) and each (k, policy) group is warmed up first, so a
    # GPU backend's plans (CUDA graphs, keyed on the engine's buffers) are captured outside the timing
    for k in ks:
        for policy in spec.POLICIES.values():
            eng = kestrel.Engine(model, max_seq=max_seq, mmax=k, batch=policy.batch)
            for dname in drafters:
                spec.run_spec(model, starts[0][1], min(T, 16), k, policy, dname, schedule=schedule(dname, 0),
                              engine=eng, greedy_engine=g_eng)
            for dname in drafters:
                res = [spec.run_spec(model, toks, T, k, policy, dname, schedule=schedule(dname, i), engine=eng,
                                     greedy_engine=g_eng)
                       for i, (_, toks) in enumerate(starts)]
                s = summary_of(res, units, "E16 profile, trained pairing" if dname == "replay" else None)
                rows.append(row_of(s, drafter=dname))      # the row names the drafter; its log, the schedule too
                log(f"  {policy.name:11s} {dname:11s} k={k}: {s.ms_per_token:.3f} ms/token "
                    f"(greedy {s.greedy_ms_per_token:.3f}) speedup {s.speedup:.3f}x, "
                    f"predicted {s.predicted_speedup:.3f}x; advance/round {s.advance_per_round:.3f}; "
                    f"bit-exact {s.bit_exact}")
            del eng
    rows.sort(key=lambda r: (list(spec.POLICIES).index(r["policy"]), drafters.index(r["drafter"]), r["k"]))
    acc = {}
    for pairing in spec.Pairing:
        a = spec.combine(spec.teacher_forced(model, toks, T=T, depth=4, pairing=pairing) for _, toks in starts)
        acc[pairing.value] = a.to_dict()
        log("  " + a.line())
    return {"model": model.cfg.name, "source": repo_relative(model.source), "device": getattr(model.be, "device_name", model.be.name),
            "starts": [lab for lab, _ in starts], "T": T, "units": units.to_dict(), "runs": rows,
            "acceptance": acc}


# ---- (b) the 27B shape, histogram replay ------------------------------------------------------------------
def bench_large(args):
    """sweep.large_runs (the same code the book runs live on a GPU that holds the shape)."""
    if args.quick:
        model = kestrel.load("test-a", device="cpu")
        T, P = args.T, 8
        schedules = sweep.LARGE_SCHEDULES[:1] + sweep.LARGE_SCHEDULES[3:4]
    else:
        model = kestrel.load(args.large, device=args.device, dtype=args.dtype)
        T, P = args.T, 32
        schedules = sweep.LARGE_SCHEDULES
    out = sweep.large_runs(model, T=T, P=P, schedules=schedules, repeats=args.repeats, reps=3 if args.quick else 7,
                          log=log)
    del model
    sweep.free_device_memory()
    return out


# ---- (d) every size, k = 1..4 ------------------------------------------------------------------------------
def bench_sweep(args):
    """sweep.size_sweep: the replay drafter driven by the E16 profile (trained pairing, checkpoint
    policy) at each size and k, with each size's roofline."""
    if args.quick:
        return sweep.size_sweep(sweep.QUICK_PRESETS, T=args.T, P=8, device="cpu", reps=3, log=log)
    presets, skipped = sweep.runnable(sweep.SIZE_PRESETS, device=args.device, dtype=args.dtype)
    for p, why in skipped:
        log(f"!! (d) skips {p}: {why}")
    d = sweep.size_sweep(presets, T=args.T, P=32, device=args.device, dtype=args.dtype, log=log)
    d["skipped"] = [{"preset": p, "why": why} for p, why in skipped]
    return d


def _fmt(d):
    return "{" + ", ".join(f"{k}: {v:.3f}" for k, v in d.items()) + "}"


# ---- report --------------------------------------------------------------------------------------------------
def _x(v, nd=3):
    return "n/a" if v is None else f"{v:.{nd}f}"


def markdown(d) -> str:
    L = [f"# Speculative decoding benchmark{' (quick, CPU stand-ins)' if d['quick'] else ''}", "",
         f"- device: {d['device']}", f"- date: {d['date']}", f"- command: `{d['command']}`",
         f"- commit: {d.get('commit')}", f"- host: {d['host']}", ""]
    L += ["Speedup = greedy ms/token (timed in the same call, same start) / spec ms/token. `predicted` is the",
          "cost model priced with unit costs measured on the same model and device, for the run's own rounds.",
          "Phases per token: draft, mark, verify, undo (rollback; checkpoint: select; input-cache: fold), replay (or the",
          "n_ok=0 step), sync (the drafter's MTP slot), bookkeeping (accept/emit). All times from the backend clock",
          "(CUDA events on GPU). Files written before the undo phase had its name call it rollback.", ""]
    if any((sec or {}).get("units", {}).get("chain_fill") for sec in (d.get("tiny"), d.get("large"))):
        L[-1:] = ["The trained pairing's rewrite of the MTP rows a round confirmed rides in the next round's draft chain",
                  "(its first pass), so it is paid in the draft phase; sync is the truncate alone.", ""]
    a = d.get("tiny")
    if a:
        L += [f"## (a) {a['model']} end to end ({len(a['starts'])} start(s), T={a['T']}, {a['device']})", "",
              "| policy | drafter | k | ms/token | greedy ms/token | speedup | predicted speedup | predicted ms/token "
              "| advance/round | first-draft hit | n_ok histogram | bit-exact |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in a["runs"]:
            L.append(f"| {r['policy']} | {r['drafter']} | {r['k']} | {_x(r['ms_per_token'])} | "
                     f"{_x(r['greedy_ms_per_token'])} | {_x(r['speedup'])}x | {_x(r['predicted_speedup'])}x | "
                     f"{_x(r['predicted_ms_per_token'])} | {_x(r['advance_per_round'])} | {_x(r['first_draft_hit'])} | "
                     f"{' '.join(f'{n}:{c}' for n, c in r['hist'].items())} | {r['bit_exact']} |")
        L += ["", "Teacher-forced MTP acceptance (E16 protocol) of this model:", "",
              "| pairing | N | alpha_1..4 | p_1..4 | E[len] | advance/round by k |", "|---|---|---|---|---|---|"]
        for pairing, acc in a["acceptance"].items():
            L.append(f"| {pairing} | {acc['N']} | {' '.join(_x(x) for x in acc['alpha'])} | "
                     f"{' '.join(_x(x) for x in acc['p'])} | {_x(acc['E_len'])} | "
                     f"{', '.join(f'k={k}: {_x(v)}' for k, v in acc['advance'].items())} |")
        L += ["", f"Unit costs (ms): {_units(a['units'])}", ""]
    b = d.get("large")
    if b:
        L += [f"## (b) {b['model']} shape, random {b['weights']} weights, replay drafter ({b['device']})", "",
              f"P={b['P']}, T={b['T']}; greedy {_x(b['greedy_ms_per_token'])} ms/token; each mark/rollback copies "
              f"{(b['gdn_state_bytes'] + b['conv_state_bytes']) / 1e6:.1f} MB of GDN state. Each run repeated "
              f"{b.get('repeats', 1)} time(s): ms/token are medians, speedup greedy / spec of the medians (min..max of the repeats); phases, histogram "
              "and log are the repeat with the median speedup.", "",
              "| schedule | pairing | policy | k | ms/token | speedup | predicted (run's rounds) | predicted "
              "(schedule) | " + " | ".join(spec.PHASES) + " | histogram | bit-exact |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in b["runs"]:
            ph = {LEGACY_PHASES.get(n, n): v for n, v in r["phase_ms_per_token"].items()}
            ps = r["predicted_from_schedule"]
            L.append(f"| {r['schedule']} | {r['pairing']} | {r['policy']} | {r['k']} | {_x(r['ms_per_token'])}"
                     f"{_range(r.get('ms_per_token_range'))} | {_x(r['speedup'])}x{_range(r.get('speedup_range'))} | "
                     f"{_x(r['predicted_ms_per_token'])} ms, {_x(r['predicted_speedup'])}x | "
                     f"{_x(ps['ms_per_token'])} ms, {_x(ps['speedup'])}x | "
                     + " | ".join(_x(ph[p]) for p in spec.PHASES)
                     + f" | {' '.join(f'{n}:{c}' for n, c in r['hist'].items())} | {r['bit_exact']} |")
        work = [r.get("plans_lowered_or_captured_while_timed") for r in b["runs"]]
        if any(w is not None for w in work):
            bad = [f"{r['schedule']} / {r['pairing']} / {r['policy']} / k={r['k']}: {w}"
                   for r, w in zip(b["runs"], work) if w]
            L += ["", "Plans lowered plus graphs captured inside the timed runs (a new plan counts 2: its eager "
                  "run and its capture, both paid inside the timing): " + ("none." if not bad else "; ".join(bad) + ".")]
        L += ["", "Phase columns: ms per emitted token, measured.", "",
              "Recurrent-state bytes per emitted token (GDN S + conv window + cached inputs, computed from the "
              "config for the run's own rounds; greedy moves one read and one write of the state per token):", "",
              "| schedule | pairing | policy | k | MB read / token | MB written / token | MB kept beside the live state |",
              "|---|---|---|---|---|---|---|"]
        for r in b["runs"]:
            sb = r.get("state_bytes_per_token")
            if sb:
                L.append(f"| {r['schedule']} | {r['pairing']} | {r['policy']} | {r['k']} | {sb['read'] / 1e6:.1f} | "
                         f"{sb['written'] / 1e6:.1f} | {sb['kept'] / 1e6:.1f} |")
        L += ["", f"Unit costs (ms): {_units(b['units'])}", ""]
        for r in b["runs"]:
            L += [f"`{r['schedule']} / {r['pairing']} / {r['policy']}`:", "```"] + r["log"] + ["```"]
    w = d.get("sweep")
    if w:
        L += sweep_markdown(w)
    return "\n".join(L) + "\n"


def _bytes(n) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.2f} MB"


def _range(lohi) -> str:
    return "" if not lohi else f" ({lohi[0]:.3f}..{lohi[1]:.3f})"


def sweep_markdown(w) -> list:
    L = [f"## (d) every size: {w['policy']}, {w['pairing']} pairing, replay of the profile "
         f"{', '.join(f'{a:.3f}' for a in w['profile'])} ({w['device']})", "",
         f"T={w['T']}, P={w['P']}, {w['repeats']} repeat(s) per run; bandwidth "
         f"{w['bandwidth_Bps'] / 1e9:.0f} GB/s ({w['bandwidth_kind']}); launch cost per kernel {w['launch_ms_per_kernel'] * 1e3:.1f} us "
         "(the smallest step-minus-floor per kernel of these sizes).", "",
         "| size | weights | k | ms/token | greedy ms/token | speedup | predicted speedup | advance/round | bit-exact |",
         "|---|---|---|---|---|---|---|---|---|"]
    for s in w["sizes"]:
        for r in s["runs"]:
            L.append(f"| {s['preset']} | {_bytes(s['weight_bytes'])} {s['weights']} | {r['k']} | "
                     f"{_x(r['ms_per_token'])}{_range(r.get('ms_per_token_range'))} | {_x(r['greedy_ms_per_token'])} | "
                     f"{_x(r['speedup'])}x | {_x(r['predicted_speedup'])}x | {_x(r['advance_per_round'])} | "
                     f"{r['bit_exact']} |")
    L += ["", "Roofline: floor = weight bytes / bandwidth; launches = kernels per step x launch cost; the larger "
          "term names the regime. Measured: step, verify_checkpointed(M) / step, the MTP draft step / step.", "",
          "| size | floor ms | kernels | launch ms | bound | step ms | verify(M)/step, M=1..4 | row ms | draft/step |",
          "|---|---|---|---|---|---|---|---|---|"]
    for s in w["sizes"]:
        r = s["roofline"]
        vs = " ".join(_x(v, 2) for _, v in sorted((int(m), v) for m, v in r["verify_over_step"].items()))
        L.append(f"| {s['preset']} | {_x(r['floor_ms'])} | {r['kernels_per_step']} | {_x(r['launch_ms'])} | "
                 f"{r['bound']} | {_x(r['step_ms'])} | {vs} | {_x(r['row_ms'])} | {_x(r['draft_over_step'], 2)} |")
    for x in w.get("skipped", []):
        L.append(f"\nSkipped {x['preset']}: {x['why']}.")
    return L + [""]


def _units(u) -> str:
    meta = u.get("meta", {})
    mtp = meta.get("mtp_table", "mtp_step")      # runs before mtp_fill timed whole MTP steps
    draft = meta.get("draft_unit", "mtp_step + argmax + read")     # runs before the device chain
    return (f"step {_x(u['step'])}; step_m {_fmt_str(u['step_m'])}; verify_checkpointed {_fmt_str(u['ckpt'])}; "
            f"draft ({draft}) {_x(u['draft'])}; mtp_draft chain {_fmt_str(u.get('chain', {}))}; "
            + (f"mtp_draft of 1 row after m fill rows {_fmt_str(u['chain_fill'])}; " if u.get("chain_fill") else "")
            + f"{mtp} {_fmt_str(u['mtp'])}; mark {_x(u['mark'])}; rollback {_x(u['rollback'])}; "
            f"select {_x(u['select'])}; verify_cached {_fmt_str(u.get('cached', {}))}; "
            f"fold {_fmt_str(u.get('fold', {}))}; argmax {_x(u['argmax'])}; bookkeeping {_x(u['bookkeeping'])}")


def _fmt_str(d):
    return ", ".join(f"M={k}: {_x(v)}" for k, v in d.items())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CPU stand-ins (tiny or test-b; test-a for the 27B part), T=16, one start, k=1,2")
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--T", type=int, default=None)
    ap.add_argument("--model-a", default=None, help="model for part (a) (default: tiny; test-b if tiny is missing)")
    ap.add_argument("--large", default="qwen3.5-27b", help="preset for part (b)")
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "bf16"), help="the real shapes' weights, (b) and (d)")
    ap.add_argument("--skip-tiny", action="store_true")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true", help="skip part (d), the sweep over sizes")
    ap.add_argument("--repeats", type=int, default=None, help="repeats of each part (b) run (default 3; 1 in --quick)")
    args = ap.parse_args(argv)
    if args.quick:
        args.device = "cpu"
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.T = args.T or (16 if args.quick else 64)
    t0 = time.time()
    be = kestrel.backend.get_backend(args.device)
    kernels = results.backend_kernels(be)
    prov = results.Provenance(
        getattr(be, "device_name", args.device), _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        results.recorded_command("scripts/bench_spec.py", argv if argv is not None else sys.argv[1:],
                                 settings.kernel_switches()),
        results.measured_commit(), kernels)
    d = {"quick": args.quick, "date": prov.date, "command": prov.command, "commit": prov.commit,
         "host": f"{platform.machine()}, Python {platform.python_version()}", "device": prov.device}
    if not args.skip_tiny:
        d["tiny"] = bench_tiny(args)
    if not args.skip_large:
        d["large"] = bench_large(args)
    if not args.skip_sweep:
        d["sweep"] = bench_sweep(args)
    d["seconds"] = round(time.time() - t0, 1)
    path = results.write(args.out, results.stem("bench_spec_quick" if args.quick else "bench_spec", kernels), d,
                         markdown, prov)
    log(f"wrote {path} and {path.with_suffix('.md')} in {d['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
