"""The speculative round (SPEC §4) and its driver.

Invariant at a round start: the main model has consumed through position p (its cursor is
p+1); h_p and logits_p are at hand (a_p = argmax(logits_p) is the token at p+1); the MTP
cursor is at p with rows [0, p) written.

  1. draft    d_1..d_k (the drafter)
  2. verify   mark(); step_m(p+1, [d_1..d_k])        (checkpoint: verify_checkpointed, no mark)
  3. accept   n_ok = 1 if a_p == d_1 else 0; while n_ok < k and argmax(row n_ok-1) == d_{n_ok+1}:
              n_ok += 1  (n_ok >= 1 is checked before row n_ok-1 is read)
  4. emit     n_ok >= 1: d_1..d_{n_ok};  n_ok == 0: a_p.  Never the self token argmax(row n_ok-1):
              it is the next round's judge of d'_1.
  5. finalise consumed == emitted:  n_ok == k keep;  otherwise per policy
              replay       rollback(); step() each accepted row (M=1), or step(p+1, a_p) if n_ok == 0
              flex-replay  rollback(); one step_m(p+1, d_1..d_{n_ok}), or step(p+1, a_p)
              checkpoint   select_checkpoint(n_ok) (no copy, no replay); n_ok == 0: then step(p+1, a_p)
     p' = p + max(n_ok, 1); the drafter syncs the MTP slot to p'.
  tail: when fewer than k tokens are left, a strict engine rejects the short batch; the seed
        stops speculating and finishes with plain M=1 steps (tail='plain', the default for
        strict). Flex engines shrink the last rounds (tail='shrink'); tail='shrink' on a strict
        engine reproduces the seed's bug (BatchWidthError).

Deliberately wrong variants (for the book), each behind an explicit argument:
  emit_self=True        also emit the self token: ghost (duplicated) tokens; the consumed ==
                        emitted check raises unless check=False
  double_consume=True   verify step_m(p, [t_p, d_1..d_{k-1}]): position p consumed twice; the
                        engine raises CursorError
  mark_first=True, mark_mtp_cursor=False
                        the negative control: mark() before the draft, and a driver that trusts
                        rollback() to rewind the MTP slot (drafts at the engine's MTP cursor).
                        With the MTP cursor in the snapshot, the drafts equal the standard run's;
                        without it, the MTP rows drift: other drafts, another histogram (the
                        stream stays bit-exact: the construction guarantee hides it)
  drafter 'mtp' with feed='seed-pairing' | 'stale-hidden'
                        wrong MTP inputs: bit-exact, acceptance collapses
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..engine import Engine, generate
from ..errors import KestrelError
from .drafters import Drafter, RoundCtx, make_drafter
from .stats import PHASES, log_lines, summarize_noks

POLICIES = {"replay": "strict", "flex-replay": "flex", "checkpoint": "flex"}
POLICY_DOC = {
    "replay": "the seed's wall: strict batch (M == mmax), rollback + M=1 replay row by row",
    "flex-replay": "rollback + one batched replay of the n_ok accepted rows (flex batch)",
    "checkpoint": "per-row GDN checkpoints written by the verify; select slot n_ok: no copy, no replay",
}
TAILS = ("plain", "shrink")


class InvariantError(KestrelError):
    """The round broke consumed == emitted, or a cursor invariant."""


@dataclass
class RoundRecord:
    i: int                  # round index
    p: int                  # anchor: main consumed through p
    k: int                  # drafts this round (k, or fewer in a shrunk tail round)
    drafts: list
    n_ok: int
    emitted: list           # tokens emitted this round
    self_token: int | None  # argmax of verify row n_ok-1 (never emitted, unless emit_self)
    mtp_cursor: int         # MTP cursor at the round start
    ms: dict                # phase -> milliseconds
    requested: int | None = None   # n_ok the replay drafter asked for

    @property
    def total_ms(self) -> float:
        return float(sum(self.ms.values()))


@dataclass
class SpecResult:
    model: str
    device: str
    policy: str
    drafter: str
    pairing: str
    k: int
    T: int
    batch: str
    tail_mode: str
    prompt: list
    stream: list
    reference: list | None
    rounds: list
    tail_tokens: int = 0
    tail_ms: float = 0.0
    tail_reason: str = ""
    prefill_ms: float = 0.0
    mtp_fill_ms: float = 0.0
    greedy_ms: float | None = None         # greedy decode of the same T tokens, same run
    variants: dict = field(default_factory=dict)

    # ---- derived ---------------------------------------------------------------------------
    @property
    def bit_exact(self) -> bool | None:
        return None if self.reference is None else list(self.stream) == list(self.reference)

    @property
    def first_diff(self) -> int | None:
        if self.reference is None:
            return None
        for i, (a, b) in enumerate(zip(self.stream, self.reference)):
            if a != b:
                return i
        return None if len(self.stream) == len(self.reference) else min(len(self.stream), len(self.reference))

    @property
    def noks(self) -> list:
        return [r.n_ok for r in self.rounds]

    @property
    def spec_ms(self) -> float:
        return float(sum(r.total_ms for r in self.rounds) + self.tail_ms)

    def phase_ms(self) -> dict:
        out = {ph: 0.0 for ph in PHASES}
        for r in self.rounds:
            for ph, v in r.ms.items():
                out[ph] = out.get(ph, 0.0) + v
        return out

    def summary(self) -> dict:
        s = summarize_noks(self.noks, [r.k for r in self.rounds], self.k)
        s.update(_timing(self.T, self.spec_ms, self.greedy_ms))
        s.update(model=self.model, device=self.device, policy=self.policy, drafter=self.drafter,
                 pairing=self.pairing, k=self.k, T=self.T, P=len(self.prompt), tail_tokens=self.tail_tokens,
                 tail_reason=self.tail_reason, bit_exact=self.bit_exact, first_diff=self.first_diff,
                 phase_ms=self.phase_ms(), prefill_ms=self.prefill_ms, mtp_fill_ms=self.mtp_fill_ms,
                 variants=dict(self.variants))
        return s

    def log_lines(self) -> list:
        return log_lines(self.summary())

    def to_dict(self, rounds: bool = True) -> dict:
        d = {"summary": self.summary(), "prompt": list(self.prompt), "stream": list(self.stream),
             "reference": None if self.reference is None else list(self.reference)}
        if rounds:
            d["rounds"] = [asdict(r) for r in self.rounds]
        return d


def _timing(T, spec_ms, greedy_ms) -> dict:
    d = {"spec_ms": spec_ms, "ms_per_token": spec_ms / T if T else None,
         "greedy_ms": greedy_ms, "greedy_ms_per_token": None if greedy_ms is None else greedy_ms / T,
         "speedup": None}
    if greedy_ms is not None and spec_ms > 0:
        d["speedup"] = greedy_ms / spec_ms
    return d


def aggregate(results: list) -> dict:
    """One summary over several runs (e.g. the six starts): histograms, counts and times add."""
    if not results:
        raise KestrelError("aggregate: no results")
    noks, ks = [], []
    for r in results:
        noks += r.noks
        ks += [x.k for x in r.rounds]
    k = max(r.k for r in results)
    s = summarize_noks(noks, ks, k)
    T = sum(r.T for r in results)
    spec_ms = sum(r.spec_ms for r in results)
    greedy = None if any(r.greedy_ms is None for r in results) else sum(r.greedy_ms for r in results)
    s.update(_timing(T, spec_ms, greedy))
    phases = {}
    for r in results:
        for ph, v in r.phase_ms().items():
            phases[ph] = phases.get(ph, 0.0) + v
    exact = [r.bit_exact for r in results]
    s.update(model=results[0].model, device=results[0].device, policy=results[0].policy,
             drafter=results[0].drafter, pairing=results[0].pairing, k=k, T=T, runs=len(results),
             tail_tokens=sum(r.tail_tokens for r in results),
             tail_reason=(f"fewer than k={k} left at the end of {sum(1 for r in results if r.tail_tokens)} run(s): "
                          f"the strict batch needs M == mmax, so the seed stops speculating"),
             bit_exact=None if None in exact else all(exact),
             first_diff=next((r.first_diff for r in results if r.bit_exact is False), None),
             phase_ms=phases, speedup_per_run=[r.summary()["speedup"] for r in results])
    return s


# ---- the greedy baseline ------------------------------------------------------------------
def _reuse(engine, model, need: int, what: str, mmax: int | None = None, batch: str | None = None):
    """Check a caller's engine fits the run, then reset it (its buffers, and so a GPU backend's
    captured plans keyed on them, are reused: benchmarks then time no plan capture)."""
    if engine.model is not model:
        raise KestrelError(f"{what}: engine= belongs to another model")
    if engine.max_seq < need:
        raise KestrelError(f"{what}: engine= has max_seq={engine.max_seq}, the run needs {need}")
    if mmax is not None and engine.mmax != mmax:
        raise KestrelError(f"{what}: engine= has mmax={engine.mmax}, the run needs mmax == k == {mmax}")
    if batch is not None and engine.batch != batch:
        raise KestrelError(f"{what}: engine= has batch={engine.batch!r}, the policy needs {batch!r}")
    engine.reset()
    return engine


def greedy_timed(model, prompt, T: int, max_seq: int | None = None, engine=None):
    """Plain greedy decoding of T tokens, timed with the backend's clock (CUDA events on GPU).
    Like the spec driver, it consumes every emitted token (T steps), so both end in the same
    state. Returns (stream, decode_ms, prefill_ms); the stream equals kestrel.generate's.
    engine: an Engine to reuse (reset first), e.g. to keep a GPU backend's captured plans."""
    be = model.be
    prompt = [int(t) for t in prompt]
    need = len(prompt) + T + 1
    if engine is not None:
        eng = _reuse(engine, model, need, "greedy_timed")
    else:
        eng = Engine(model, max_seq=max_seq or need, mmax=1, batch="flex")
    a = be.now()
    lg = eng.prefill(prompt).logits[-1]
    b = be.now()
    out = []
    for _ in range(T):
        t = int(be.argmax(lg))
        out.append(t)
        lg = eng.step(eng.cursor, t).logits
    c = be.now()
    return out, be.elapsed_ms(b, c), be.elapsed_ms(a, b)


