"""Many sequences decoded at once on a BatchEngine (kestrel/batch.py): greedy, and speculative
rounds whose verifies share one pass.

    g = batch_greedy(model, prompts, T=64, slots=16)
    r = batch_spec(model, prompts, T=64, k=3, policy="checkpoint", drafter="mtp", slots=16,
                   references=g.streams)
    r.bit_exact, r.tokens_per_s, r.passes

Each sequence is an ordinary SpecRun (kestrel/speculative/round.py) on its slot's Engine: the
same protocol, drafter and policy, so its stream is its own greedy stream. What the batch
changes is where the verify runs: every running sequence begins its round (draft, snapshot),
the policy's verify is recorded instead of run, and the verifies of all of them go through one
BatchEngine.forward, whose projections read each weight once for every sequence's rows. Then
each sequence ends its round (accept, emit, undo, sync). Sequences wait in a queue and join a
free slot when one leaves (continuous batching in its simplest form).

The draft chains are batched too: each sequence's drafter records its chain (a _DeferredDrafts
stands in for its engine), and the batch runs every chain in lockstep, row j of all of them in
one pass of the MTP head (BatchEngine.run_drafts), before the shared verify. So are the model
passes a round's undo needs: the replay policies' re-run of accepted rows after a rollback and
the one step that consumes a_p when nothing was accepted (only the article's pairing has such
rounds). Each sequence's end of round is a generator (SpecRun.end_round_steps) that yields
those passes, and the batch runs the passes every sequence asks for in one turn as one pass
(run_together): the strict replay's M = 1 rows one turn a row, as the article replays them.
The input cache's folds are shared: each sequence books its fold when it ends its round, and
the batch runs them all in one pass (BatchEngine.fold_states) before the next round reads any
state. Still per slot: the rows mtp_fill writes and a strict policy's plain tail. Per-round
times in a sequence's records include the other sequences' work in the shared
pass; the batch's own clock (BatchResult.ms) is the one to read.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import inputs
from ..batch import BatchEngine
from ..engine import Step
from ..model import Model
from .baseline import check_length, check_tokens
from .driver import validate_run
from .errors import SpecArgumentError
from .policy import Policy
from .records import SpecResult
from .round import SpecRun


@dataclass
class BatchResult:
    """A batched run: each sequence's stream (in the order of the prompts) and, for speculative
    runs, its SpecResult; the batch's time and passes."""
    kind: str                       # "greedy" or the policy's name
    slots: int
    T: int
    streams: list
    ms: float                       # decode time of the whole batch (after the first joins' prefills)
    passes: int                     # BatchEngine.forward calls
    runs: list = field(default_factory=list)       # SpecResult per sequence (speculative)
    references: list | None = None

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.streams)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.ms / 1e3) if self.ms > 0 else float("nan")

    @property
    def ms_per_token(self) -> float:
        """Time per output token of one sequence: the batch's time over tokens per sequence."""
        return self.ms / self.T

    @property
    def bit_exact(self) -> bool | None:
        if self.references is None:
            return None
        return all(list(s) == list(r) for s, r in zip(self.streams, self.references))


def _prompts(model, prompts) -> list:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise SpecArgumentError(f"prompts takes a non-empty list of token lists, got {prompts!r:.60}")
    return [check_tokens(p, model, f"prompts[{i}]") for i, p in enumerate(prompts)]


def _slots(slots, n: int) -> int:
    return n if slots is None else inputs.count(slots, "slots", 1, n, "the number of prompts")


def _argmax_read(be, logits: list) -> np.ndarray:
    """Every row's argmax of several sequences' logits, in order: one argmax and one read to the
    host for the whole batch, not one a sequence."""
    return be.to_numpy(be.argmax(be.xp.concatenate(logits))).reshape(-1)


def batch_greedy(model: Model, prompts, T: int, slots: int | None = None, engine: BatchEngine | None = None) -> BatchResult:
    """Greedy decoding of T tokens after each prompt, `slots` sequences at a time, one pass a
    token for all of them (a sequence joins when one leaves)."""
    if not isinstance(model, Model):
        raise SpecArgumentError(f"model takes a kestrel Model (from kestrel.load), got {type(model).__name__}")
    prompts = _prompts(model, prompts)
    T = max(check_length(T, model, len(p)) for p in prompts)
    B = _slots(slots, len(prompts))
    need = max(len(p) for p in prompts) + T + 1
    be = engine if engine is not None else BatchEngine(model, slots=B, max_seq=need, mmax=1)
    streams = [[] for _ in prompts]
    queue, running, passes = list(range(len(prompts))), {}, 0
    clock = model.be
    t0 = None
    while queue or running:
        while queue and len(be.active) < be.slots:
            i = queue.pop(0)
            slot, st = be.join(prompts[i])
            running[slot] = (i, int(clock.argmax(st.logits[-1])))
        if t0 is None:
            t0 = clock.now()
        calls = {}
        for slot, (i, t) in running.items():
            streams[i].append(t)
            calls[slot] = ("step", be.cursor(slot), [t])
        done = [slot for slot, (i, _) in running.items() if len(streams[i]) >= T]
        for slot in done:                     # its last token needs no step
            del calls[slot], running[slot]
            be.leave(slot)
        if calls:
            out = be.forward(calls)
            passes += 1
            order = list(out)
            nxt = _argmax_read(clock, [out[s].logits[:1] for s in order])
            for slot, t in zip(order, nxt):
                running[slot] = (running[slot][0], int(t))
    ms = clock.elapsed_ms(t0, clock.now())
    return BatchResult("greedy", be.slots, T, streams, ms, passes)


