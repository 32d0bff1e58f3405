#!/usr/bin/env python3
"""Where a draft step's time goes beyond the MTP step itself: results/bench_host.{json,md}.

A speculative round reads a token back after every draft step, so the next step's launches wait
for the host; a step issued right after such a read costs its device time plus whatever the host
does before the GPU has work again. This script separates the two on one model (a preset with
random weights, or the embedded model), medians of --reps:

  with the backend's clock (device events on a GPU, the host clock on the CPU), ms per call
    mtp_step back to back     M = 1 MTP steps with no read in between: the device's time once
                              the host runs ahead
    draft step                mtp_step + argmax + reading the token, one call a draft (how the
                              drafters drafted before the device chain)
    draft chain, per row      one Engine.mtp_draft of k rows (argmax and feed on the device, the
                              k tokens read once), divided by k: how the drafters draft now
    argmax + read             the argmax of one logits row and reading it
    mtp_fill(k) back to back  the fill of k rows (the trained pairing's sync), and
    mtp_fill(k) after a read  the same call issued right after a read, as the round issues it
    step back to back / greedy step   the main model's step, and step + argmax + read
    verify_checkpointed(k) after ...  the verify alone (events around the call), after another
                              verify, after a select that moves the slot and cursor, after a
                              draft chain and its read (as a round issued it), and fed the chain's
                              tokens device to device, unread (as a round issues it now)
  with the host clock only (time.perf_counter, the device idle first), ms of Python per call
    mtp_step call             the whole entry, up to its return (launches issued, not finished)
    hidden check              kestrel.inputs.hidden_rows on the previous step's hidden (the
                              engine's validation: on a GPU it reduces on the device and waits)
    backend run               model.mtp_forward alone (the plan's inputs, its launch)
  and cProfile over --reps draft steps: the functions with the most time of their own.

    python3 scripts/bench_host.py --preset qwen3.5-27b --out results     # on a GPU machine
    python3 scripts/bench_host.py --preset tiny --device cpu --reps 5 --out /tmp/x

Nothing here is a test; the numbers say where to look, not whether the engine is right.
"""
from __future__ import annotations

import argparse
import cProfile
import datetime as _dt
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kestrel.lab import results  # noqa: E402
from kestrel import settings  # noqa: E402


def med(xs) -> float:
    return float(statistics.median(xs))


def per_call(be, fn, n: int, reps: int, sync_each: bool) -> float:
    """Median over reps of (one event pair around n calls) / n, ms. sync_each: the host waits
    after every call (fn reads something back), as a draft chain does."""
    fn()
    be.sync()
    out = []
    for _ in range(reps):
        a = be.now()
        for _ in range(n):
            fn()
            if sync_each:
                be.sync()
        b = be.now()
        out.append(be.elapsed_ms(a, b) / n)
    return med(out)


def host_ms(be, fn, reps: int) -> float:
    """Median Python time of fn with the device idle first (host clock), ms."""
    out = []
    for _ in range(reps):
        be.sync()
        a = time.perf_counter()
        fn()
        out.append((time.perf_counter() - a) * 1e3)
    be.sync()
    return med(out)


