"""Cost model: per-round cost from measured unit costs (SPEC §5; the seed's §3.5 account).

    round = draft steps x c_draft + mark + verify(M=k) + [rollback] + replay + MTP sync + bookkeeping

per policy (n = n_ok, k drafts):
  replay       mark + step_m(k) + (n < k: rollback + max(n,1) x step)          (strict batch)
  flex-replay  mark + step_m(k) + (n < k: rollback + (n == 0: step, else step_m(n)))
  checkpoint   verify_ckpt(k) + select + (n == 0: step)                          (no copy, no replay)
drafts: pairing 'seed' k MTP steps; 'mtp' k-1 (d_1 is free) plus, in sync, one batched
MTP rewrite of n-1 rows (k = 1: of the 1 row no draft step wrote).
Tail tokens (strict, fewer than k left): step + argmax each. Greedy: step + argmax per token.

predict() takes an n_ok histogram, a sequence, or a per-depth profile; compare() puts the
prediction for a measured run's own rounds beside its measurement; measure_unit_costs()
times the primitives on the model at hand.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..engine import Engine
from ..errors import KestrelError
from .schedule import PAIRINGS, advance, nok_distribution, parse_hist, parse_profile
from .stats import PHASES


@dataclass
class UnitCosts:
    """Milliseconds per call. step_m / ckpt / mtp are dicts M -> ms."""
    step: float                 # main model, M=1 step
    step_m: dict                # main model, batch of M rows (verify, flex replay)
    ckpt: dict                  # verify_checkpointed, M rows (+ per-row state slots)
    draft: float                # one MTP step (M=1) + argmax of its logits (one draft token)
    mtp: dict                   # one batched MTP call of M rows (prompt fill, 'mtp' rewrite)
    mark: float                 # whole GDN state copy + cursors
    rollback: float             # whole GDN state copy back + cursors
    select: float = 0.0         # select_checkpoint (cursor/slot move)
    truncate: float = 0.0       # mtp_truncate (cursor move)
    argmax: float = 0.0         # argmax of one logits row + read to host (greedy per token)
    book: float = 0.0           # per-round bookkeeping (argmax of the verify rows, accept, emit)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("step_m", "ckpt", "mtp"):
            setattr(self, name, {int(m): float(v) for m, v in getattr(self, name).items()})

    def get(self, table: str, m: int) -> float:
        t = getattr(self, table)
        if m not in t:
            raise KestrelError(f"unit costs have no {table}[M={m}] (measured M: {sorted(t)})")
        return t[m]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "UnitCosts":
        return cls(**d)


def round_cost(u: UnitCosts, policy: str, pairing: str, k: int, n: int) -> dict:
    """Predicted ms per phase for one round with k drafts that accepts n."""
    if pairing not in PAIRINGS:
        raise KestrelError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    if not 0 <= n <= k:
        raise KestrelError(f"n_ok={n} outside [0, k={k}]")
    if pairing == "mtp" and n == 0:
        raise KestrelError("pairing 'mtp': d_1 is free, n_ok >= 1")
    c = {ph: 0.0 for ph in PHASES}
    c["draft"] = (k if pairing == "seed" else k - 1) * u.draft
    c["book"] = u.book
    c["sync"] = u.truncate
    if pairing == "mtp":
        r = n - 1 if k >= 2 else n
        if r > 0:
            c["sync"] += u.get("mtp", r)
    if policy in ("replay", "flex-replay"):
        c["mark"] = u.mark
        c["verify"] = u.get("step_m", k)
        if n < k:
            c["rollback"] = u.rollback
            if policy == "replay" or n == 0:
                c["replay"] = advance(n) * u.step
            else:
                c["replay"] = u.get("step_m", n)
    elif policy == "checkpoint":
        c["verify"] = u.get("ckpt", k)
        c["rollback"] = u.select
        if n == 0:
            c["replay"] = u.step
    else:
        raise KestrelError(f"unknown policy {policy!r}")
    return c


def _dist(k: int, pairing: str, hist, profile, seq) -> tuple:
    """-> (list of (n, weight)), is_sequence."""
    if sum(x is not None for x in (hist, profile, seq)) != 1:
        raise KestrelError("give exactly one of hist=, profile=, seq=")
    if hist is not None:
        h = parse_hist(hist)
        if max(h) > k:
            raise KestrelError(f"histogram has n_ok={max(h)} > k={k}")
        return [(n, float(c)) for n, c in h.items() if c], False
    if profile is not None:
        return [(n, w) for n, w in enumerate(nok_distribution(parse_profile(profile), k, pairing)) if w > 0], False
    return [(int(n), 1.0) for n in seq], True


def predict(u: UnitCosts, policy: str, pairing: str, k: int, *, hist=None, profile=None, seq=None,
            T: int | None = None, greedy_ms_per_token: float | None = None) -> dict:
    """Predicted ms/token and speedup for one of: an n_ok histogram (hist='0:24 1:6 2:11 3:4' or
    a dict), a per-depth acceptance profile (profile=(0.714, ...)), or an n_ok sequence (seq=[...]).
    With a sequence and T, the tokens the rounds leave are priced as the strict tail (plain
    steps). Greedy = step + argmax per token unless given.
    """
    items, is_seq = _dist(k, pairing, hist, profile, seq)
    W = sum(w for _, w in items)
    phases = {ph: 0.0 for ph in PHASES}
    adv = 0.0
    for n, w in items:
        for ph, v in round_cost(u, policy, pairing, k, n).items():
            phases[ph] += w * v
        adv += w * advance(n)
    greedy = u.step + u.argmax if greedy_ms_per_token is None else greedy_ms_per_token
    out = {"policy": policy, "pairing": pairing, "k": k, "greedy_ms_per_token": greedy}
    if is_seq:
        tail = 0 if T is None else T - int(adv)
        if tail < 0:
            raise KestrelError(f"the sequence advances {int(adv)} tokens > T={T}")
        tail_ms = tail * (u.step + u.argmax)
        total = sum(phases.values()) + tail_ms
        tokens = adv + tail
        out.update(rounds=len(items), tokens=tokens, tail_tokens=tail, tail_ms=tail_ms, total_ms=total,
                   phase_ms=phases, advance_per_round=adv / len(items) if items else 0.0)
    else:
        per_round = {ph: v / W for ph, v in phases.items()}
        total = sum(per_round.values())
        tokens = adv / W
        out.update(round_ms=total, phase_ms_per_round=per_round, advance_per_round=tokens)
    out["ms_per_token"] = total / tokens
    out["speedup"] = greedy / out["ms_per_token"]
    return out


def predict_result(u: UnitCosts, result, greedy_ms_per_token: float | None = None) -> dict:
    """Prediction for a measured run's own rounds (each with its own k) and tail."""
    phases = {ph: 0.0 for ph in PHASES}
    for r in result.rounds:
        for ph, v in round_cost(u, result.policy, result.pairing, r.k, r.n_ok).items():
            phases[ph] += v
    tail_ms = result.tail_tokens * (u.step + u.argmax)
    total = sum(phases.values()) + tail_ms
    greedy = u.step + u.argmax if greedy_ms_per_token is None else greedy_ms_per_token
    return {"total_ms": total, "phase_ms": phases, "tail_ms": tail_ms, "ms_per_token": total / result.T,
            "greedy_ms_per_token": greedy, "speedup": greedy / (total / result.T)}


