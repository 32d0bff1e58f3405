"""Positions and counts of every NumPy integer type: the engine converts each to a Python int
at its boundary, so an int8 127 or a uint8 253 means what the Python int means (no wrap in a
sum, no wrapped value stored as a cursor) and every stored cursor is a Python int.

A twin engine driven with plain ints is the reference: after each call both return the same
bits, or both raise the same named error with the same message, and their states are identical.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import kestrel
from kestrel import KestrelError
from test_hostile_input import same_state

INT_TYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.intc,
             np.longlong, np.ulonglong)


def holders(v: int) -> list:
    """The NumPy integer types that hold v (Python int always does)."""
    return [t for t in INT_TYPES if np.iinfo(t).min <= v <= np.iinfo(t).max]


def assert_python_ints(e):
    """Every cursor the engine stores is a Python int (no NumPy scalar kept from a caller)."""
    assert type(e.cursor) is int and type(e.mtp_cursor) is int and all(type(x) is int for x in e.attn_len)
    if e.pending is not None:
        assert type(e.pending[1]) is int and type(e.pending[2]) is int
    if e.snap is not None:
        assert type(e.snap["cursor"]) is int and all(type(x) is int for x in e.snap["attn_len"])
        assert e.snap["mtp_cursor"] is None or type(e.snap["mtp_cursor"]) is int


def outcome(call):
    """('ok', result) or ('err', type, message) of call()."""
    try:
        return ("ok", call())
    except KestrelError as err:
        return ("err", type(err), str(err))


def same_outcome(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] == "err":
        assert a[1:] == b[1:]
        return
    ra, rb = a[1], b[1]
    if isinstance(ra, kestrel.Step):
        for x, y in ((ra.hidden, rb.hidden), (ra.logits, rb.logits)):
            assert x.dtype == y.dtype and np.array_equal(x, y)
    elif isinstance(ra, kestrel.Draft):
        assert ra.tokens == rb.tokens and np.array_equal(ra.hidden, rb.hidden)
    else:
        assert ra is None and rb is None


@pytest.fixture(scope="module")
def model():
    seed = int(np.random.SeedSequence().entropy % 10 ** 6)
    print(f"weights seed {seed}")
    return kestrel.load("test-a", device="cpu", seed=seed)


# ---- a state machine: typed engine vs plain-int twin -----------------------------------------------
MAX_SEQ = 300      # prompts up to MAX_SEQ - 10 reach positions 127 and 255, where int8/uint8 wrap


class TypedTwin(RuleBasedStateMachine):
    model = None

    @initialize(seed=st.integers(0, 2 ** 32 - 1))
    def setup(self, seed):
        self.rng = np.random.default_rng(seed)
        self.typed = kestrel.Engine(self.model, max_seq=MAX_SEQ, mmax=3, batch="flex")
        self.plain = kestrel.Engine(self.model, max_seq=MAX_SEQ, mmax=3, batch="flex")
        self.V, self.D = self.model.cfg.vocab_size, self.model.cfg.hidden_size

    def value(self, data, v: int):
        """v as a NumPy integer of a drawn type that holds it (a Python int if none does)."""
        types = holders(v)
        return data.draw(st.sampled_from(types))(v) if types else v

    def near(self, data, cursor: int) -> int:
        """Mostly the cursor; sometimes one off, or off by a wrap of 128/256."""
        return cursor + data.draw(st.sampled_from([0, 0, 0, 0, 1, -1, 2, 128, 256, -128, -256]))

    def both(self, typed_call, plain_call):
        same_outcome(outcome(lambda: typed_call(self.typed)), outcome(lambda: plain_call(self.plain)))

    def toks(self, m: int) -> list:
        return self.rng.integers(0, self.V, m).tolist()

    def hid(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    @rule(n=st.integers(1, MAX_SEQ - 10))
    def prefill(self, n):
        t = self.toks(n)
        self.both(lambda e: e.prefill(t), lambda e: e.prefill(t))

    @rule(data=st.data())
    def step(self, data):
        p, t = self.near(data, self.plain.cursor), self.toks(1)[0]
        tp = self.value(data, p)
        self.both(lambda e: e.step(tp, t), lambda e: e.step(p, t))

    @rule(data=st.data(), m=st.integers(1, 3),
          entry=st.sampled_from(["step_m", "verify_checkpointed", "verify_cached"]))
    def rows(self, data, m, entry):
        p, t = self.near(data, self.plain.cursor), self.toks(m)
        tp = self.value(data, p)
        self.both(lambda e: getattr(e, entry)(tp, t), lambda e: getattr(e, entry)(p, t))

    @rule(data=st.data(), n=st.integers(-1, 4), entry=st.sampled_from(["select_checkpoint", "fold_cached"]))
    def accept(self, data, n, entry):
        tn = self.value(data, n)
        self.both(lambda e: getattr(e, entry)(tn), lambda e: getattr(e, entry)(n))

    @rule(flag=st.sampled_from([True, False, np.True_]))
    def mark(self, flag):
        self.both(lambda e: e.mark(flag), lambda e: e.mark(bool(flag)))

    @rule()
    def rollback(self):
        self.both(lambda e: e.rollback(), lambda e: e.rollback())

    @rule(data=st.data(), m=st.integers(1, 3), single=st.booleans())
    def mtp_step(self, data, m, single):
        p = self.near(data, self.plain.mtp_cursor)
        tp = self.value(data, p)
        t, h = (self.toks(1)[0], self.hid(self.D)) if single else (self.toks(m), self.hid(m, self.D))
        self.both(lambda e: e.mtp_step(tp, t, h), lambda e: e.mtp_step(p, t, h))

    @rule(data=st.data(), delta=st.integers(-3, 1))
    def mtp_truncate(self, data, delta):
        n = self.plain.mtp_cursor + delta
        tn = self.value(data, n)
        self.both(lambda e: e.mtp_truncate(tn), lambda e: e.mtp_truncate(n))

    @rule(data=st.data(), k=st.integers(0, 4), fill=st.integers(0, 2))
    def mtp_draft(self, data, k, fill):
        p = self.near(data, self.plain.mtp_cursor)
        tp, tk = self.value(data, p), self.value(data, k)
        t, h = self.toks(1)[0], self.hid(self.D)
        kw = dict(fill_tokens=self.toks(fill), fill_hidden=self.hid(fill, self.D)) if fill else {}
        self.both(lambda e: e.mtp_draft(tp, t, h, tk, **kw), lambda e: e.mtp_draft(p, t, h, k, **kw))

    @invariant()
    def twins(self):
        if hasattr(self, "typed"):
            assert_python_ints(self.typed)
            same_state(self.typed.snapshot_state(), self.plain.snapshot_state())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_typed_positions_match_plain_ints(model):
    TypedTwin.model = model
    run = settings(max_examples=25, stateful_step_count=15, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(TypedTwin)
    run.TestCase().runTest()


# ---- every entry, every type, at the positions where small types wrap ------------------------------
def _engines(model, prompt_len: int, max_seq: int, rng, mtp_rows: int = 0):
    """Two engines holding the same prompt (and MTP rows), for the typed call and the plain one."""
    toks = rng.integers(0, model.cfg.vocab_size, prompt_len).tolist()
    out = []
    for _ in range(2):
        e = kestrel.Engine(model, max_seq=max_seq, mmax=3, batch="flex")
        s = e.prefill(toks)
        if mtp_rows:
            e.mtp_fill(0, toks[1:mtp_rows + 1], s.hidden[:mtp_rows])
        out.append(e)
    return out


ENTRIES = {
    "step": lambda e, p, rng, D, t: e.step(p, t[0]),
    "step_m": lambda e, p, rng, D, t: e.step_m(p, t),
    "verify_checkpointed": lambda e, p, rng, D, t: e.verify_checkpointed(p, t),
    "verify_cached": lambda e, p, rng, D, t: e.verify_cached(p, t),
    "mtp_step": lambda e, p, rng, D, t: e.mtp_step(p, t, np.ones((len(t), D), np.float32)),
    "mtp_fill": lambda e, p, rng, D, t: e.mtp_fill(p, t, np.ones((len(t), D), np.float32)),
    "mtp_draft": lambda e, p, rng, D, t: e.mtp_draft(p, t[0], np.ones(D, np.float32), len(t)),
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("cursor,max_seq", [(125, 200), (127, 200), (253, 300), (255, 300), (253, 256), (254, 256)])
def test_every_type_at_wrapping_positions(model, rng, entry, cursor, max_seq):
    """At cursors near 127 and 255 (and at max_seq = 256, where a uint8 sum wraps past the
    bound), each entry with its position in every NumPy type that holds it gives exactly what
    the Python int gives: the same bits, or the same refusal with the state unchanged."""
    D, M = model.cfg.hidden_size, 3
    mtp = entry.startswith("mtp")
    t = rng.integers(0, model.cfg.vocab_size, M).tolist()
    for typ in holders(cursor) + [int]:
        typed, plain = _engines(model, cursor if not mtp else cursor + 1, max_seq, rng, cursor if mtp else 0)
        plain_before = plain.snapshot_state()
        a = outcome(lambda: ENTRIES[entry](typed, typ(cursor), rng, D, t))
        b = outcome(lambda: ENTRIES[entry](plain, cursor, rng, D, t))
        same_outcome(a, b)
        if b[0] == "err":
            same_state(plain_before, plain.snapshot_state())
        assert_python_ints(typed)
        same_state(typed.snapshot_state(), plain.snapshot_state())


@pytest.mark.parametrize("entry", ["select_checkpoint", "fold_cached"])
def test_accepting_after_a_verify_at_253(model, rng, entry):
    """select_checkpoint(np.uint8(3)) after a verify at 253 once left the cursor at 0 (253 + 3
    in uint8); now every type of n gives the plain int's cursor, 256."""
    verify = "verify_checkpointed" if entry == "select_checkpoint" else "verify_cached"
    t = rng.integers(0, model.cfg.vocab_size, 3).tolist()
    for typ in holders(3) + [int]:
        typed, plain = _engines(model, 253, 300, rng)
        for e in (typed, plain):
            getattr(e, verify)(253, t)
        getattr(typed, entry)(typ(3))
        getattr(plain, entry)(3)
        assert typed.cursor == plain.cursor == 256
        assert_python_ints(typed)
        same_state(typed.snapshot_state(), plain.snapshot_state())


