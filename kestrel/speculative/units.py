"""Unit costs: milliseconds per primitive call, measured on the model at hand (the cost model's inputs)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..engine import Engine
from .errors import SpecArgumentError
from .inputs import check_size

K_VALUES = (1, 2, 3, 4)          # the k the cost views cover


@dataclass
class UnitCosts:
    """Milliseconds per call. step_m / ckpt / mtp are dicts M -> ms."""
    step: float                 # main model, M=1 step
    step_m: dict                # main model, batch of M rows (verify, flex replay)
    ckpt: dict                  # verify_checkpointed, M rows (+ per-row state slots)
    draft: float                # one draft token: a k_max-row mtp_draft chain (MTP step + argmax on the
                                # device, tokens read once) / k_max; results without meta["draft_unit"]
                                # timed one mtp_step + argmax + read per token
    mtp: dict                   # one batched MTP fill of M rows (mtp_fill: the prompt's rows, the trained
                                # pairing's rewrite; results measured before mtp_fill existed timed mtp_step)
    mark: float                 # whole GDN state copy + cursors
    rollback: float             # whole GDN state copy back + cursors
    select: float = 0.0         # select_checkpoint (cursor/slot move)
    cached: dict = field(default_factory=dict)   # verify_cached, M rows (inputs kept, state only read)
    fold: dict = field(default_factory=dict)     # fold_cached(n) of a pending cached verify, n = 0..k_max
    truncate: float = 0.0       # mtp_truncate (cursor move)
    argmax: float = 0.0         # argmax of one logits row + read to host (greedy per token)
    bookkeeping: float = 0.0    # per-round bookkeeping (argmax of the verify rows, accept, emit; results
                                # without meta["bookkeeping_unit"]: also argmax(logits_p') every round)
    chain: dict = field(default_factory=dict)    # one mtp_draft chain of n rows, n = 1..k_max (its fixed
                                                 # cost, one read and one check, is paid once a chain)
    chain_fill: dict = field(default_factory=dict)   # one mtp_draft of 1 row that writes m fill rows first,
                                                     # m = 1..k_max-1 (the trained pairing's rewrite rides
                                                     # in the next chain's first pass; results without
                                                     # this table priced it as an mtp_fill in the sync)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("step_m", "ckpt", "mtp", "cached", "fold", "chain", "chain_fill"):
            setattr(self, name, {int(m): float(v) for m, v in getattr(self, name).items()})

    def get(self, table: str, m: int) -> float:
        t = getattr(self, table)
        if m not in t:
            raise SpecArgumentError(f"unit costs have no {table}[M={m}] (measured M: {sorted(t)})")
        return t[m]

    @property
    def greedy_ms_per_token(self) -> float:
        """Greedy decoding: one M=1 step and one argmax per token."""
        return self.step + self.argmax

    def draft_ms(self, n: int) -> float:
        """ms of n chained draft steps (one mtp_draft): the measured chain, else n x draft."""
        if n <= 0:
            return 0.0
        return self.chain[n] if n in self.chain else n * self.draft

    def rewrite_ms(self, rows: int, chained: bool) -> float:
        """ms the trained pairing's rewrite of `rows` MTP rows adds: in the next chain's first pass
        (chain_fill[rows] - chain[1]) when there is a chain and the table was measured, else one
        mtp_fill of that many rows."""
        if rows <= 0:
            return 0.0
        if chained and self.chain_fill:     # a difference of two medians: noise can make it negative
            return max(self.get("chain_fill", rows) - self.draft_ms(1), 0.0)
        return self.get("mtp", rows)

    def covered_ks(self, ks=K_VALUES) -> list:
        """The k for which every table entry a round needs was measured."""
        return [k for k in ks if k in self.ckpt and all(m in self.step_m for m in range(1, k + 1))
                and all(m in self.mtp for m in range(1, max(k - 1, 1) + 1))]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "UnitCosts":
        return cls(**d)


def edit_units(u: UnitCosts, *, step: float | None = None, draft: float | None = None, mark: float | None = None,
               rollback: float | None = None) -> UnitCosts:
    """A copy of UnitCosts with some costs changed. step scales the batch tables too (step_m and
    verify_checkpointed, keeping their shape in M), draft scales the chain and the batched MTP fill tables with it
    (both run the MTP head's weights: a cheaper head makes both cheaper); mark and rollback (the
    whole-state copies) are set as given."""
    d = u.to_dict()

    def scaled(tables, f):          # each table's costs times f, its shape kept
        for name in tables:
            d[name] = {m: v * f for m, v in getattr(u, name).items()}
    if step is not None and u.step > 0:
        d["step"] = step
        scaled(("step_m", "ckpt", "cached", "fold"), step / u.step)
    if draft is not None and u.draft > 0:
        d["draft"] = draft
        scaled(("mtp", "chain", "chain_fill"), draft / u.draft)
    if mark is not None:
        d["mark"] = mark
    if rollback is not None:
        d["rollback"] = rollback
    d["meta"] = dict(u.meta, edited=True)
    return UnitCosts.from_dict(d)


def _median_ms(be, fn, reps: int, warmup: int, before=None) -> float:
    """Median ms of fn() over reps calls after warmup ones; before(), if given, runs ahead of every
    call, outside the timed span."""
    ts = []
    for i in range(warmup + reps):
        if before is not None:
            before()
        a = be.now()
        fn()
        b = be.now()
        if i >= warmup:
            ts.append(be.elapsed_ms(a, b))
    return float(np.median(ts))


def check_measurement(model, k_max, ctx, reps, warmup) -> int:
    """SpecArgumentError unless measure_unit_costs can run with these; -> the positions it uses."""
    if not model.has_mtp:
        raise SpecArgumentError("measure_unit_costs: the model has no MTP head")
    k_max, ctx, reps = check_size(k_max, "k_max"), check_size(ctx, "ctx"), check_size(reps, "reps")
    warmup = check_size(warmup, "warmup", lo=0)
    if ctx < k_max:
        raise SpecArgumentError(f"ctx={ctx} < k_max={k_max}: the batch of M rows is cut from the context")
    n_calls = (reps + warmup) * (2 + 2 * k_max + 2)
    need = ctx + n_calls * k_max + 8                # every timed step moves the cursor on
    limit = model.cfg.max_position_embeddings
    if need > limit:
        raise SpecArgumentError(f"measuring ctx={ctx}, k_max={k_max}, reps={reps}, warmup={warmup} needs {need} "
                                f"positions; the model has max_position_embeddings={limit}")
    return need


def measure_unit_costs(model, k_max: int = 4, ctx: int = 64, reps: int = 5, warmup: int = 1,
                       seed: int = 0) -> UnitCosts:
    """Time each primitive the rounds use, on a sequence `ctx` tokens long (medians of reps,
    with the backend's clock: CUDA events on GPU)."""
    need = check_measurement(model, k_max, ctx, reps, warmup)
    be, cfg = model.be, model.cfg
    rng = np.random.default_rng(seed)
    toks = [int(t) for t in rng.integers(0, cfg.vocab_size, ctx)]
    eng = Engine(model, max_seq=need, mmax=k_max, batch="flex")
    s = eng.prefill(toks)
    H = s.hidden
    eng.mtp_fill(0, toks, H)                    # MTP rows 0..ctx-1
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

    def cached(m):
        eng.verify_cached(eng.cursor, toks[:m])
        eng.fold_cached(0)
    u["cached"] = {m: _median_ms(be, lambda m=m: cached(m), reps, warmup) for m in range(1, k_max + 1)}

    def fold(n):
        eng.mark()
        eng.verify_cached(eng.cursor, toks[:k_max])
        a = be.now()
        eng.fold_cached(n)
        b = be.now()
        eng.rollback()
        return a, b
    u["fold"] = {n: float(np.median([be.elapsed_ms(*fold(n)) for _ in range(reps)])) for n in range(0, k_max + 1)}

    def sel():
        eng.verify_checkpointed(eng.cursor, toks[:1])
        a = be.now()
        eng.select_checkpoint(0)
        return a, be.now()
    u["select"] = float(np.median([be.elapsed_ms(*sel()) for _ in range(reps)]))
    u["mark"] = _median_ms(be, eng.mark, reps, warmup)

    def rb():
        eng.mark()
        a = be.now()
        eng.rollback()
        return a, be.now()
    u["rollback"] = float(np.median([be.elapsed_ms(*rb()) for _ in range(reps)]))
    base = eng.mtp_cursor

    def verified():
        # A round's chain runs after the verify whose rows the host has read: on a CPU the verify
        # has pushed the MTP head's weights out of the caches (a chain timed back to back ran
        # 1.2-1.6x faster than in a round), and on a GPU the device is idle when the chain is
        # launched, so its launches are not hidden behind queued work. Time it there.
        s = eng.verify_checkpointed(eng.cursor, toks[:k_max])
        be.to_numpy(be.argmax(s.logits))
        eng.select_checkpoint(0)
        eng.mtp_truncate(base)

    u["chain"] = {n: _median_ms(be, lambda n=n: eng.mtp_draft(base, t1, h1, n), reps, warmup, before=verified)
                  for n in range(1, k_max + 1)}
    u["draft"] = u["chain"][k_max] / k_max
    u["chain_fill"] = {m: _median_ms(be, lambda m=m: eng.mtp_draft(base, t1, h1, 1, fill_tokens=toks[:m],
                                                                   fill_hidden=H[:m]),
                                     reps, warmup, before=verified)
                       for m in range(1, k_max)}
    eng.mtp_truncate(base)

    def mtp(m):
        eng.mtp_fill(base, toks[:m], H[:m])
        eng.mtp_truncate(base)
    u["mtp"] = {m: _median_ms(be, lambda m=m: mtp(m), reps, warmup) for m in range(1, k_max + 1)}
    u["truncate"] = _median_ms(be, lambda: eng.mtp_truncate(eng.mtp_cursor), reps, warmup)
    lg1 = s.logits[ctx - 1]
    lgk = s.logits[:k_max]
    u["argmax"] = _median_ms(be, lambda: int(be.argmax(lg1)), reps, warmup)
    u["bookkeeping"] = _median_ms(be, lambda: be.to_numpy(be.argmax(lgk)), reps, warmup)
    meta = {"model": cfg.name, "device": getattr(be, "device_name", be.name), "ctx": ctx, "reps": reps,
            "k_max": k_max, "gdn_state_bytes": cfg.gdn_state_bytes + cfg.conv_state_bytes,
            "chain_timed": "after a verify",   # as a round runs it (without this key: back to back)
            "mtp_table": "mtp_fill",       # what the mtp table timed (results without this key: mtp_step)
            "draft_unit": f"mtp_draft chain of {k_max} / {k_max}, tokens left on the device",   # (without this key:
                                                                           # mtp_step + argmax + read)
            # (without this key: bookkeeping also held the argmax of a_p', in every round)
            "bookkeeping_unit": "the verify rows' argmax + read; a_p' priced as argmax where it is not a verify row"}
    return UnitCosts(meta=meta, **u)