# ---- the driver -----------------------------------------------------------------------------
def run_spec(model, prompt, T: int = 64, k: int = 3, policy: str = "checkpoint", drafter="mtp", *,
             reference=None, greedy: bool = True, tail: str | None = None, batch: str | None = None,
             hist=None, profile=None, seq=None, pairing: str | None = None, seed: int = 0, feed: str = "correct",
             emit_self: bool = False, double_consume: bool = False, mark_first: bool = False,
             mark_mtp_cursor: bool = True, check: bool = True, check_rows: bool = False,
             max_seq: int | None = None, on_round=None, engine=None, greedy_engine=None) -> SpecResult:
    """Speculative decoding of T tokens after `prompt` with k drafts per round.

    policy: 'replay' | 'flex-replay' | 'checkpoint'.  drafter: 'mtp-seed' | 'mtp' | 'replay' |
    a Drafter. The replay drafter takes one of hist= ('0:24 1:6 2:11 3:4' or a dict),
    profile= (alpha_j list) or seq= (n_ok list), and pairing= 'seed' | 'mtp'.
    greedy=True times plain greedy decoding in the same call (the speedup baseline) and uses
    its stream as the reference; otherwise pass reference= (e.g. kestrel.generate's stream).
    check=True: after every round consumed == emitted and the cursors are where the invariant
    says, else InvariantError. check_rows=True also checks, on replay, that each replayed row
    is bit-identical to its verify row (batch invariance, live).
    on_round: called with each RoundRecord as soon as its round is done (live widgets).
    engine / greedy_engine: Engines to reuse (reset first) for the spec run / the greedy
    baseline; the spec engine needs mmax == k and the policy's batch mode. Benchmarks reuse
    them so that a GPU backend's captured plans (keyed on the engine's buffers) are reused.
    """
    if policy not in POLICIES:
        raise KestrelError(f"unknown policy {policy!r}; known: {tuple(POLICIES)}")
    if not isinstance(T, int) or T < 1:
        raise KestrelError(f"T must be a positive int, got {T!r}")
    if not isinstance(k, int) or k < 1:
        raise KestrelError(f"k must be a positive int, got {k!r}")
    if not model.has_mtp:
        raise KestrelError("speculative decoding here drafts with the MTP head; this model has none")
    batch = batch or POLICIES[policy]
    tail = tail or ("plain" if batch == "strict" else "shrink")
    if tail not in TAILS:
        raise KestrelError(f"tail must be one of {TAILS}, got {tail!r}")
    if mark_first and policy == "checkpoint":
        raise KestrelError("mark_first is the negative control of mark/rollback; the checkpoint policy takes no mark")
    be = model.be
    prompt = [int(t) for t in prompt]
    P = len(prompt)
    if P < 1:
        raise KestrelError("the prompt needs at least one token")

    greedy_ms = None
    if greedy:
        gstream, greedy_ms, _ = greedy_timed(model, prompt, T, engine=greedy_engine)
        reference = gstream if reference is None else reference
    reference = None if reference is None else [int(t) for t in reference]

    d = make_drafter(drafter, hist=hist, profile=profile, seq=seq, pairing=pairing, seed=seed, feed=feed, fit_k=k)
    d.bind(model, reference)
    d.reset()
    need = P + T + k + 2
    if mark_first:                      # the MTP slot may drift by up to k rows per round
        need += (T + 1) * (k + 1)
    if engine is not None:
        eng = _reuse(engine, model, need, "run_spec", mmax=k, batch=batch)
    else:
        eng = Engine(model, max_seq=max(max_seq or 0, need), mmax=k, batch=batch)
    run = _Run(model, eng, d, prompt, T, k, policy, tail, emit_self, double_consume, mark_first,
               mark_mtp_cursor, check, check_rows, on_round)
    run.go()
    variants = {}                       # the deliberately wrong switches that are on
    if emit_self:
        variants["emit_self"] = True
    if double_consume:
        variants["double_consume"] = True
    if mark_first:
        variants["mark_first"] = True
    if not mark_mtp_cursor:
        variants["mark_mtp_cursor"] = False
    if feed != "correct":
        variants["feed"] = feed
    return SpecResult(model=model.cfg.name, device=getattr(be, "device_name", be.name), policy=policy,
                      drafter=d.describe(), pairing=d.pairing, k=k, T=T, batch=batch, tail_mode=tail,
                      prompt=prompt, stream=run.stream[:T], reference=reference, rounds=run.records,
                      tail_tokens=run.tail_tokens, tail_ms=run.tail_ms, tail_reason=run.tail_reason,
                      prefill_ms=run.prefill_ms, mtp_fill_ms=run.mtp_fill_ms, greedy_ms=greedy_ms,
                      variants=variants)