def compare(u: UnitCosts, results) -> dict:
    """Predicted beside measured, for one SpecResult or a list (e.g. six starts)."""
    results = results if isinstance(results, (list, tuple)) else [results]
    T = sum(r.T for r in results)
    pred_total, pred_ph, meas_ph = 0.0, {ph: 0.0 for ph in PHASES}, {ph: 0.0 for ph in PHASES}
    meas_total, greedy_meas = 0.0, 0.0
    for r in results:
        p = predict_result(u, r)
        pred_total += p["total_ms"]
        for ph in PHASES:
            pred_ph[ph] += p["phase_ms"][ph]
        for ph, v in r.phase_ms().items():
            meas_ph[ph] = meas_ph.get(ph, 0.0) + v
        meas_total += r.spec_ms
        greedy_meas = None if (greedy_meas is None or r.greedy_ms is None) else greedy_meas + r.greedy_ms
    g_pred = u.step + u.argmax
    out = {"T": T, "predicted_ms_per_token": pred_total / T, "measured_ms_per_token": meas_total / T,
           "predicted_phase_ms": pred_ph, "measured_phase_ms": meas_ph,
           "predicted_greedy_ms_per_token": g_pred, "predicted_speedup": g_pred / (pred_total / T),
           "measured_greedy_ms_per_token": None if greedy_meas is None else greedy_meas / T,
           "measured_speedup": None if greedy_meas is None else greedy_meas / meas_total}
    out["ratio"] = out["measured_ms_per_token"] / out["predicted_ms_per_token"] if pred_total else None
    return out


