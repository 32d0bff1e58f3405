"""The engine: the device state of one sequence, its entries, and the three primitives.

State (a DeviceState, kestrel/state.py, that the engine owns and passes to the backend):
  GDN layers   S [n_gdn, nv, dk, dv] fp32 and hist [n_gdn, C, K-1] (conv window), held in a
               ring of mmax+1 slots; `slot` is the live one. Plain steps update it in place;
               a checkpointed verify writes row j's state into slot+1+j, and accepting n rows
               just moves `slot` (no copy, no replay).
  attention    KV cache [n_attn, max_seq, nkv, hd] + a cursor per layer (= visible length).
  MTP          its own KV cache [max_seq, nkv, hd] + its own cursor (an independent slot),
               written by mtp_step (rows and their drafts) or mtp_fill (rows only).

Cursor = positions consumed = the next position to consume. Entries must start exactly at
the cursor. Every entry validates all of its input before it touches state, so a call that
raises leaves the engine bit-identical.

Primitives:
  mark()            one-shot snapshot: copy live S/hist device-to-device, record every cursor.
  rollback()        copy S/hist back, restore cursors (zero copy), invalidate the snapshot.
  mtp_truncate(n)   set the MTP write cursor to n (no copy, no clearing); invalidates a snapshot.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import inputs
from .draft import Draft, DraftFeed
from .errors import BatchWidthError, CursorError, KestrelError, SnapshotError, TokenError
from .model import Model
from .state import DeviceState
from .ops.linear import ROWS

BATCH_MODES = ("strict", "flex")
_FINISH = {"checkpointed": "select_checkpoint", "cached": "fold_cached"}   # what ends a pending verify


@dataclass
class Step:
    hidden: object   # [D] for one row, [M, D] for a batch (after model.norm / mtp.norm)
    logits: object   # [V] or [M, V]


def _is_single(token) -> bool:
    """One token (an int or a 0-d array), as opposed to a list of them (the MTP entries' two forms)."""
    return inputs.is_int(token) or (isinstance(token, np.ndarray) and token.ndim == 0)


class Engine:
    def __init__(self, model: Model, max_seq: int = 512, mmax: int = 3, batch: str = "flex"):
        if not isinstance(model, Model):
            raise KestrelError(f"Engine needs a kestrel Model (from kestrel.load), got {type(model).__name__}")
        max_seq = inputs.count(max_seq, "max_seq", 1, model.cfg.max_position_embeddings,
                                "the model's max_position_embeddings")
        mmax = inputs.count(mmax, "mmax", 1, ROWS)
        if batch not in BATCH_MODES:
            raise KestrelError(f"batch must be one of {BATCH_MODES}, got {batch!r}")
        self.model, self.cfg, self.be = model, model.cfg, model.be
        self.max_seq, self.mmax, self.batch = int(max_seq), int(mmax), batch
        self.n_attn = len(self.cfg.attn_layers)
        self.nslots = self.mmax + 1
        self.state = DeviceState.allocate(self.cfg, self.be, self.max_seq, self.nslots, model.has_mtp)
        self.reset()

    # ---- cursors & bookkeeping -----------------------------------------------------------
    def reset(self):
        """Empty sequence: zero every buffer and cursor, drop snapshot and pending verify."""
        self.state.zero()
        self._cursor = 0                      # main-model cursor: positions consumed
        self.attn_len = [0] * self.n_attn     # per attention layer (== the cursor between calls)
        self._mtp_cursor = 0                  # MTP cursor: rows of its KV slot written
        self.snap = None                      # dict(cursor, attn_len, mtp_cursor) while a mark is live
        self.pending = None                   # (kind, pos, M) after verify_checkpointed / verify_cached

    @property
    def slot(self) -> int:
        """The live GDN slot of the ring."""
        return self.state.slot

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def mtp_cursor(self) -> int:
        return self._mtp_cursor

    @property
    def has_snapshot(self) -> bool:
        return self.snap is not None

    def state_bytes(self) -> dict:
        """Bytes each primitive moves: mark/rollback copy S+hist; cursors are free."""
        st = self.state
        return {"gdn_S": int(st.S[0].size * 4), "gdn_hist": int(st.hist[0].size * 4),
                "kv_per_token": self.cfg.kv_bytes_per_token(4)}

    def live_state(self):
        """(S, hist) views of the live slot."""
        return self.state.S[self.slot], self.state.hist[self.slot]

    def snapshot_state(self) -> dict:
        """A host copy of everything the engine holds (for bit-exact comparisons in tests)."""
        d = {k: self.be.to_numpy(a).copy() for k, a in self.state.buffers().items()}
        d.update(slot=self.slot, cursor=self._cursor, attn_len=list(self.attn_len), mtp_cursor=self._mtp_cursor,
                 snap=None if self.snap is None else dict(self.snap, attn_len=list(self.snap["attn_len"])),
                 pending=self.pending)
        return d

    # ---- validation (no state touched) ----------------------------------------------------
    def _tokens(self, tokens, what: str, feed: bool = False):
        """Token ids -> an int64 array. feed=True (the batch entries: step_m and the verifies) also
        takes a DraftFeed (kestrel/draft.py): its head is checked like any ids; its drafted tokens
        are trusted only when they are still the ones this engine's mtp_draft left on the device
        (argmax rows, in range by construction); a Draft built from a list is checked as a list."""
        if isinstance(tokens, DraftFeed):
            if not feed:
                raise TokenError(f"{what}: takes token ids, not a DraftFeed (only step_m and the verifies take one)")
            if len(tokens) == 0:
                raise TokenError(f"{what}: tokens must be a non-empty 1-D sequence of ints (an empty DraftFeed)")
            d = tokens.draft
            if d.device_tokens is None:                  # built from a list: all of it checked as ids
                inputs.token_ids(tokens.host(), self.cfg.vocab_size, what)
                return tokens
            if d.chained_by is not self:
                raise TokenError(f"{what}: this DraftFeed's draft was not made by this engine's mtp_draft")
            if tokens.head:
                inputs.token_ids(list(tokens.head), self.cfg.vocab_size, what)
            return tokens
        return inputs.token_ids(tokens, self.cfg.vocab_size, what)

    def _check_pos(self, pos, m: int, cursor: int, what: str, cursor_name: str = "cursor") -> int:
        """pos as a Python int once it is the cursor and its m rows fit in max_seq. Converted
        before any arithmetic: pos + m in a NumPy int8/uint8 would wrap past the bound."""
        if isinstance(pos, np.ndarray) and pos.ndim == 0 and pos.dtype.kind in "iu":
            pos = pos[()]
        if not inputs.is_int(pos):
            raise CursorError(f"{what}: position must be an int, got {pos!r:.40} ({type(pos).__name__})")
        pos = int(pos)
        if pos + m > self.max_seq:
            raise CursorError(f"{what}: positions {pos}..{pos + m - 1} exceed max_seq={self.max_seq}")
        if pos != cursor:
            hint = ("this position was already consumed (double consumption)" if pos < cursor
                    else "positions in between were never consumed (a skip)")
            raise CursorError(f"{what}: position {pos} is not contiguous with the {cursor_name} at {cursor}: {hint}")
        return pos

    def _check_width(self, m: int, what: str):
        if self.batch == "strict" and m != self.mmax:
            raise BatchWidthError(f"{what}: strict batch requires M == mmax == {self.mmax}, got M={m} "
                                  f"(the article's hard pre-check; use batch='flex' to allow 1 <= M <= mmax)")
        if not 1 <= m <= self.mmax:
            raise BatchWidthError(f"{what}: batch width M={m} outside [1, mmax={self.mmax}]")

    def _no_pending(self, what: str):
        if self.pending is not None:
            kind, pos, _ = self.pending
            raise SnapshotError(f"{what}: a {kind} verify at position {pos} is pending; call "
                                f"{_FINISH[kind]}(n) first")

    def _advance(self, m: int):
        self._cursor += m
        self.attn_len = [self._cursor] * self.n_attn

    # ---- entries ---------------------------------------------------------------------------
    def prefill(self, tokens) -> Step:
        """Consume the prompt at positions 0..P-1 (fresh engine). Step of every row: [P, D], [P, V]."""
        toks = self._tokens(tokens, "prefill")
        self._no_pending("prefill")
        if self._cursor != 0:
            raise CursorError(f"prefill: the engine has already consumed {self._cursor} positions; call reset() first")
        if len(toks) > self.max_seq:
            raise CursorError(f"prefill: prompt of {len(toks)} tokens exceeds max_seq={self.max_seq}")
        h, lg = self.model.forward(toks, 0, self.state)
        self._advance(len(toks))
        return Step(h, lg)

    def step(self, pos, token) -> Step:
        """M=1: consume `token` at position `pos` (== cursor). Step(hidden [D], logits [V])."""
        pos, toks = self._one_row(pos, token, "step")
        h, lg = self.model.forward(toks, pos, self.state)
        self._advance(1)
        return Step(h[0], lg[0])

    def _one_row(self, pos, token, what: str) -> tuple:
        """Validate a one-row call at `pos` (a token, no pending verify, contiguity) -> (pos, [token]).
        One row is a plain step whatever the batch mode: a strict engine takes it too."""
        toks = self._tokens(token, what)
        if len(toks) != 1:
            raise TokenError(f"{what}: takes exactly one token, got {len(toks)} (use step_m for a batch)")
        self._no_pending(what)
        return self._check_pos(pos, 1, self._cursor, what), toks

    def _batch(self, pos, tokens, what: str) -> tuple:
        """Validate an M-row call at `pos` (tokens, width, no pending verify, contiguity) -> (pos, tokens)."""
        toks = self._tokens(tokens, what, feed=True)
        self._check_width(len(toks), what)
        self._no_pending(what)
        return self._check_pos(pos, len(toks), self._cursor, what), toks

    def _rows(self, pos, tokens, what: str, gdn_mode: str, pending: str | None) -> Step:
        pos, toks = self._batch(pos, tokens, what)
        h, lg = self.model.forward(toks, pos, self.state, gdn_mode=gdn_mode)
        if pending:
            self.pending = (pending, pos, len(toks))
        self._advance(len(toks))
        return Step(h, lg)

    def step_m(self, pos, tokens) -> Step:
        """Batch of M rows at pos..pos+M-1. Row j is bit-identical to the j-th of M steps."""
        return self._rows(pos, tokens, "step_m", "in_place", None)

    def verify_checkpointed(self, pos, tokens) -> Step:
        """Like step_m, but the GDN state (and conv window) after each row goes into its own
        slot and the live state is left as it was. Follow with select_checkpoint(n)."""
        return self._rows(pos, tokens, "verify_checkpointed", "checkpoint", "checkpointed")

    def verify_cached(self, pos, tokens) -> Step:
        """Like step_m, but the GDN state is only read: each GDN layer's inputs for the M rows
        (its in-projection's output) are kept instead, kilobytes per row where a checkpoint
        keeps the whole state. Follow with fold_cached(n)."""
        return self._rows(pos, tokens, "verify_cached", "cache", "cached")

    def _accept(self, kind: str, n, what: str):
        """(pos, M, n) of the pending verify once n is checked (no state touched); n a Python int."""
        if self.pending is None or self.pending[0] != kind:
            have = "none" if self.pending is None else f"a {self.pending[0]} one"
            raise SnapshotError(f"{what}: no {kind} verify is pending ({have} is)")
        _, pos, m = self.pending
        return pos, m, inputs.count(n, f"{what}: n", 0, m, "the pending verify's rows", BatchWidthError)

    def fold_cached(self, n):
        """Keep the first n rows of the pending cached verify (0 <= n <= M): the GDN
        layers run the n rows' cached inputs into the live state in place (the same
        arithmetic as n plain steps, so the state is bit-identical to theirs); attention
        cursors move to pos+n."""
        pos, m, n = self._accept("cached", n, "fold_cached")
        if n:
            self.model.fold(n, self.state)
        self._folded(pos, n)

    def _folded(self, pos: int, n: int):
        """fold_cached's bookkeeping, once its n rows are folded (or will be, by a batched fold
        that runs before anything reads the state: kestrel/batch.py)."""
        self.pending = None
        self._cursor = pos
        self._advance(n)

    def select_checkpoint(self, n):
        """Keep the first n rows of the pending checkpointed verify (0 <= n <= M): the
        live GDN slot becomes row n-1's slot (n == 0: the untouched original); attention
        cursors move to pos+n. No copy, no replay."""
        pos, m, n = self._accept("checkpointed", n, "select_checkpoint")
        self.state.slot = (self.slot + n) % self.nslots
        self.pending = None
        self._cursor = pos
        self._advance(n)

    def _mtp_rows(self, pos, token, hidden, what: str):
        """Validate an MTP call (no state touched): (tokens [M], hidden [M, D] on the backend, single)."""
        if not self.model.has_mtp:
            raise KestrelError(f"{what}: this model has no MTP head (mtp_num_hidden_layers = 0)")
        single = _is_single(token)
        toks = self._tokens(token, what)
        m, D = len(toks), self.cfg.hidden_size
        want = (D,) if single else (m, D)
        hid = inputs.hidden_rows(hidden, want, f"{what}: hidden", getattr(self.be, "xp", np))  # finite real floats
        pos = self._check_pos(pos, m, self._mtp_cursor, what, "MTP cursor")
        return pos, toks, self.be.asarray(hid).reshape(m, D), single

    def mtp_step(self, pos, token, hidden) -> Step:
        """MTP head rows at positions pos..pos+M-1 of its own slot (pos == MTP cursor).
        token: int with hidden [D], or tokens [M] with hidden [M, D]."""
        pos, toks, hid, single = self._mtp_rows(pos, token, hidden, "mtp_step")
        hp, lg = self.model.mtp_forward(toks, hid, pos, self.state)
        self._mtp_cursor = pos + len(toks)
        return Step(hp[0], lg[0]) if single else Step(hp, lg)

    def mtp_draft(self, pos, token, hidden, k, forced=None, fill_tokens=None, fill_hidden=None) -> Draft:
        """The draft chain: k MTP rows, each fed by the one before. Row 0 reads (token, hidden [D]);
        row j+1 reads the argmax of row j's logits (forced[j] instead, when given: the replay
        oracle's tokens) and row j's h'. The state it leaves is bit-identical to k mtp_step calls
        fed that way; the difference is the host: on CUDA the argmax and the feed stay on the
        device, and the Draft's tokens stay there until read (a verify can take them as
        draft.feed(...) without that read), where k mtp_step calls wait for each token.

        fill_tokens [m] with fill_hidden [m, D]: m rows written before the chain, in its first
        pass, with the bits mtp_fill(pos, fill_tokens, fill_hidden) would write (the rows a round
        confirmed); the chain's rows are then pos+m..pos+m+k-1. Without them, pos..pos+k-1.
        pos == MTP cursor either way."""
        pos, tok, hid, k, forced, fill = self._mtp_draft_args(pos, token, hidden, k, forced, fill_tokens, fill_hidden)
        t, h = self.model.mtp_draft(tok, hid, pos, k, self.state, forced, fill)
        return self._drafted(pos, k, fill, t, h)

    def _drafted(self, pos, k, fill, tokens, hidden) -> Draft:
        """After a chain of k rows at pos (fill rows first): the MTP cursor moved, the Draft."""
        self._mtp_cursor = pos + (0 if fill is None else len(fill[0])) + k
        d = Draft(tokens, hidden, owner=self)
        d.chained_by = self          # its device tokens are this engine's argmax rows: a verify may trust them
        return d

    def _mtp_draft_args(self, pos, token, hidden, k, forced, fill_tokens, fill_hidden) -> tuple:
        """Validate an mtp_draft call (no state touched): (pos, token, hidden [1, D], k, forced, fill)."""
        if not self.model.has_mtp:
            raise KestrelError("mtp_draft: this model has no MTP head (mtp_num_hidden_layers = 0)")
        if not _is_single(token):
            raise TokenError(f"mtp_draft: takes one token (an int) and hidden [D], the chain's first row; "
                             f"got {token!r:.40}")
        if (fill_tokens is None) != (fill_hidden is None):
            raise TokenError("mtp_draft: fill_tokens and fill_hidden go together (the rows written before the chain)")
        xp, D = getattr(self.be, "xp", np), self.cfg.hidden_size
        toks = self._tokens(token, "mtp_draft")
        hid = inputs.hidden_rows(hidden, (D,), "mtp_draft: hidden", xp, finite=False)
        k = inputs.count(k, "mtp_draft: k", 1)
        hid = self.be.asarray(hid).reshape(1, D)
        rows, fill = [(hid, "mtp_draft: hidden")], None
        if fill_tokens is not None:
            ft = self._tokens(fill_tokens, "mtp_draft: fill_tokens")
            fh = inputs.hidden_rows(fill_hidden, (len(ft), D), "mtp_draft: fill_hidden", xp, finite=False)
            fill = (ft, self.be.asarray(fh).reshape(len(ft), D))
            rows.append((fill[1], "mtp_draft: fill_hidden"))
        inputs.all_finite(rows, xp)     # one wait, both checked
        m = 0 if fill is None else len(fill[0])
        pos = self._check_pos(pos, m + k, self._mtp_cursor, "mtp_draft", "MTP cursor")      # the m + k rows fit in max_seq
        if forced is not None:
            forced = self._tokens(forced, "mtp_draft: forced")
            if len(forced) != k:
                raise TokenError(f"mtp_draft: forced holds {len(forced)} tokens, the chain has k={k} rows")
        return pos, int(toks[0]), hid, k, forced, fill

    def mtp_fill(self, pos, token, hidden) -> None:
        """Write the MTP head's KV rows pos..pos+M-1 (pos == MTP cursor) bit for bit as mtp_step
        would, and compute nothing the rows do not need: no MLP, no norm, no lm_head, no
        output (kestrel/program.py, mtp_fill_program). For rows whose drafts nobody reads: the
        prompt's rows, the rows a round confirmed. Same arguments as mtp_step."""
        pos, toks, hid, _ = self._mtp_rows(pos, token, hidden, "mtp_fill")
        self.model.mtp_fill(toks, hid, pos, self.state)
        self._mtp_cursor = pos + len(toks)

    # ---- the three primitives ---------------------------------------------------------------
    def mark(self, include_mtp_cursor: bool = True):
        """One-shot snapshot. include_mtp_cursor=False is the article's negative control only."""
        if not isinstance(include_mtp_cursor, (bool, np.bool_)):
            raise SnapshotError(f"mark: include_mtp_cursor must be a bool, got {include_mtp_cursor!r:.40}")
        include_mtp_cursor = bool(include_mtp_cursor)
        self._no_pending("mark")
        st = self.state
        st.S_snap[...] = st.S[st.slot]
        st.hist_snap[...] = st.hist[st.slot]
        self.snap = {"cursor": self._cursor, "attn_len": list(self.attn_len),
                     "mtp_cursor": self._mtp_cursor if (include_mtp_cursor and self.model.has_mtp) else None}

    def rollback(self):
        if self.snap is None:
            raise SnapshotError("rollback without a valid mark (snapshots are one-shot; mtp_truncate also invalidates)")
        self._no_pending("rollback")
        st = self.state
        st.S[st.slot] = st.S_snap
        st.hist[st.slot] = st.hist_snap
        self._cursor = self.snap["cursor"]
        self.attn_len = list(self.snap["attn_len"])
        if self.snap["mtp_cursor"] is not None:
            self._mtp_cursor = self.snap["mtp_cursor"]
        self.snap = None

    def mtp_truncate(self, length):
        """Set the MTP write cursor to `length` (0 <= length <= the rows written). Rows past it
        are never read and get overwritten by the next append. Invalidates a live snapshot."""
        if not self.model.has_mtp:
            raise KestrelError("mtp_truncate: this model has no MTP head")
        self._mtp_cursor = inputs.count(length, "mtp_truncate: length", 0, self._mtp_cursor, "the MTP rows written",
                                    CursorError)
        self.snap = None

    def __repr__(self):
        return (f"Engine({self.cfg.name}, backend={self.be.name}, batch={self.batch}, mmax={self.mmax}, "
                f"max_seq={self.max_seq}, cursor={self._cursor}, mtp_cursor={self._mtp_cursor}, snapshot={self.snap is not None})")


def generate(model: Model, prompt, n_tokens: int, max_seq: int | None = None) -> list:
    """Pure greedy decoding: the reference stream every speculative run must equal."""
    if not isinstance(model, Model):
        raise KestrelError(f"generate needs a kestrel Model (from kestrel.load), got {type(model).__name__}")
    limit = model.cfg.max_position_embeddings      # every size is bounded by the model's positions
    prompt = inputs.token_ids(prompt, model.cfg.vocab_size, "generate: prompt").tolist()
    inputs.count(len(prompt), "generate: prompt length", 1, limit, "max_position_embeddings")
    n_tokens = inputs.count(n_tokens, "generate: n_tokens", 0, limit - len(prompt),
                            "max_position_embeddings - prompt length")
    need = len(prompt) + n_tokens
    max_seq = need if max_seq is None else inputs.count(max_seq, "generate: max_seq", need, limit, "max_position_embeddings")
    eng = Engine(model, max_seq=max_seq, mmax=1, batch="flex")
    logits = eng.prefill(prompt).logits[-1]
    out = []
    for i in range(n_tokens):
        t = int(model.be.argmax(logits))
        out.append(t)
        if i + 1 < n_tokens:
            logits = eng.step(eng.cursor, t).logits
    return out
