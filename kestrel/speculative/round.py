"""The anchored speculative round, run until T tokens are emitted.

Invariant at a round start: the main model has consumed through position p (its cursor is
p+1); h_p and logits_p are at hand (a_p = argmax(logits_p) is the token at p+1); the MTP
cursor plus the rows the drafter holds for its next chain (Drafter.pending_rows) is p, and
every row below the cursor is written.

  1. draft        d_1..d_k (the drafter); the drafted tokens may stay on the device
  2. verify       the policy's snapshot (mark() or nothing), then its verify of [d_1..d_k] at p+1,
                  fed device to device; the host reads the drafts with the verify rows' argmax
  3. accept       n_ok = 1 if a_p == d_1 else 0; while n_ok < k and argmax(row n_ok-1) == d_{n_ok+1}:
                  n_ok += 1  (n_ok >= 1 is checked before row n_ok-1 is read)
  4. emit         n_ok >= 1: d_1..d_{n_ok};  n_ok == 0: a_p.  Never the self token argmax(row n_ok-1):
                  it is the next round's judge of d'_1.
  5. finalise     consumed == emitted: the policy's finalise (see policy.py)
  6. sync         p' = p + max(n_ok, 1); the drafter syncs the MTP slot to p'.
  7. next anchor  a_p' = argmax(logits_p'): the verify row n_ok-1's argmax, already read in step 3,
                  when logits_p' are that row (Finalised.verify_row); otherwise one more argmax.
  tail: when fewer than k tokens are left, a strict engine rejects the short batch; the article's
        driver stops speculating and finishes with plain M=1 steps (tail='plain', the default for
        strict). Flex engines shrink the last rounds (tail='shrink'); tail='shrink' on a strict
        engine reproduces the article's bug (BatchWidthError).
Each phase is timed with the backend's clock (stats.PHASES); 'bookkeeping' is steps 3-4 and the checks.
"""
from __future__ import annotations

import numpy as np

from .drafters import Drafter, RoundCtx, draft_tokens
from .errors import InvariantError
from .policy import Policy, run_steps
from .records import RoundRecord

TAILS = ("plain", "shrink")


class RoundInFlight:
    """A round between begin_round and end_round: its k, anchor p, the MTP cursor it started at,
    the drafts, the verify's position and tokens, and its timed phases so far."""
    __slots__ = ("be", "k", "p", "mcur", "drafts", "pos", "tokens", "ev", "names")

    def __init__(self, be, k, p, mcur):
        self.be, self.k, self.p, self.mcur = be, k, p, mcur
        self.drafts = self.pos = self.tokens = None
        self.ev, self.names = [be.now()], []

    def lap(self, name):
        self.ev.append(self.be.now())
        self.names.append(name)