@pytest.mark.parametrize("typ", holders(32767))
def test_bound_check_does_not_wrap_near_32767(model, rng, typ):
    """pos + M computed in int16 would wrap 32767 + 3 to -32766 and pass the max_seq check;
    converted first, the bound is checked on 32769 and the contiguity on the true value."""
    e = kestrel.Engine(model, max_seq=min(32768, model.cfg.max_position_embeddings), mmax=3)
    before = e.snapshot_state()
    t = rng.integers(0, model.cfg.vocab_size, 3).tolist()
    for call in (lambda: e.step_m(typ(32767), t), lambda: e.step(typ(32767), t[0]),
                 lambda: e.mtp_step(typ(32767), t, np.ones((3, model.cfg.hidden_size), np.float32)),
                 lambda: e.mtp_truncate(typ(32767)), lambda: kestrel.Engine(model, max_seq=typ(32767))):
        with pytest.raises(KestrelError, match="32767|32769"):
            call()
        same_state(before, e.snapshot_state())


def test_bools_are_never_positions_or_counts(model, rng):
    e, _ = _engines(model, 4, 32, rng)
    before = e.snapshot_state()
    for call in (lambda: e.step(np.True_, 1), lambda: e.step_m(True, [1]), lambda: e.mtp_truncate(False),
                 lambda: e.mtp_draft(0, 1, np.ones(model.cfg.hidden_size, np.float32), True),
                 lambda: e.mark(include_mtp_cursor="no"), lambda: e.mark(include_mtp_cursor=1)):
        with pytest.raises(KestrelError):
            call()
        same_state(before, e.snapshot_state())