def run_together(be: BatchEngine, steps: dict) -> int:
    """Drive several sequences' end_round_steps (or finalise_steps) generators, {slot: generator},
    in lockstep: each turn, the model passes every sequence asks for (a replay's rows, the step
    of a round that accepted nothing) run as one BatchEngine.forward, and each gets its own
    Step back, bit-identical to the call made alone. -> the passes run."""
    def advance(slot, sent=None):
        try:
            asks[slot] = steps[slot].send(sent)
        except StopIteration:
            pass
    asks, passes = {}, 0
    for slot in steps:
        advance(slot)
    while asks:
        turn, asks = asks, {}
        out = be.forward({slot: ("step", pos, [int(t)] if kind == "step" else list(t))
                          for slot, (kind, pos, t) in turn.items()})
        passes += 1
        for slot, (kind, _, _) in turn.items():
            s = out[slot]
            advance(slot, Step(s.hidden[0], s.logits[0]) if kind == "step" else s)
    return passes


class _DeferredDrafts:
    """Stands in for a slot's Engine in a sequence's SpecRun: mtp_draft is checked and recorded,
    and its Draft filled when the batch runs every sequence's chain together (so a drafter must
    not read its drafts before the verify; the protocol's drafters do not); everything else is
    the Engine's own."""

    def __init__(self, eng, folds: list):
        self._eng = eng
        self.recorded = None            # (the checked arguments, the Draft) of this round's chain
        self.folds = folds              # the batch's deferred folds: [(n, DeviceState)]

    def __getattr__(self, name):
        return getattr(self._eng, name)

    def mtp_draft(self, pos, token, hidden, k, forced=None, fill_tokens=None, fill_hidden=None):
        if self.recorded is not None:
            raise SpecArgumentError("a batched round drafts one chain per sequence")
        args = self._eng._mtp_draft_args(pos, token, hidden, k, forced, fill_tokens, fill_hidden)
        d = self._eng._drafted(args[0], args[3], args[5], np.zeros(args[3], np.int64), None)
        self.recorded = (args, d)
        return d

    def fold_cached(self, n):
        """Checked and booked now; the fold itself runs with every other sequence's, in one pass
        (BatchEngine.fold_states), once every sequence has ended its round: nothing reads this
        slot's GDN state before then (a round that accepts nothing folds nothing)."""
        pos, _, n = self._eng._accept("cached", n, "fold_cached")
        if n:
            self.folds.append((n, self._eng.state))
        self._eng._folded(pos, n)


def verify_kind(policy) -> str:
    """The BatchEngine.forward kind a policy's verify calls ("step", "verify_checkpointed" or
    "verify_cached"): what BatchEngine.prepare needs to know."""
    rec = _VerifyCall()
    Policy.parse(policy).verify(rec, 0, [0])
    return rec.call[0]


class _VerifyCall:
    """Stands in for an Engine in a policy's verify: records which entry the policy calls, at
    which position, with which tokens (the batch then runs it in its shared pass)."""

    def __init__(self):
        self.call = None

    def step_m(self, pos, tokens):
        self.call = ("step", pos, tokens)

    def verify_checkpointed(self, pos, tokens):
        self.call = ("verify_checkpointed", pos, tokens)

    def verify_cached(self, pos, tokens):
        self.call = ("verify_cached", pos, tokens)