class SpecRun:
    """One speculative decoding run on an engine that is fresh or reset.

    The four methods under "the protocol's choices" are the places where the book's deliberate
    mistakes differ from the protocol (kestrel/speculative/mistakes.py overrides them); here each
    is the protocol itself."""
    trusting = False      # whether the driver trusts rollback() to rewind the MTP slot (it does not)

    def __init__(self, model, eng, drafter: Drafter, prompt, T: int, k: int, policy: Policy, tail: str,
                 check: bool, check_rows: bool, on_round=None, chooser=None):
        self.model, self.be, self.eng, self.d = model, model.be, eng, drafter
        self.prompt, self.T, self.k, self.policy, self.tail = prompt, T, k, policy, tail
        self.check, self.check_rows, self.on_round = check, check_rows, on_round
        self.chooser = chooser          # adaptive.KChooser: each round's k (0: a plain step), else k
        self.stream, self.records = [], []
        self.tail_tokens, self.tail_ms, self.tail_reason = 0, 0.0, ""

    def go(self):
        self.start()
        while len(self.stream) < self.T:
            left = self.T - len(self.stream)
            if self.chooser is not None and not self.chooser.can_pay:
                self._plain_tail(left, "k=auto: no k can beat a plain step at the costs measured")
                break
            if self.chooser is not None:
                a = self.be.now()
                kr = self.chooser.choose(left)
                b = self.be.now()
                if kr == 0:
                    self._plain_round()
                    self.chooser.observe_plain()
                else:
                    self._round(kr)
                last = self.records[-1]
                c = self.be.now()
                self.chooser.observe_time(last.k, last.n_ok, last.total_ms)
                # the decision is paid for like any other host work of the round: its time joins
                # the round's bookkeeping (after observe_time, whose scales price the rounds alone)
                last.ms["bookkeeping"] = (last.ms.get("bookkeeping", 0.0) + self.be.elapsed_ms(a, b)
                                          + self.be.elapsed_ms(c, self.be.now()))
                continue
            kr = self.k
            if left < self.k:
                if self.tail == "plain":
                    self._plain_tail(left)
                    break
                kr = left          # a short batch: flex accepts it, strict raises (the article's bug)
            self._round(kr)
        return self

    def start(self, prefilled=None):
        """Prefill the prompt (or take `prefilled`, the Step of a prefill already made, e.g. by a
        BatchEngine's join), start the drafter, set the first anchor."""
        be, eng, P = self.be, self.eng, len(self.prompt)
        a = be.now()
        s = eng.prefill(self.prompt) if prefilled is None else prefilled
        b = be.now()
        if self.chooser is None or self.chooser.can_pay:   # else nothing will be drafted: no MTP fill
            self.d.start(eng, self.prompt, s.hidden)
        c = be.now()
        self.prefill_ms, self.mtp_fill_ms = be.elapsed_ms(a, b), be.elapsed_ms(b, c)
        H = s.hidden
        self.ctx = RoundCtx(p=P - 1, t_p=self.prompt[-1], h_p=H[P - 1], h_prev=H[max(P - 2, 0)],
                            a_p=int(be.argmax(s.logits[P - 1])), emitted=0, P=P)
        self._check_invariant()
        return self

    # ---- the protocol's choices ------------------------------------------------------------------
    def snapshot_before_draft(self, eng) -> bool:
        """Nothing is marked before the draft: the drafts read the anchored MTP slot."""
        return False

    def verify_input(self, ctx, drafts, k: int) -> tuple:
        """The verify's first position and rows: p+1 and the drafts (p is consumed already)."""
        return ctx.p + 1, drafts

    def snapshot_before_verify(self, eng) -> bool:
        """The policy's snapshot (mark() or nothing), with the MTP cursor in it."""
        return self.policy.snapshot(eng, True)

    def emitted(self, consumed: list, self_token) -> list:
        """What the round emits: the consumed tokens, never the self token."""
        return list(consumed)

    # ---- one round ---------------------------------------------------------------------------
    def _round(self, k):
        r = self.begin_round(k)
        s = self.policy.verify(self.eng, r.pos, r.tokens)
        r.lap("verify")
        self.end_round(r, s)

    def begin_round(self, k) -> "RoundInFlight":
        """Steps 1-2 up to the verify: the draft and the policy's snapshot. -> the round, whose
        pos and tokens the policy's verify takes (a BatchEngine runs it in a pass shared with
        other sequences' rows); end_round(round, the verify's Step) finishes it."""
        eng, ctx = self.eng, self.ctx
        r = RoundInFlight(self.be, k, ctx.p, eng.mtp_cursor)
        if self.snapshot_before_draft(eng):
            r.lap("mark")
        r.drafts = self.d.draft(eng, ctx, k, eng.mtp_cursor if self.trusting else ctx.p)
        r.lap("draft")
        r.pos, r.tokens = self.verify_input(ctx, r.drafts, k)
        if self.snapshot_before_verify(eng):
            r.lap("mark")
        return r

    def end_round(self, r: "RoundInFlight", s, rows: list | None = None):
        """Steps 3-7 given the verify's Step s: accept, emit, finalise, sync, the next anchor.
        rows: the verify rows' argmax as ints, where the caller has read them already (a batch
        reads every sequence's in one copy)."""
        run_steps(self.end_round_steps(r, s, rows), self.eng)

    def end_round_steps(self, r: "RoundInFlight", s, rows: list | None = None):
        """end_round as a generator: it yields the model passes that the policy's
        finalise needs (Policy.finalise_steps) instead of running them, so that a
        batch can run every sequence's passes together, in one pass each."""
        be, eng, ctx, policy = self.be, self.eng, self.ctx, self.policy
        p, k, drafts, lap, mcur = r.p, r.k, r.drafts, r.lap, r.mcur
        if rows is None:
            rows = [int(x) for x in be.to_numpy(be.argmax(s.logits)).reshape(-1)]
        drafts = draft_tokens(drafts)       # read from the device after the same wait
        n_ok = 1 if ctx.a_p == drafts[0] else 0
        while n_ok >= 1 and n_ok < k and rows[n_ok - 1] == drafts[n_ok]:
            n_ok += 1
        if self.chooser is not None:
            self.chooser.observe(k, n_ok)
        consumed = drafts[:n_ok] if n_ok >= 1 else [ctx.a_p]
        self_token = rows[n_ok - 1] if n_ok >= 1 else None
        emitted = self.emitted(consumed, self_token)
        lap("bookkeeping")

        if type(policy).finalise is not Policy.finalise:    # it writes finalise itself
            fin = policy.finalise(eng, s, p, consumed, n_ok, k, lap)
        else:
            fin = yield from policy.finalise_steps(eng, s, p, consumed, n_ok, k, lap)
        if self.check_rows and fin.replayed_logits is not None and n_ok >= 1:
            self._check_rows(s, fin.hidden, fin.replayed_logits, n_ok)

        self.d.sync(eng, ctx, consumed, fin.hidden, rolled_back=fin.rolled_back,
                    trusting=self.trusting)
        lap("sync")

        adv = len(consumed)
        hid = fin.hidden
        self.stream.extend(emitted)
        h_prev = hid[adv - 2] if adv >= 2 else ctx.h_p
        # a_p': the argmax of the logits at p' (a verify row's: already read)
        if fin.verify_row is not None:
            a_p = rows[fin.verify_row]
        else:
            a_p = int(be.argmax(fin.logits))
        self.ctx = RoundCtx(p=p + adv, t_p=consumed[-1], h_p=hid[adv - 1],
                            h_prev=h_prev, a_p=a_p, emitted=len(self.stream), P=ctx.P)
        self._check_invariant()
        lap("bookkeeping")
        self._record(r, n_ok, drafts, emitted, self_token, mcur)

    def _record(self, r: "RoundInFlight", n_ok: int, drafts, emitted, self_token, mcur):
        """The round's RoundRecord, each phase timed between its events."""
        be, ms = self.be, {}
        for name, a, b in zip(r.names, r.ev[:-1], r.ev[1:]):
            ms[name] = ms.get(name, 0.0) + be.elapsed_ms(a, b)
        req = self.d.schedule.requested[-1] if hasattr(self.d, "schedule") else None
        self.records.append(RoundRecord(i=len(self.records), p=r.p, k=r.k, drafts=list(drafts),
                                        n_ok=n_ok, emitted=emitted, self_token=self_token,
                                        mtp_cursor=mcur, ms=ms, requested=req))
        if self.on_round is not None:
            self.on_round(self.records[-1])

    def _plain_round(self):
        """A round that drafts nothing (k = 0): one plain step consumes a_p at p+1; the drafter
        holds the MTP row it leaves for its next chain. Timed as 'replay' (the step) and
        'bookkeeping' (the argmax of a_p')."""
        be, eng, ctx = self.be, self.eng, self.ctx
        mcur = eng.mtp_cursor
        a = be.now()
        t = ctx.a_p
        s = eng.step(ctx.p + 1, t)
        b = be.now()
        if self.chooser.can_pay:        # else no round will draft again: the MTP slot is left as it is
            self.d.skip(eng, ctx, t)
        a_p = int(be.argmax(s.logits))
        c = be.now()
        self.stream.append(t)
        self.ctx = RoundCtx(p=ctx.p + 1, t_p=t, h_p=s.hidden, h_prev=ctx.h_p, a_p=a_p, emitted=len(self.stream),
                            P=ctx.P)
        self._check_invariant()
        self.records.append(RoundRecord(i=len(self.records), p=ctx.p, k=0, drafts=[], n_ok=0, emitted=[t],
                                        self_token=None, mtp_cursor=mcur,
                                        ms={"replay": be.elapsed_ms(a, b), "bookkeeping": be.elapsed_ms(b, c)}))
        if self.on_round is not None:
            self.on_round(self.records[-1])

    def _plain_tail(self, left, reason: str | None = None):
        be, eng = self.be, self.eng
        self.tail_reason = reason or (f"{left} left < k={self.k}: the strict batch needs M == mmax == {self.k}, "
                                      f"so the article's driver stops speculating")
        # as lean as greedy_timed's loop (the k='auto' run that cannot pay is timed against it)
        ctx, stream, step, argmax = self.ctx, self.stream, eng.step, be.argmax
        p, h_p, h_prev, a_p, t = ctx.p, ctx.h_p, ctx.h_prev, ctx.a_p, ctx.t_p
        a = be.now()
        for _ in range(left):
            t = a_p
            stream.append(t)
            p += 1
            s = step(p, t)
            h_prev, h_p = h_p, s.hidden
            a_p = int(argmax(s.logits))
        b = be.now()
        self.ctx = RoundCtx(p=p, t_p=t, h_p=h_p, h_prev=h_prev, a_p=a_p, emitted=len(stream), P=ctx.P)
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
        held = self.d.pending_rows      # confirmed rows the drafter's next chain writes first
        never_drafts = self.chooser is not None and not self.chooser.can_pay
        if not self.trusting and not never_drafts and eng.mtp_cursor + held != ctx.p:
            raise InvariantError(f"round {len(self.records)}: MTP cursor {eng.mtp_cursor} + {held} rows the drafter "
                                 f"holds != p = {ctx.p}")

    def _check_rows(self, s, hid, lgs, n_ok):
        be = self.be
        for j in range(n_ok):
            same_h = np.array_equal(be.to_numpy(hid[j]), be.to_numpy(s.hidden[j]))
            same_l = np.array_equal(be.to_numpy(lgs[j]), be.to_numpy(s.logits[j]))
            if not (same_h and same_l):
                raise InvariantError(f"round {len(self.records)}: replayed row {j} differs from verify row {j} "
                                     f"(hidden equal={same_h}, logits equal={same_l}): batch invariance broken")