class _Run:
    def __init__(self, model, eng, drafter: Drafter, prompt, T, k, policy, tail, emit_self, double_consume,
                 mark_first, mark_mtp_cursor, check, check_rows, on_round=None):
        self.model, self.be, self.eng, self.d = model, model.be, eng, drafter
        self.prompt, self.T, self.k, self.policy, self.tail = prompt, T, k, policy, tail
        self.emit_self, self.double_consume = emit_self, double_consume
        self.mark_first, self.mark_mtp_cursor = mark_first, mark_mtp_cursor
        self.check, self.check_rows, self.on_round = check, check_rows, on_round
        self.stream, self.records = [], []
        self.tail_tokens, self.tail_ms, self.tail_reason = 0, 0.0, ""

    def go(self):
        be, eng, P = self.be, self.eng, len(self.prompt)
        a = be.now()
        s = eng.prefill(self.prompt)
        b = be.now()
        self.d.start(eng, self.prompt, s.hidden)
        c = be.now()
        self.prefill_ms, self.mtp_fill_ms = be.elapsed_ms(a, b), be.elapsed_ms(b, c)
        H = s.hidden
        self.ctx = RoundCtx(p=P - 1, t_p=self.prompt[-1], h_p=H[P - 1], h_prev=H[max(P - 2, 0)],
                            a_p=int(be.argmax(s.logits[P - 1])), emitted=0, P=P)
        self._check_invariant()
        while len(self.stream) < self.T:
            left = self.T - len(self.stream)
            kr = self.k
            if left < self.k:
                if self.tail == "plain":
                    self._plain_tail(left)
                    break
                kr = left          # a short batch: flex accepts it, strict raises (the seed's bug)
            self._round(kr)

    # ---- one round ---------------------------------------------------------------------------
    def _round(self, k):
        be, eng, ctx, policy = self.be, self.eng, self.ctx, self.policy
        p = ctx.p
        ev, names = [be.now()], []

        def lap(name):
            ev.append(be.now())
            names.append(name)

        mcur = eng.mtp_cursor
        if self.mark_first:
            eng.mark(include_mtp_cursor=self.mark_mtp_cursor)
            lap("mark")
        q0 = eng.mtp_cursor if self.mark_first else p          # mark_first: the driver trusts the cursor
        drafts = self.d.draft(eng, ctx, k, q0)
        lap("draft")
        if self.double_consume:      # the seed's first verify: position p once more
            vpos, vtoks = p, [ctx.t_p] + drafts[:k - 1]
        else:
            vpos, vtoks = p + 1, drafts
        if policy == "checkpoint":
            s = eng.verify_checkpointed(vpos, vtoks)
        else:
            if not self.mark_first:
                eng.mark(include_mtp_cursor=self.mark_mtp_cursor)
                lap("mark")
            s = eng.step_m(vpos, vtoks)
        lap("verify")

        rows = [int(x) for x in be.to_numpy(be.argmax(s.logits)).reshape(-1)]
        n_ok = 1 if ctx.a_p == drafts[0] else 0
        while n_ok >= 1 and n_ok < k and rows[n_ok - 1] == drafts[n_ok]:
            n_ok += 1
        consumed = drafts[:n_ok] if n_ok >= 1 else [ctx.a_p]
        self_token = rows[n_ok - 1] if n_ok >= 1 else None
        emitted = list(consumed)
        if self.emit_self and n_ok >= 1:
            emitted.append(self_token)              # WRONG on purpose: the ghost token
        lap("book")

        rolled = False
        if n_ok == k:                               # keep the whole batch
            if policy == "checkpoint":
                eng.select_checkpoint(k)
                lap("rollback")
            hid, lg = s.hidden[:k], s.logits[k - 1]
        elif policy == "checkpoint":
            eng.select_checkpoint(n_ok)             # slot n_ok (0: the untouched original)
            lap("rollback")
            if n_ok == 0:
                s1 = eng.step(p + 1, ctx.a_p)
                lap("replay")
                hid, lg = s1.hidden.reshape(1, -1), s1.logits
            else:
                hid, lg = s.hidden[:n_ok], s.logits[n_ok - 1]
        else:
            eng.rollback()
            rolled = True
            lap("rollback")
            if policy == "replay" or n_ok == 0:     # M=1, row by row
                outs = [eng.step(p + 1 + j, t) for j, t in enumerate(consumed)]
                hid, lg = be.xp.stack([o.hidden for o in outs]), outs[-1].logits
                lgs = [o.logits for o in outs]
            else:                                   # one batch of n_ok rows
                s2 = eng.step_m(p + 1, consumed)
                hid, lg = s2.hidden, s2.logits[n_ok - 1]
                lgs = [s2.logits[j] for j in range(n_ok)]
            lap("replay")
            if self.check_rows and n_ok >= 1:
                self._check_rows(s, hid, lgs, n_ok)

        self.d.sync(eng, ctx, consumed, hid, rolled_back=rolled, trusting=self.mark_first)
        lap("sync")

        adv = len(consumed)
        self.stream.extend(emitted)
        h_prev = hid[adv - 2] if adv >= 2 else ctx.h_p
        self.ctx = RoundCtx(p=p + adv, t_p=consumed[-1], h_p=hid[adv - 1], h_prev=h_prev,
                            a_p=int(be.argmax(lg)), emitted=len(self.stream), P=ctx.P)
        self._check_invariant()
        lap("book")

        ms = {}
        for name, a, b in zip(names, ev[:-1], ev[1:]):
            ms[name] = ms.get(name, 0.0) + be.elapsed_ms(a, b)
        req = self.d.schedule.requested[-1] if hasattr(self.d, "schedule") else None
        self.records.append(RoundRecord(i=len(self.records), p=p, k=k, drafts=list(drafts), n_ok=n_ok,
                                        emitted=emitted, self_token=self_token, mtp_cursor=mcur, ms=ms,
                                        requested=req))
        if self.on_round is not None:
            self.on_round(self.records[-1])

    def _plain_tail(self, left):
        be, eng = self.be, self.eng
        self.tail_reason = (f"{left} left < k={self.k}: the strict batch needs M == mmax == {self.k}, "
                            f"so the seed stops speculating")
        a = be.now()
        for _ in range(left):
            ctx = self.ctx
            t = ctx.a_p
            self.stream.append(t)
            s = eng.step(ctx.p + 1, t)
            self.ctx = RoundCtx(p=ctx.p + 1, t_p=t, h_p=s.hidden, h_prev=ctx.h_p, a_p=int(be.argmax(s.logits)),
                                emitted=len(self.stream), P=ctx.P)
        b = be.now()
        self.tail_tokens, self.tail_ms = left, be.elapsed_ms(a, b)
        if self.check and self.eng.cursor - len(self.prompt) != len(self.stream):
            raise InvariantError("tail: consumed != emitted")

    # ---- checks ---------------------------------------------------------------------------------
    def _check_invariant(self):
        if not self.check:
            return
        eng, ctx, P = self.eng, self.ctx, len(self.prompt)
        consumed = eng.cursor - P
        if consumed != len(self.stream):
            raise InvariantError(f"round {len(self.records)}: consumed {consumed} != emitted {len(self.stream)} "
                                 f"(main cursor {eng.cursor}, prompt {P})")
        if eng.cursor != ctx.p + 1:
            raise InvariantError(f"round {len(self.records)}: main cursor {eng.cursor} != p+1 = {ctx.p + 1}")
        if eng.pending is not None:
            raise InvariantError(f"round {len(self.records)}: a checkpointed verify is still pending")
        if not self.mark_first and eng.mtp_cursor != ctx.p:
            raise InvariantError(f"round {len(self.records)}: MTP cursor {eng.mtp_cursor} != p = {ctx.p}")

    def _check_rows(self, s, hid, lgs, n_ok):
        be = self.be
        for j in range(n_ok):
            same_h = np.array_equal(be.to_numpy(hid[j]), be.to_numpy(s.hidden[j]))
            same_l = np.array_equal(be.to_numpy(lgs[j]), be.to_numpy(s.logits[j]))
            if not (same_h and same_l):
                raise InvariantError(f"round {len(self.records)}: replayed row {j} differs from verify row {j} "
                                     f"(hidden equal={same_h}, logits equal={same_l}): batch invariance broken")