def batch_spec(model: Model, prompts, T: int, k: int = 3, policy="checkpoint", drafter="mtp", *,
               slots: int | None = None, schedules=None, references=None, check: bool = True,
               engine: BatchEngine | None = None) -> BatchResult:
    """Speculative decoding of T tokens after each prompt with k drafts a round, `slots`
    sequences at a time, their verifies in one pass. policy, k and drafter: one for all, or a
    list with one per prompt (a mixed batch; flex policies only). schedules: one spec.Schedule
    per prompt for the replay drafter (each sequence its own acceptance), else None.
    references: each prompt's greedy stream (the replay drafter needs them; every stream is
    checked against them when given)."""
    prompts = _prompts(model, prompts)
    n = len(prompts)
    per = {}
    for name, v in (("schedules", schedules), ("references", references), ("policy", policy), ("k", k),
                    ("drafter", drafter)):
        one_each = name in ("schedules", "references")        # a Schedule is stateful: never shared
        if isinstance(v, (list, tuple)):
            if len(v) != n:
                raise SpecArgumentError(f"{name} takes one {'Schedule' if name == 'schedules' else 'value'} per "
                                        f"prompt ({n}){'' if one_each else ' or one for all'}, got {len(v)}")
            per[name] = list(v)
        elif one_each and v is not None:
            raise SpecArgumentError(f"{name} takes one {'Schedule' if name == 'schedules' else 'stream'} per prompt "
                                    f"({n}), got {v!r:.60}")
        else:
            per[name] = [v] * n
    args = [validate_run(model, p, T, per["k"][i], per["policy"][i], per["drafter"][i], schedule=per["schedules"][i],
                         reference=per["references"][i]) for i, p in enumerate(prompts)]
    if any(a.auto for a in args):
        # KChooser prices a round from one sequence's unit costs; in a batch a verify's rows share
        # a pass whose cost depends on every other sequence's rows, which those costs do not see
        raise SpecArgumentError("batch_spec takes an int k (one for all, or one per prompt): k='auto' chooses "
                                "each round's k from one sequence's unit costs, which do not price a shared pass")
    a0 = args[0]
    modes = {a.policy.batch for a in args}
    if "strict" in modes and len({(a.policy.name, a.k) for a in args}) > 1:
        raise SpecArgumentError("a strict policy (replay) takes M == mmax rows: its sequences cannot share a "
                                "batch with other policies or other k (use flex-replay)")
    B = _slots(slots, n)
    need = max(a.need for a in args)
    be = engine if engine is not None else BatchEngine(model, slots=B, max_seq=need, mmax=max(a.k for a in args),
                                                       batch=a0.policy.batch)
    clock = model.be
    queue, running, finished, passes, t0 = list(range(n)), {}, {}, 0, None
    folds = []
    while queue or running:
        while queue and len(be.active) < be.slots:
            i = queue.pop(0)
            a = args[i]
            a.drafter.bind(model, a.reference)
            a.drafter.reset()
            slot, st = be.join(a.prompt)
            run = SpecRun(model, _DeferredDrafts(be.slot(slot), folds), a.drafter, a.prompt, a.T, a.k, a.policy, a.tail,
                          check, False)
            running[slot] = (i, run.start(prefilled=st))
        if t0 is None:
            t0 = clock.now()
        rounds, calls = {}, {}
        for slot, (i, run) in running.items():
            left = run.T - len(run.stream)
            if left < run.k and run.tail == "plain":
                run._plain_tail(left)          # a strict policy finishes with plain steps (this slot alone)
                continue
            r = run.begin_round(min(run.k, left))
            rounds[slot] = r
        drafts = {}
        for slot in rounds:                     # every sequence's chain, row j of all in one pass
            eng = running[slot][1].eng
            if eng.recorded is not None:
                drafts[slot], eng.recorded = eng.recorded, None
        if drafts:
            be.run_drafts(drafts)
        for slot, r in rounds.items():
            run = running[slot][1]
            rec = _VerifyCall()
            run.policy.verify(rec, r.pos, r.tokens)
            calls[slot] = rec.call
        if calls:
            out = be.forward(calls)
            passes += 1
            order = list(rounds)
            ids = _argmax_read(clock, [out[s].logits for s in order])
            lo, ends = 0, {}
            for slot in order:
                r, m = rounds[slot], len(out[slot].logits)
                r.lap("verify")
                ends[slot] = running[slot][1].end_round_steps(r, out[slot], [int(x) for x in ids[lo:lo + m]])
                lo += m
            passes += run_together(be, ends)    # every sequence's replays and plain steps, a pass a turn
            be.fold_states(folds)               # the input-cache folds of every sequence, one pass
            folds.clear()
        for slot in [s for s, (_, run) in running.items() if len(run.stream) >= run.T]:
            i, run = running.pop(slot)
            finished[i] = run
            be.leave(slot)
    ms = clock.elapsed_ms(t0, clock.now())
    runs = []
    for i in range(n):
        run, a = finished[i], args[i]
        runs.append(SpecResult(model=model.cfg.name, device=getattr(clock, "device_name", clock.name), policy=a.policy,
                               drafter=a.drafter.describe(), pairing=a.drafter.pairing, k=a.k, T=a.T,
                               batch=a.policy.batch, tail_mode=a.tail, prompt=a.prompt, stream=run.stream[:a.T],
                               reference=a.reference, rounds=run.records, tail_tokens=run.tail_tokens,
                               tail_ms=run.tail_ms, tail_reason=run.tail_reason))
    kind = a0.policy.name if len({a.policy.name for a in args}) == 1 else "mixed"
    return BatchResult(kind, be.slots, T, [r.stream for r in runs], ms, passes, runs,
                       references=None if references is None else [list(x) for x in references])