# ---- measuring the unit costs ---------------------------------------------------------------
def _median_ms(be, fn, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        a = be.now()
        fn()
        b = be.now()
        ts.append(be.elapsed_ms(a, b))
    return float(np.median(ts))


def measure_unit_costs(model, k_max: int = 4, ctx: int = 64, reps: int = 5, warmup: int = 1,
                       seed: int = 0) -> UnitCosts:
    """Time each primitive the rounds use, on a sequence `ctx` tokens long (medians of reps,
    with the backend's clock: CUDA events on GPU)."""
    if not model.has_mtp:
        raise KestrelError("measure_unit_costs: the model has no MTP head")
    be, cfg = model.be, model.cfg
    rng = np.random.default_rng(seed)
    toks = [int(t) for t in rng.integers(0, cfg.vocab_size, ctx)]
    n_calls = (reps + warmup) * (2 + 2 * k_max + 2)
    eng = Engine(model, max_seq=ctx + n_calls * k_max + 8, mmax=k_max, batch="flex")
    s = eng.prefill(toks)
    H = s.hidden
    eng.mtp_step(0, toks, H)                    # MTP rows 0..ctx-1
    h1 = H[ctx - 1]
    t1 = toks[-1]
    u = {}
    u["step"] = _median_ms(be, lambda: eng.step(eng.cursor, t1), reps, warmup)
    u["step_m"] = {m: _median_ms(be, lambda m=m: eng.step_m(eng.cursor, toks[:m]), reps, warmup)
                   for m in range(1, k_max + 1)}

    def ckpt(m):
        eng.verify_checkpointed(eng.cursor, toks[:m])
        eng.select_checkpoint(0)
    u["ckpt"] = {m: _median_ms(be, lambda m=m: ckpt(m), reps, warmup) for m in range(1, k_max + 1)}

    def sel():
        eng.verify_checkpointed(eng.cursor, toks[:1])
        a = be.now()
        eng.select_checkpoint(0)
        return a, be.now()
    ts = [be.elapsed_ms(*sel()) for _ in range(reps)]
    u["select"] = float(np.median(ts))
    u["mark"] = _median_ms(be, eng.mark, reps, warmup)

    def rb():
        eng.mark()
        a = be.now()
        eng.rollback()
        return a, be.now()
    u["rollback"] = float(np.median([be.elapsed_ms(*rb()) for _ in range(reps)]))
    base = eng.mtp_cursor

    def draft():
        st = eng.mtp_step(eng.mtp_cursor, t1, h1)
        int(be.argmax(st.logits))
    u["draft"] = _median_ms(be, draft, reps, warmup)
    eng.mtp_truncate(base)

    def mtp(m):
        eng.mtp_step(base, toks[:m], H[:m])
        eng.mtp_truncate(base)
    u["mtp"] = {m: _median_ms(be, lambda m=m: mtp(m), reps, warmup) for m in range(1, k_max + 1)}
    u["truncate"] = _median_ms(be, lambda: eng.mtp_truncate(eng.mtp_cursor), reps, warmup)
    lg1 = s.logits[ctx - 1]
    lgk = s.logits[:k_max]
    u["argmax"] = _median_ms(be, lambda: int(be.argmax(lg1)), reps, warmup)
    u["book"] = _median_ms(be, lambda: (be.to_numpy(be.argmax(lgk)), int(be.argmax(lg1))), reps, warmup)
    meta = {"model": cfg.name, "device": getattr(be, "device_name", be.name), "ctx": ctx, "reps": reps,
            "k_max": k_max, "gdn_state_bytes": cfg.gdn_state_bytes + cfg.conv_state_bytes}
    return UnitCosts(meta=meta, **u)
