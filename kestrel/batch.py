"""Many sequences at once: B slots, one pass of the main model over every slot's rows.

    be = kestrel.BatchEngine(model, slots=4, max_seq=256, mmax=4)
    a, sa = be.join(prompt_a)                       # prefill into a free slot -> (slot, Step)
    b, sb = be.join(prompt_b)
    out = be.forward({a: ("step", be.cursor(a), [ta]),               # one pass, rows of both
                      b: ("verify_checkpointed", be.cursor(b), [t, d1, d2])})
    be.select_checkpoint({b: n_ok})                 # each slot's own accepted count
    be.leave(a)                                     # the slot is free for the next join

Each slot is a whole single-sequence Engine (kestrel/engine.py): its own GDN state ring, conv
window, KV cache of its own length, MTP slot, cursors, snapshot and pending verify. `forward`
takes rows for any subset of the slots, each at its own position, and each as a plain call
("step": M rows in place, as Engine.step_m), a checkpointed verify or a cached verify; the
model runs them as one pass (Model.forward_batch): the projections read each weight once for
all the rows, the GDN and attention layers run each slot's rows on that slot's state.
`select_checkpoint` and `fold_cached` take one n per slot; `mtp_draft` runs every slot's draft
chain in lockstep, row j of all of them in one pass of the MTP head. Everything else a slot does
on its own (mark, rollback, mtp_step, mtp_fill, mtp_truncate) is its Engine's: `be.slot(i)`.

Bits. Every op either works row by row (embedding, norms, SwiGLU, residual adds, and the
projections, which compute each row on its own: kestrel/ops/linear.py) or on one slot's rows
and state alone (GDN, attention), so a slot's rows are bit-identical to the same call made on
a single-sequence Engine, whatever else shares the pass. tests/test_batch.py checks it on mixed
batches (joins, leaves, every undo strategy, k = 1..4) against each sequence decoded alone.

Input. Every call is checked for every slot before any slot's state is touched: a bad row
count, position, token or n for one slot raises a named error and leaves every slot
bit-identical. A slot that is not in use (never joined, or left) raises SlotError, as does a
join when every slot is in use.

Backends: the CPU runs the pass as above. The CUDA backend lowers each pass into one plan
(kestrel/cuda/lower.py lower_batch): every row-wise op is one launch over all the rows, and every
op with state is one launch whose segment table (kernels/common.cuh) hands each slot's blocks
that slot's rows, state, mode and position; a plan is made for bounds on the rows (the batch's
`room`: its slots and widest call) and rewritten tables serve every mix within them
(kestrel/cuda/segments.py), replayed as a CUDA graph. The folds of a fold_cached call are one
such pass too. A plan is made (lowered, then captured) at its first two uses; `prepare` makes
every plan a batch can need up front, as a server captures its graphs before it takes traffic,
so that no timed pass pays for one.
"""
from __future__ import annotations

import numpy as np

from . import inputs
from .engine import Engine, Step
from .memory import ensure_fits
from .state import DeviceState
from .errors import DeviceError, KestrelError, SlotError
from .model import Model

MAX_SLOTS = 4096
KINDS = {"step": ("in_place", None), "verify_checkpointed": ("checkpoint", "checkpointed"),
         "verify_cached": ("cache", "cached")}


