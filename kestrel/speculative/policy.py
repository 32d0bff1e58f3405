"""Policies: how a round undoes the rejected part of its verify. One object per policy carries its
engine batch mode, its verify, its finalise step and its cost formula; the round and the cost
model both dispatch through it, so a new policy is one new class here (plus its engine support).

  replay       the article's wall. Strict batch (M == mmax). mark(); step_m(p+1, drafts); on a
               partial accept rollback() and replay the accepted rows with M=1 steps.
  flex-replay  as replay, but the accepted rows are replayed in one step_m (flex batch).
  checkpoint   verify_checkpointed(p+1, drafts) writes a GDN state slot per row; finalise is
               select_checkpoint(n_ok): no copy, no replay.
  input-cache  verify_cached(p+1, drafts) only reads the GDN state and keeps each row's GDN
               inputs (kilobytes a row); finalise is fold_cached(n_ok), which runs the accepted
               rows' inputs into the live state in place: no copy of the state, no model replay.
n_ok == 0 emits a_p = argmax(logits_p): every policy then consumes it with one M=1 step.
The undo step (rollback, select_checkpoint or the fold) is timed as the phase "undo".

Each policy also accounts for the recurrent-state bytes it moves (state_traffic): from the
config alone, what a round of k drafts accepting n reads and writes of the GDN state S, the conv
window and the cached inputs, and the memory it holds beside the live state.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import SpecArgumentError
from .schedule import advance


@dataclass
class Finalised:
    """What a round has after its finalise step: the verified hiddens of the consumed rows
    ([adv, D]), the logits of the last one, and for replay policies the replayed rows (so that
    check_rows can compare them with the verify's). verify_row: which row of the verify `logits`
    is, when it is one (the driver then reuses that row's argmax instead of computing it again);
    None when the logits come from another call (a replayed or an extra step)."""
    hidden: object
    logits: object
    rolled_back: bool = False
    replayed_logits: list | None = None
    verify_row: int | None = None


class Policy:
    name: str = ""
    batch: str = "flex"          # the engine batch mode the policy needs
    uses_mark: bool = False      # verify after mark(), undo by rollback()
    doc: str = ""

    # ---- the round ---------------------------------------------------------------------------
    def snapshot(self, eng, include_mtp_cursor: bool) -> bool:
        """Before the verify: take what finalise will need to undo it. True if it did anything."""
        return False

    def verify(self, eng, pos: int, drafts):
        """Verify the drafts (a list of ints, or a DraftFeed still on the device) at pos."""
        raise NotImplementedError

    def finalise(self, eng, s, p: int, consumed: list, n_ok: int, k: int, lap) -> Finalised:
        """Leave the engine having consumed exactly `consumed` after position p. s: the verify's
        Step; lap(phase) closes a timed phase ('undo', 'replay'). Runs finalise_steps, each
        model pass it asks for made on `eng` at once."""
        return run_steps(self.finalise_steps(eng, s, p, consumed, n_ok, k, lap), eng)

    def finalise_steps(self, eng, s, p: int, consumed: list, n_ok: int, k: int, lap):
        """finalise as a generator: every model pass it needs (a replay, the step of a round that
        accepts nothing) is yielded as a request, ("step", pos, token) for one row (its Step is
        hidden [D], logits [V], as Engine.step's) or ("step_m", pos, tokens), and the Step is
        sent back; it returns the Finalised. A batch of sequences (speculative/batched.py) runs
        every sequence's requests of one turn in one pass; alone, run_steps makes each at once."""
        raise NotImplementedError

    # ---- the cost model ------------------------------------------------------------------------
    def cost(self, u, k: int, n: int) -> dict:
        """Predicted ms of the phases this policy owns (mark, verify, rollback, replay) for one
        round of k drafts that accepts n, from UnitCosts u."""
        raise NotImplementedError

    def priced_by(self, u) -> bool:
        """Whether UnitCosts u measured every call this policy's cost formula uses."""
        return True

    def logits_are_a_verify_row(self, k: int, n: int) -> bool:
        """Whether finalise, for k drafts accepting n, returns a verify row's logits (its
        Finalised.verify_row set), so the round needs no second argmax for a_p'. A policy that
        does not say: False (the cost model prices the argmax)."""
        return False

    def state_traffic(self, cfg, k: int, n: int) -> dict:
        """Bytes of recurrent state one round reads and writes (GDN S + conv window, and cached
        inputs), and the bytes it keeps beside the live state, for k drafts accepting n."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def parse(x) -> "Policy":
        if isinstance(x, Policy):
            return x
        if isinstance(x, str) and x in POLICIES:
            return POLICIES[x]
        raise SpecArgumentError(f"unknown policy {x!r}; known: {tuple(POLICIES)}")


def run_steps(steps, eng):
    """Drive a finalise_steps generator on one Engine: each request made now -> its return value."""
    try:
        req = next(steps)
        while True:
            kind, pos, tokens = req
            req = steps.send(eng.step(pos, tokens) if kind == "step" else eng.step_m(pos, tokens))
    except StopIteration as done:
        return done.value


def _accepted_rows(s, p, consumed, n_ok, lap):
    """After an undo that kept the verify's first n_ok rows: those rows, or, with n_ok == 0,
    the one M=1 step that consumes a_p (a generator, as finalise_steps)."""
    if n_ok >= 1:
        return Finalised(s.hidden[:n_ok], s.logits[n_ok - 1], verify_row=n_ok - 1)
    s1 = yield ("step", p + 1, consumed[0])
    lap("replay")
    return Finalised(s1.hidden.reshape(1, -1), s1.logits)


def _keep(s, k) -> Finalised:
    return Finalised(s.hidden[:k], s.logits[k - 1], verify_row=k - 1)


class _MarkRollback(Policy):
    """mark(); verify; on a partial accept rollback() and replay what was accepted."""
    uses_mark = True

    def snapshot(self, eng, include_mtp_cursor):
        eng.mark(include_mtp_cursor=include_mtp_cursor)
        return True

    def verify(self, eng, pos, drafts):
        return eng.step_m(pos, drafts)

    def finalise_steps(self, eng, s, p, consumed, n_ok, k, lap):
        if n_ok == k:
            return _keep(s, k)
        eng.rollback()
        lap("undo")
        hid, lg, lgs = yield from self.replay(eng.model.be.xp, p, consumed, n_ok)
        lap("replay")
        return Finalised(hid, lg, rolled_back=True, replayed_logits=lgs)

    def replay(self, xp, p, consumed, n_ok):
        """Consume `consumed` again after the rollback (a generator of step requests): -> (hiddens,
        last logits, each row's logits)."""
        outs = []
        for j, t in enumerate(consumed):                                          # M=1, row by row
            outs.append((yield ("step", p + 1 + j, t)))
        return xp.stack([o.hidden for o in outs]), outs[-1].logits, [o.logits for o in outs]

    def logits_are_a_verify_row(self, k, n):
        return n == k                   # all accepted: no rollback, the verify's rows are kept

    def cost(self, u, k, n):
        c = {"mark": u.mark, "verify": u.get("step_m", k)}
        if n < k:
            c["undo"] = u.rollback
            c["replay"] = self.replay_cost(u, n)
        return c

    def replay_cost(self, u, n):
        return advance(n) * u.step

    def state_traffic(self, cfg, k, n):
        s = recurrent_bytes(cfg)
        t = _rw(s, s)                                   # the verify updates the live state in place
        t = _add(t, _rw(s, s))                          # mark: copy it
        if n < k:
            t = _add(t, _rw(s, s))                      # rollback: copy it back
            t = _add(t, self.replay_traffic(s, n))
        return dict(t, kept=s)

    def replay_traffic(self, s, n):
        return _rw(advance(n) * s, advance(n) * s)      # each M=1 step reads and writes the state


class ReplayPolicy(_MarkRollback):
    name, batch = "replay", "strict"
    doc = "the article's wall: strict batch (M == mmax), rollback + M=1 replay row by row"


class FlexReplayPolicy(_MarkRollback):
    name, batch = "flex-replay", "flex"
    doc = "rollback + one batched replay of the n_ok accepted rows (flex batch)"

    def replay(self, xp, p, consumed, n_ok):
        if n_ok == 0:
            return (yield from super().replay(xp, p, consumed, n_ok))
        s2 = yield ("step_m", p + 1, consumed)                                    # one batch of n_ok rows
        return s2.hidden, s2.logits[n_ok - 1], [s2.logits[j] for j in range(n_ok)]

    def replay_cost(self, u, n):
        return u.step if n == 0 else u.get("step_m", n)

    def replay_traffic(self, s, n):
        return _rw(s, s)                                # one call, whatever n


class CheckpointPolicy(Policy):
    name, batch = "checkpoint", "flex"
    doc = "per-row GDN checkpoints written by the verify; select slot n_ok: no copy, no replay"

    def verify(self, eng, pos, drafts):
        return eng.verify_checkpointed(pos, drafts)

    def finalise_steps(self, eng, s, p, consumed, n_ok, k, lap):
        eng.select_checkpoint(n_ok)          # slot n_ok (0: the untouched original)
        lap("undo")
        return (yield from _accepted_rows(s, p, consumed, n_ok, lap))

    def logits_are_a_verify_row(self, k, n):
        return n >= 1                   # n = 0 takes one more step for a_p

    def cost(self, u, k, n):
        c = {"verify": u.get("ckpt", k), "undo": u.select}
        if n == 0:
            c["replay"] = u.step
        return c

    def state_traffic(self, cfg, k, n):
        s = recurrent_bytes(cfg)
        t = _rw(s, k * s)                               # read the live slot, write one slot per row
        if n == 0:
            t = _add(t, _rw(s, s))
        return dict(t, kept=k * s)


class InputCachePolicy(Policy):
    name, batch = "input-cache", "flex"
    doc = ("the verify keeps each row's GDN inputs and only reads the state; accepting n_ok folds "
           "those rows into the live state in place: no state copy, no model replay")

    def verify(self, eng, pos, drafts):
        return eng.verify_cached(pos, drafts)

    def finalise_steps(self, eng, s, p, consumed, n_ok, k, lap):
        eng.fold_cached(n_ok)                       # n_ok == 0: nothing to fold
        lap("undo")
        return (yield from _accepted_rows(s, p, consumed, n_ok, lap))

    def priced_by(self, u):
        return bool(u.cached) and bool(u.fold)

    def logits_are_a_verify_row(self, k, n):
        return n >= 1                   # n = 0 takes one more step for a_p

    def cost(self, u, k, n):
        c = {"verify": u.get("cached", k), "undo": u.get("fold", n)}
        if n == 0:
            c["replay"] = u.step
        return c

    def state_traffic(self, cfg, k, n):
        s, x = recurrent_bytes(cfg), cached_row_bytes(cfg)
        t = _rw(s, k * x)                               # read the live state, keep k rows of inputs
        t = _add(t, _rw(s + n * x, s) if n else _rw(s, s))   # the fold, or the n_ok == 0 step
        return dict(t, kept=k * x)


def recurrent_bytes(cfg) -> int:
    """fp32 GDN state S and conv window of every GDN layer: what one plain step reads and writes."""
    return cfg.gdn_state_bytes + cfg.conv_state_bytes


def cached_row_bytes(cfg) -> int:
    """One row of cached GDN inputs across all GDN layers: the in-projection's output
    [qkv | z | b | a] in fp32 (kestrel.state.DeviceState.gdn_in)."""
    return len(cfg.gdn_layers) * cfg.gdn_in_width * 4


def _rw(read: int, written: int) -> dict:
    return {"read": int(read), "written": int(written)}


def _add(a: dict, b: dict) -> dict:
    return {"read": a["read"] + b["read"], "written": a["written"] + b["written"]}


REPLAY, FLEX_REPLAY, CHECKPOINT, INPUT_CACHE = ReplayPolicy(), FlexReplayPolicy(), CheckpointPolicy(), InputCachePolicy()
POLICIES = {p.name: p for p in (REPLAY, FLEX_REPLAY, CHECKPOINT, INPUT_CACHE)}
