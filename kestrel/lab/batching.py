"""Many sequences at once, measured (chapter 9, scripts/bench_batch.py): greedy and every undo
strategy at batch sizes B, each sequence replaying its own acceptance draws.

    rows = batching.sweep(model, Bs=(1, 4, 16), policies=("checkpoint", "input-cache"), ks=(3,))

Each row: B, the mode (greedy or a policy), k, tokens/s of the whole batch, ms per output token
of one sequence, the speedup over greedy at the same B, whether every stream was bit-exact (a
greedy row: its first and last sequences equal each decoded alone; a policy's row: every stream
equals the greedy batch's),
the recurrent-state bytes the policy moved per round (its own account, policy.state_traffic,
summed over the rounds actually run) and the bytes it holds beside the live state, for all B
sequences. Drafts come from the replay drafter (the real MTP steps are run and paid for; the
acceptance is forced), each sequence with its own random draws of one per-depth profile, so the
sequences of a batch accept differently, round by round.
"""
from __future__ import annotations

import contextlib
import gc

import numpy as np

import kestrel
from kestrel import speculative as spec
from kestrel.ops import linear as _linear
from kestrel.speculative.policy import Policy, recurrent_bytes
from . import roofline
from .sweep import plan_work


def prompts_for(model, B: int, length: int = 16, seed: int = 0) -> list:
    """B random prompts of `length` tokens (the embedded model: its six starts, cycled, first)."""
    rng = np.random.default_rng(seed)
    if model.cfg.vocab_size == 256:
        starts = [p for _, p in spec.default_starts(model)]
        return [list(starts[i % len(starts)]) + [int(t) for t in rng.integers(32, 127, i // len(starts))]
                for i in range(B)]
    return [[int(t) for t in rng.integers(0, model.cfg.vocab_size, length)] for _ in range(B)]


def held_bytes(cfg, policy: str, k: int, B: int) -> int:
    """Recurrent-state bytes B sequences hold: the live state, and what the policy keeps beside
    it for a round of k drafts (per-row checkpoints, cached inputs, a snapshot)."""
    return B * (recurrent_bytes(cfg) + Policy.parse(policy).state_traffic(cfg, k, 0)["kept"])


def moved_bytes_per_round(cfg, run) -> float:
    """The policy's own account of recurrent-state bytes read + written, per round of `run`."""
    if not run.rounds:
        return 0.0
    tot = 0
    for r in run.rounds:
        t = run.policy.state_traffic(cfg, r.k, r.n_ok)
        tot += t["read"] + t["written"]
    return tot / len(run.rounds)


def sweep(model, Bs=(1, 4, 16), policies=("replay", "checkpoint", "input-cache"), ks=(2, 3, 4), T: int = 32,
          profile=spec.E16_PROFILE, pairing: str = "trained", prompt_len: int = 16, seed: int = 0, log=None,
          did_not_fit: list | None = None) -> list:
    """The table above, one row per (B, greedy | policy, k).

    With a list as `did_not_fit`, a run whose engine does not fit in the device's memory (a
    MemoryError: kestrel's refusal before allocating, or the device's own) is left out and noted
    there as {"B", "mode", "k", "error"}, and the sweep goes on; without one, the error is raised."""
    rows = []

    def too_big(B, mode, k, e):
        if did_not_fit is None:
            return False
        did_not_fit.append({"B": B, "mode": mode, "k": k, "error": str(e).splitlines()[0][:300]})
        gc.collect()                   # what the failed run took, back (CuPy's pool retries after freeing)
        if log:
            log(f"B={B:4d} {mode:12s} k={k} did not fit: {did_not_fit[-1]['error']}")
        return True

    for B in Bs:
        prompts = prompts_for(model, B, prompt_len, seed)
        need = max(len(p) for p in prompts) + T + 2 * max(ks, default=1) + 4
        # every run has its own BatchEngine, whose batched plans are made first (prepare), then a
        # warm-up: the per-slot plans (a replay's steps, a plain tail) are made at first use
        try:
            be = kestrel.BatchEngine(model, slots=B, max_seq=need, mmax=1)
            be.prepare(("step",))      # every plan the batch can need, made before the clock runs
            spec.batch_greedy(model, prompts, min(T, 4), engine=be)
            w0 = plan_work(model.be)
            g = spec.batch_greedy(model, prompts, T, engine=be)
            g_work = plan_work(model.be) - w0
        except MemoryError as e:       # no greedy baseline at this B: none of its policies either
            be = None
            if too_big(B, "greedy", 0, e):
                continue
            raise
        del be
        gc.collect()                   # its slots' device memory back before the next batch asks for its own
        alone = all(g.streams[i] == kestrel.generate(model, prompts[i], T) for i in sorted({0, B - 1}))
        rows.append({"B": B, "mode": "greedy", "k": 0, "tokens_per_s": g.tokens_per_s, "ms_per_token": g.ms_per_token,
                     "speedup": 1.0, "bit_exact": bool(alone), "moved_per_round": None,
                     "held_bytes": B * recurrent_bytes(model.cfg), "passes": g.passes,
                     "plans_lowered_or_captured_while_timed": g_work})
        if log:
            log(f"B={B:4d} greedy        {g.tokens_per_s:10.1f} tokens/s  {g.ms_per_token:8.3f} ms/token")
        for policy in policies:
            for k in ks:
                try:
                    be = kestrel.BatchEngine(model, slots=B, max_seq=need, mmax=k, batch=Policy.parse(policy).batch)
                    be.prepare((spec.verify_kind(policy),), drafts=True)
                    warm = min(T, 8)
                    spec.batch_spec(model, prompts, warm, k=k, policy=policy, drafter="replay", engine=be,
                                    schedules=[spec.Schedule(profile=profile, pairing=pairing, seed=seed + 10_000 + i)
                                               for i in range(B)], references=[x[:warm] for x in g.streams])
                    scheds = [spec.Schedule(profile=profile, pairing=pairing, seed=seed + 1 + i) for i in range(B)]
                    w0 = plan_work(model.be)
                    r = spec.batch_spec(model, prompts, T, k=k, policy=policy, drafter="replay", engine=be,
                                        schedules=scheds, references=g.streams)
                    r_work = plan_work(model.be) - w0
                except MemoryError as e:
                    be = None
                    if too_big(B, policy, k, e):
                        continue
                    raise
                del be
                gc.collect()
                rows.append({"B": B, "mode": policy, "k": k, "tokens_per_s": r.tokens_per_s,
                             "ms_per_token": r.ms_per_token, "speedup": g.ms / r.ms, "bit_exact": bool(r.bit_exact),
                             "moved_per_round": float(np.mean([moved_bytes_per_round(model.cfg, x) for x in r.runs])),
                             "held_bytes": held_bytes(model.cfg, policy, k, B), "passes": r.passes,
                             "tokens_per_round": float(np.mean([(T - x.tail_tokens) / max(1, len(x.rounds))
                                                                for x in r.runs])),
                             "plans_lowered_or_captured_while_timed": r_work})
                if log:
                    x = rows[-1]
                    log(f"B={B:4d} {policy:12s} k={k} {x['tokens_per_s']:10.1f} tokens/s  {x['ms_per_token']:8.3f} "
                        f"ms/token  {x['speedup']:.2f}x  bit-exact {x['bit_exact']}")
    return rows


def unit_costs(model, B: int, k: int, reps: int = 5, prompt_len: int = 16, seed: int = 0) -> dict:
    """One round's passes at batch size B, each timed alone (device events on a GPU; the median of
    `reps` after two warm-ups), every slot with k rows: what a round of each undo strategy pays.

        step        a greedy pass, one row a slot
        verify_ckpt a checkpointed verify (k rows a slot, a GDN state written after each row)
        select[n]   select_checkpoint with n kept in every slot (the chosen state made live)
        verify_cached a cached verify (k rows a slot, the recurrence's inputs kept)
        fold[n]     fold_cached with n in every slot (the recurrence re-run over n cached rows)

    A checkpointed round costs verify_ckpt + select[n], a cached one verify_cached + fold[n]. Every
    call runs between a mark and a rollback of each slot, so the slots end where they began."""
    be_ = model.be
    prompts = prompts_for(model, B, prompt_len, seed)
    need = max(len(p) for p in prompts) + 2 * k + 4
    eng = kestrel.BatchEngine(model, slots=B, max_seq=need, mmax=k, batch="flex")
    eng.prepare(("step", "verify_checkpointed", "verify_cached"))
    slots = [eng.join(p)[0] for p in prompts]
    rng = np.random.default_rng(seed + 7)
    toks = {s: [int(t) for t in rng.integers(0, model.cfg.vocab_size, k)] for s in slots}

    def calls(kind, m):
        return {s: (kind, eng.cursor(s), toks[s][:m]) for s in slots}

    def mark():
        for s in slots:
            eng.slot(s).mark()

    def rollback():
        for s in slots:
            eng.slot(s).rollback()

    def timed(fn, before=None, after=None):
        def setup():
            mark()
            if before:
                before()

        def undo():
            if after:
                after()
            rollback()
        return float(np.median(roofline.timed_ms(be_, fn, reps, warm=2, before=setup, after=undo)))

    none = {s: 0 for s in slots}
    out = {"B": B, "k": k, "reps": reps, "step": timed(lambda: eng.forward(calls("step", 1))),
           "verify_ckpt": timed(lambda: eng.forward(calls("verify_checkpointed", k)),
                                after=lambda: eng.select_checkpoint(none)),
           "select": {n: timed(lambda n=n: eng.select_checkpoint({s: n for s in slots}),
                               before=lambda: eng.forward(calls("verify_checkpointed", k)))
                      for n in range(1, k + 1)},
           "verify_cached": timed(lambda: eng.forward(calls("verify_cached", k)),
                                  after=lambda: eng.fold_cached(none)),
           "fold": {n: timed(lambda n=n: eng.fold_cached({s: n for s in slots}),
                             before=lambda: eng.forward(calls("verify_cached", k)))
                    for n in range(1, k + 1)}}
    del eng
    gc.collect()
    return out


@contextlib.contextmanager
def order_depends_on_batch():
    """The negative control (chapter 9): while open, the CPU projection sums each dot product
    as 1, 2 or 3 partial sums, chosen by how many rows share the call (as a GEMM library picking
    its kernel by shape does), so a row's bits depend on the batch. It patches the NumPy
    projection only: a model on the CUDA backend does not see it (run the control on the CPU)."""
    right = _linear.linear

    def by_batch(x, w):
        parts = 1 + x.shape[0] % 3
        cut = np.linspace(0, x.shape[1], parts + 1).astype(int)
        y = np.zeros((x.shape[0], w.shape[0]), np.float32)
        for lo, hi in zip(cut[:-1], cut[1:]):
            y += x[:, lo:hi] @ w[:, lo:hi].T
        return y
    _linear.linear = by_batch
    try:
        yield
    finally:
        _linear.linear = right


def file_tables(bf) -> list:
    """A bench_batch results file (results.load_batch) as chapter 9's two tables, each (rows,
    headers): every run, and the greedy passes against the weight-streaming floor."""
    runs = [[r.B, r.mode, r.k or "", f"{r.tokens_per_s:.1f}", f"{r.ms_per_token:.2f}", f"{r.speedup:.2f}x",
             f"{r.tokens_per_round:.2f}", "" if r.moved_per_round is None else f"{r.moved_per_round / 1e6:.0f}",
             r.plans_made, r.bit_exact] for r in bf.rows]
    g = bf.greedy()
    passes = [[B, f"{r.ms_per_token:.2f}", f"{r.ms_per_token / bf.floor.ms:.2f}" if bf.floor else "",
               f"{r.tokens_per_s / g[min(g)].tokens_per_s:.1f}"] for B, r in sorted(g.items())]
    return [(runs, ["B", "mode", "k", "tokens/s", "ms/token", "speedup", "tokens/round",
                    "state MB moved/round", "plans made", "bit-exact"]),
            (passes, ["B", "greedy pass (ms)", "pass / weight-streaming floor", f"tokens/s over B = {min(g)}"])]