def measure(model, k: int, reps: int, n: int, top: int) -> dict:
    import kestrel
    from kestrel import inputs
    be, cfg = model.be, model.cfg
    V, D = cfg.vocab_size, cfg.hidden_size
    P = 16
    eng = kestrel.Engine(model, max_seq=P + 16 * reps * n + 64, mmax=max(k, 1), batch="flex")
    toks = [(7 * i + 3) % V for i in range(P)]
    s = eng.prefill(toks)
    eng.mtp_fill(0, toks[1:], s.hidden[:P - 1])
    base = eng.mtp_cursor
    h = s.hidden[P - 1]
    H = s.hidden[P - k:]
    lg = s.logits[P - 1]
    t = toks[-1]

    def mtp():
        eng.mtp_step(eng.mtp_cursor, t, h)

    def draft():
        st = eng.mtp_step(eng.mtp_cursor, t, h)
        int(be.argmax(st.logits))

    def chain():
        eng.mtp_truncate(base)
        return eng.mtp_draft(base, t, h, k).tokens       # the chain and its read

    def fill():
        eng.mtp_truncate(base)
        eng.mtp_fill(base, toks[:k], H)

    def fill_after_read():
        int(be.argmax(lg))
        fill()

    def step():
        eng.step(eng.cursor, t)

    def greedy():
        st = eng.step(eng.cursor, t)
        int(be.argmax(st.logits))

    rows = {}
    rows["mtp_step back to back"] = per_call(be, mtp, n, reps, False)
    eng.mtp_truncate(base)
    rows["draft step"] = per_call(be, draft, n, reps, True)
    eng.mtp_truncate(base)
    rows[f"draft chain (mtp_draft of {k}), per row"] = per_call(be, chain, n, reps, True) / k
    rows["argmax + read"] = per_call(be, lambda: int(be.argmax(lg)), n, reps, True)
    rows[f"mtp_fill({k}) back to back"] = per_call(be, fill, n, reps, False)
    rows[f"mtp_fill({k}) after a read, the read excluded"] = per_call(be, fill_after_read, n, reps, True) - rows["argmax + read"]
    rows["step back to back"] = per_call(be, step, n, reps, False)
    rows["greedy step"] = per_call(be, greedy, n, reps, True)
    eng.mtp_truncate(base)
    # the checkpointed verify of k rows, timed alone (an event pair around the call), after
    # three different things: another verify (as the unit costs time it), a select that moves
    # the live slot and the cursor (as a round leaves it), and a draft chain and its read
    vt = toks[:k]

    def verify_after(before, n_sel, fed=False):
        out = []
        for _ in range(reps * n + 1):
            d = before()
            a = be.now()
            eng.verify_checkpointed(eng.cursor, d.feed() if fed else vt)
            b = be.now()
            eng.select_checkpoint(n_sel)
            out.append(be.elapsed_ms(a, b))
        return med(out[1:])
    rows[f"verify_checkpointed({k}) after a verify"] = verify_after(lambda: None, 0)
    rows[f"verify_checkpointed({k}) after select({k})"] = verify_after(lambda: None, k)
    rows[f"verify_checkpointed({k}) after a draft chain and its read"] = verify_after(chain, 0)

    def chain_unread():
        eng.mtp_truncate(base)
        return eng.mtp_draft(base, t, h, k)
    rows[f"verify_checkpointed({k}) fed a draft chain's tokens on the device"] = verify_after(chain_unread, 0, fed=True)
    eng.mtp_truncate(base)
    xp = be.xp
    host = {
        "mtp_step call": host_ms(be, mtp, reps * n),
        f"mtp_draft call ({k} rows, until its tokens are read: the chain's device time included)": host_ms(be, chain, reps * n),
        "hidden check": host_ms(be, lambda: inputs.hidden_rows(h, (D,), "hidden", xp), reps * n),
        "backend run": host_ms(be, lambda: model.mtp_forward([t], h.reshape(1, D), base, eng.state), reps * n),
        "argmax + read": host_ms(be, lambda: int(be.argmax(lg)), reps * n),
    }
    eng.mtp_truncate(base)
    prof = cProfile.Profile()
    be.sync()
    prof.enable()
    for _ in range(reps * n):
        draft()
    prof.disable()
    eng.mtp_truncate(base)
    st = pstats.Stats(prof)
    calls = reps * n
    funcs = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]     # by time of its own
    profile = [{"function": f"{Path(f[0]).name}:{f[1]}({f[2]})", "calls_per_step": v[1] / calls,
                "own_ms_per_step": v[2] * 1e3 / calls, "cum_ms_per_step": v[3] * 1e3 / calls}
               for f, v in funcs]
    return {"device_ms": rows, "host_ms": host, "profile": profile,
            "host_gap_per_draft_ms": rows["draft step"] - rows["mtp_step back to back"] - rows["argmax + read"],
            "chain_over_mtp_per_row_ms": rows[f"draft chain (mtp_draft of {k}), per row"] - rows["mtp_step back to back"]}


def render_md(R: dict) -> str:
    d, h = R["device_ms"], R["host_ms"]
    L = ["# Host share of a draft step, and the verify in a round's context", "",
         f"Device: **{R['device']}**, measured {R['date']} with `{R['command']}`"
         + (f" (commit {R['commit']})" if R.get("commit") else "") + f". Model: {R['model']}; "
         f"medians of {R['reps']} repeats of {R['n']} calls.", "",
         "| call | ms per call (backend clock) |", "|---|---|"]
    L += [f"| {name} | {v:.3f} |" for name, v in d.items()]
    L += ["", f"Draft step − (MTP step back to back + argmax read) = {R['host_gap_per_draft_ms']:.3f} ms: the time "
          "the device waits on the host in each step of a draft chain (on the CPU backend the host is the device, "
          "and this is noise).", "",
          f"Draft chain per row − MTP step back to back = {R['chain_over_mtp_per_row_ms']:.3f} ms: what a draft "
          "costs over its MTP step when the argmax and the feed stay on the device (the argmax kernel, three small "
          "copies and a position increment a row, and one read a chain).", "",
          "| host work (Python, device idle first) | ms |", "|---|---|"]
    L += [f"| {name} | {v:.3f} |" for name, v in h.items()]
    L += ["", "cProfile over the draft steps, the functions with the most time of their own:", "",
          "| function | calls a step | own ms a step | cumulative ms a step |", "|---|---|---|---|"]
    L += [f"| `{p['function']}` | {p['calls_per_step']:.1f} | {p['own_ms_per_step']:.3f} | {p['cum_ms_per_step']:.3f} |"
          for p in R["profile"]]
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="qwen3.5-27b", help="a kestrel preset (random weights) or 'tiny'")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--dtype", default=None, help="fp32 | bf16 (default: bf16 for the Qwen3.5 shapes)")
    ap.add_argument("--k", type=int, default=3, help="rows of the fill (the sync after a round of k drafts), of the draft chain and of the verify")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--n", type=int, default=8, help="calls per timed repeat")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "results"))
    a = ap.parse_args(argv)
    import kestrel
    dtype = a.dtype or ("bf16" if a.preset.startswith("qwen") else "fp32")
    model = kestrel.load(a.preset, device=a.device, dtype=dtype, seed=0)
    if not model.has_mtp:
        raise SystemExit(f"bench_host: {a.preset} has no MTP head")
    kernels = results.backend_kernels(model.be)
    prov = results.Provenance(model.be.device_name, _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              results.recorded_command("scripts/bench_host.py", sys.argv[1:] if argv is None else argv,
                                                       settings.kernel_switches()),
                              results.measured_commit(), kernels)
    R = {**prov.as_dict(), "model": f"{a.preset} ({dtype})", "k": a.k, "reps": a.reps, "n": a.n}
    R.update(measure(model, a.k, a.reps, a.n, a.top))
    path = results.write(a.out, results.stem("bench_host", kernels), R, render_md, prov)
    print(render_md(R))
    return path


if __name__ == "__main__":
    main()