# ---- the negative control at primitive level ----------------------------------------------------
def mtp_cursor_control(model, prompt, k: int = 3, include_mtp_cursor: bool = True) -> dict:
    """mark(); draft k MTP rows from the anchor; rollback(); draft again at the engine's MTP
    cursor. With the MTP cursor in the snapshot the second draft starts at p again and repeats
    the first exactly; without it the cursor stays at p+k, the second draft lands on other
    positions, sees the stale rows, and differs."""
    prompt = [int(t) for t in prompt]
    P = len(prompt)
    be = model.be
    eng = Engine(model, max_seq=P + 3 * k + 4, mmax=max(k, 1), batch="flex")
    s = eng.prefill(prompt)
    d = make_drafter("mtp-seed")
    d.bind(model, None)
    d.start(eng, prompt, s.hidden)
    ctx = RoundCtx(p=P - 1, t_p=prompt[-1], h_p=s.hidden[P - 1], h_prev=s.hidden[max(P - 2, 0)],
                   a_p=int(be.argmax(s.logits[P - 1])), emitted=0, P=P)
    eng.mark(include_mtp_cursor=include_mtp_cursor)
    c0 = eng.mtp_cursor
    first = d.draft(eng, ctx, k, eng.mtp_cursor)
    c1 = eng.mtp_cursor
    eng.rollback()
    c2 = eng.mtp_cursor
    second = d.draft(eng, ctx, k, eng.mtp_cursor)
    return {"include_mtp_cursor": include_mtp_cursor, "cursor_at_mark": c0, "cursor_after_draft": c1,
            "cursor_after_rollback": c2, "first": first, "second": second, "same": first == second}


# ---- starts ---------------------------------------------------------------------------------------
def default_starts(model, n: int = 6, seed: int = 0) -> list:
    """(label, tokens) for the six starts: the tiny model's starts.json prompts (byte tokens) when
    the model has a byte tokenizer, else n seeded random prompts of 4..19 tokens."""
    from .. import ASSETS
    path = ASSETS / "tiny" / "starts.json"
    tok = getattr(model, "tokenizer", None)
    if tok is not None and path.exists():
        texts = json.loads(Path(path).read_text())[:n]
        return [(t, tok.encode(t)) for t in texts]
    rng = np.random.default_rng(seed)
    V = model.cfg.vocab_size
    out = []
    for i in range(n):
        L = 4 + 3 * i
        toks = [int(x) for x in rng.integers(0, V, L)]
        out.append((f"random[{i}] len={L}", toks))
    return out


def now_stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


__all__ = ["run_spec", "greedy_timed", "aggregate", "SpecResult", "RoundRecord", "InvariantError", "POLICIES",
           "POLICY_DOC", "TAILS", "mtp_cursor_control", "default_starts", "reference_stream"]


def reference_stream(model, prompt, T: int) -> list:
    """The greedy reference (kestrel.generate)."""
    return generate(model, list(prompt), T)