class BatchEngine:
    def __init__(self, model: Model, slots: int, max_seq: int = 512, mmax: int = 3, batch: str = "flex"):
        if not isinstance(model, Model):
            raise KestrelError(f"BatchEngine needs a kestrel Model (from kestrel.load), got {type(model).__name__}")
        if not hasattr(model.be, "run_batch"):
            raise DeviceError(f"BatchEngine: the {model.be.name} backend has no batched pass yet (the CPU has one)")
        n = inputs.count(slots, "slots", 1, MAX_SLOTS)
        self.model = model
        first = Engine(model, max_seq=max_seq, mmax=mmax, batch=batch)   # checks the arguments and one slot
        # the other slots, all at once: refused whole rather than out of memory after some of them
        ensure_fits((n - 1) * DeviceState.bytes_needed(model.cfg, first.max_seq, first.nslots, model.has_mtp),
                    f"a BatchEngine of {n} slots of {model.cfg.name} (max_seq={first.max_seq}, mmax={first.mmax})",
                    model.be.name)
        self._engines = [first] + [Engine(model, max_seq=max_seq, mmax=mmax, batch=batch) for _ in range(n - 1)]
        self._live: set = set()

    # ---- slots -----------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return len(self._engines)

    @property
    def room(self) -> tuple:
        """(slots, the widest call's rows): what every pass of this batch fits in. The CUDA
        backend plans each pass for it, so a batch whose sequences finish one by one, or whose
        draft chains start with different fill rows, reuses its plans instead of making new ones."""
        return len(self._engines), self._engines[0].mmax + 1

    @property
    def active(self) -> list:
        """The slots in use, in order."""
        return sorted(self._live)

    def _slot(self, slot, what: str) -> int:
        if not inputs.is_int(slot):
            raise SlotError(f"{what}: a slot is an int, got {slot!r:.40} ({type(slot).__name__})")
        s = int(slot)
        if not 0 <= s < len(self._engines):
            raise SlotError(f"{what}: slot {s} does not exist (slots 0..{len(self._engines) - 1})")
        if s not in self._live:
            raise SlotError(f"{what}: slot {s} is not in use (never joined, or left)")
        return s

    def slot(self, slot) -> Engine:
        """Slot `slot`'s Engine, for what a slot does on its own (mark, rollback, the MTP entries)."""
        return self._engines[self._slot(slot, "slot")]

    def cursor(self, slot) -> int:
        return self.slot(slot).cursor

    def join(self, prompt) -> tuple:
        """Prefill `prompt` into the lowest free slot -> (slot, Step of every prompt row)."""
        free = next((i for i in range(len(self._engines)) if i not in self._live), None)
        if free is None:
            raise SlotError(f"join: all {len(self._engines)} slots are in use; leave() one first")
        eng = self._engines[free]
        step = eng.prefill(prompt)          # checks the prompt first; a freed slot is already reset
        self._live.add(free)
        return free, step

    def leave(self, slot):
        """Free `slot`: its state is cleared and it cannot be addressed until a join takes it."""
        s = self._slot(slot, "leave")
        self._engines[s].reset()
        self._live.discard(s)

    def prepare(self, kinds=("step",), drafts: bool = False) -> int:
        """Make now every plan this batch's passes can need, so that no later pass pays for one:
        the main model's for each kind of call in `kinds` (a list of KINDS names; one batch of
        one policy: its verify's kind alone), the MTP head's (drafts) and the fold's (when
        "verify_cached" is among them), at every row count the room admits. A backend that
        makes no plans (the CPU) has nothing to do. Touches no slot's state. -> plans made."""
        if isinstance(kinds, str) or not kinds or any(k not in KINDS for k in kinds):
            raise KestrelError(f"prepare: kinds is a non-empty list of {tuple(KINDS)}, got {kinds!r:.60}")
        make = getattr(self.model.be, "prepare_batch", None)
        if make is None:
            return 0
        modes = frozenset(KINDS[k][0] for k in kinds)
        return make(self.model, self._engines[0].state, self.room, [modes], bool(drafts), "verify_cached" in kinds)

    # ---- one pass over many slots -------------------------------------------------------------
    def forward(self, calls: dict) -> dict:
        """calls: {slot: (kind, pos, tokens)}, kind "step" | "verify_checkpointed" |
        "verify_cached", pos the slot's cursor, 1 <= len(tokens) <= mmax (strict: == mmax, but a
        "step" of one token is taken on any engine, as Engine.step takes it).
        One pass of the main model -> {slot: Step(hidden [M, D], logits [M, V])}."""
        if not isinstance(calls, dict) or not calls:
            raise KestrelError(f"forward: takes a non-empty dict {{slot: (kind, pos, tokens)}}, got {calls!r:.60}")
        plan = []
        for s, call in sorted((self._slot(slot, "forward"), call) for slot, call in calls.items()):
            if not (isinstance(call, tuple) and len(call) == 3 and call[0] in KINDS):
                raise KestrelError(f"forward: slot {s} takes (kind, pos, tokens) with kind one of {tuple(KINDS)}, "
                                   f"got {call!r:.60}")
            kind, pos, tokens = call
            eng = self._engines[s]
            what = f"forward (slot {s}, {kind})"
            if kind == "step" and isinstance(tokens, (list, tuple)) and len(tokens) == 1:
                pos, toks = eng._one_row(pos, tokens, what)          # as Engine.step: any batch mode
            else:
                pos, toks = eng._batch(pos, tokens, what)             # no state touched
            plan.append((s, kind, pos, toks))
        outs = self.model.forward_batch([(self._engines[s].state, toks, pos, KINDS[kind][0])
                                         for s, kind, pos, toks in plan], self.room)
        result = {}
        for (s, kind, pos, toks), (h, lg) in zip(plan, outs):
            eng = self._engines[s]
            pending = KINDS[kind][1]
            if pending:
                eng.pending = (pending, pos, len(toks))
            eng._advance(len(toks))
            result[s] = Step(h, lg)
        return result

    def mtp_draft(self, calls: dict) -> dict:
        """calls: {slot: (pos, token, hidden, k)} or (pos, token, hidden, k, forced, fill_tokens,
        fill_hidden), as Engine.mtp_draft takes them: every slot's draft chain at once, row j of
        every chain in one pass of the MTP head -> {slot: Draft}, each bit-identical to the
        slot's Engine.mtp_draft alone."""
        if not isinstance(calls, dict) or not calls:
            raise KestrelError(f"mtp_draft: takes a non-empty dict {{slot: (pos, token, hidden, k)}}, got {calls!r:.60}")
        plan = []
        for s, call in sorted((self._slot(slot, "mtp_draft"), call) for slot, call in calls.items()):
            if not (isinstance(call, tuple) and len(call) in (4, 7)):
                raise KestrelError(f"mtp_draft: slot {s} takes (pos, token, hidden, k[, forced, fill_tokens, "
                                   f"fill_hidden]), got {call!r:.60}")
            plan.append((s, self._engines[s]._mtp_draft_args(*call, *((None,) * (7 - len(call))))))
        drafts = {}
        for s, args in plan:                    # every slot checked: now the cursors move
            pos, _, _, k, _, fill = args
            drafts[s] = (args, self._engines[s]._drafted(pos, k, fill, np.zeros(k, np.int64), None))
        self.run_drafts(drafts)
        return {s: d for s, (_, d) in drafts.items()}

    def run_drafts(self, pending: dict):
        """Run draft chains already checked and recorded: {slot: (Engine._mtp_draft_args' tuple,
        the Draft to fill)}, all in lockstep (Model.mtp_draft_batch)."""
        order = sorted(pending)
        chains = []
        for s in order:
            pos, tok, hid, k, forced, fill = pending[s][0]
            chains.append((self._engines[s].state, tok, hid, pos, k, forced, fill))
        for s, (toks, hs) in zip(order, self.model.mtp_draft_batch(chains, self.room)):
            pending[s][1]._fill(toks, hs)

    def _accepts(self, ns: dict, kind: str, what: str) -> dict:
        """{slot: n} checked for every slot before any state changes -> {slot: Engine._accept's (pos, m, n)}."""
        if not isinstance(ns, dict) or not ns:
            raise KestrelError(f"{what}: takes a non-empty dict {{slot: n}}, got {ns!r:.60}")
        checked = {}
        for slot, n in ns.items():
            s = self._slot(slot, what)
            checked[s] = self._engines[s]._accept(kind, n, f"{what} (slot {s})")   # no state touched
        return checked

    def select_checkpoint(self, ns: dict):
        """{slot: n}: each slot keeps the first n rows of its pending checkpointed verify."""
        for s, (_, _, n) in self._accepts(ns, "checkpointed", "select_checkpoint").items():
            self._engines[s].select_checkpoint(n)

    def fold_cached(self, ns: dict):
        """{slot: n}: each slot folds the first n rows of its pending cached verify, every slot's
        rows in one pass (Model.fold_batch), each slot's state as its Engine.fold_cached leaves it."""
        acc = self._accepts(ns, "cached", "fold_cached")
        self.fold_states([(n, self._engines[s].state) for s, (_, _, n) in sorted(acc.items()) if n])
        for s, (pos, _, n) in acc.items():
            self._engines[s]._folded(pos, n)

    def fold_states(self, folds: list):
        """[(n, DeviceState)]: run those folds now, in one pass (the batched driver defers each
        sequence's fold to here, after every sequence has ended its round)."""
        if folds:
            self.model.fold_batch(folds, self.room)

    def snapshot_state(self) -> dict:
        """slot -> that slot's Engine.snapshot_state(), every slot (tests compare them bit for bit)."""
        return {i: e.snapshot_state() for i, e in enumerate(self._engines)} | {"live": self.active}

    def __repr__(self):
        return (f"BatchEngine({self.model.cfg.name}, backend={self.model.be.name}, slots={self.slots}, "
                f"active={self.active})")
