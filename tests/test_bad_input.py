"""Bad input: a clear exception naming the problem, and the engine bit-identical after."""
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kestrel
from kestrel.config import ConfigError
from kestrel.weights import CheckpointError, random_weights, read_safetensors, save_dir, write_safetensors


def same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert np.array_equal(a[k], b[k], equal_nan=True), k
        else:
            assert a[k] == b[k], k


def busy_engine(model, rng, batch="flex"):
    """An engine mid-sequence with a live snapshot and MTP rows, so 'unchanged' means something."""
    V = model.cfg.vocab_size
    e = kestrel.Engine(model, max_seq=24, mmax=3, batch=batch)
    s = e.prefill(rng.integers(0, V, 6).tolist())
    e.mtp_step(0, rng.integers(0, V, 6), s.hidden)
    e.mark()
    e.step_m(6, rng.integers(0, V, 3).tolist())
    return e


def fill_to_end(e):
    """Valid calls up to max_seq (24), so the next position is one too far."""
    for p in (9, 12, 15, 18, 21):
        e.step_m(p, [1, 1, 1])
    assert e.cursor == e.max_seq


def other_draft(e, rng):
    """A draft of two tokens made by another engine on the same model."""
    o = kestrel.Engine(e.model, max_seq=8, mmax=3)
    o.prefill([1, 2])
    return o.mtp_draft(0, 1, hidden(e, rng), 2)


def own_draft(e, rng):
    """A Draft owned by `e` built from two in-range tokens (read from another engine's draft):
    a verify checks its tokens as a list, and the feed's head like any ids."""
    o = other_draft(e, rng)
    return kestrel.Draft(o.tokens, o.hidden, owner=e)


def with_own_draft(e):
    """Setup: e drafts two MTP rows itself (kept as e.test_draft), before the state is recorded."""
    e.test_draft = e.mtp_draft(6, 1, np.random.default_rng(3).standard_normal(e.cfg.hidden_size).astype(np.float32), 2)


def hidden(e, rng, *shape):
    return rng.standard_normal(shape or (e.cfg.hidden_size,)).astype(np.float32)


# (name, setup run before the state is recorded, the bad call, the error, what its message says)
CASES = [
    ("token out of range", None, lambda e, V, rng: e.step(9, V), kestrel.TokenError, "out of range"),
    ("negative token", None, lambda e, V, rng: e.step_m(9, [1, -1, 2]), kestrel.TokenError, "out of range"),
    ("float token", None, lambda e, V, rng: e.step(9, 1.5), kestrel.TokenError, "int"),
    ("two tokens to step", None, lambda e, V, rng: e.step(9, [1, 2]), kestrel.TokenError, "exactly one"),
    ("empty batch", None, lambda e, V, rng: e.step_m(9, []), kestrel.TokenError, "non-empty"),
    ("double consumption", None, lambda e, V, rng: e.step(8, 1), kestrel.CursorError, "double consumption"),
    ("skipped position", None, lambda e, V, rng: e.step(11, 1), kestrel.CursorError, "never consumed"),
    ("past max_seq", fill_to_end, lambda e, V, rng: e.step(24, 1), kestrel.CursorError, "max_seq"),
    ("position not an int", None, lambda e, V, rng: e.step(9.0, 1), kestrel.CursorError, "int"),
    ("batch too wide", None, lambda e, V, rng: e.step_m(9, [1, 2, 3, 4]), kestrel.BatchWidthError, "mmax"),
    ("prefill twice", None, lambda e, V, rng: e.prefill([1, 2]), kestrel.CursorError, "reset"),
    ("mtp position not at its cursor", None, lambda e, V, rng: e.mtp_step(5, 1, hidden(e, rng)),
     kestrel.CursorError, "MTP cursor"),
    ("mtp hidden misshapen", None, lambda e, V, rng: e.mtp_step(6, [1, 2], hidden(e, rng)),
     kestrel.TokenError, "hidden has shape"),
    ("mtp_fill position not at its cursor", None, lambda e, V, rng: e.mtp_fill(7, [1, 2], hidden(e, rng, 2, e.cfg.hidden_size)),
     kestrel.CursorError, "mtp_fill: position 7 is not contiguous with the MTP cursor"),
    ("mtp_fill hidden misshapen", None, lambda e, V, rng: e.mtp_fill(6, [1, 2], hidden(e, rng, 3, e.cfg.hidden_size)),
     kestrel.TokenError, "mtp_fill: hidden has shape"),
    ("mtp_fill token out of range", None, lambda e, V, rng: e.mtp_fill(6, [1, V], hidden(e, rng, 2, e.cfg.hidden_size)),
     kestrel.TokenError, "out of range"),
    ("mtp_draft position not at its cursor", None, lambda e, V, rng: e.mtp_draft(5, 1, hidden(e, rng), 2),
     kestrel.CursorError, "mtp_draft: position 5 is not contiguous with the MTP cursor"),
    ("mtp_draft of two tokens", None, lambda e, V, rng: e.mtp_draft(6, [1, 2], hidden(e, rng, 2, e.cfg.hidden_size), 2),
     kestrel.TokenError, "takes one token"),
    ("mtp_draft of a one-token list", None, lambda e, V, rng: e.mtp_draft(6, [1], hidden(e, rng), 2),
     kestrel.TokenError, "takes one token"),
    ("mtp_draft k = 0", None, lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 0), kestrel.KestrelError,
     "mtp_draft: k must be an int >= 1, got 0"),
    ("mtp_draft k past max_seq", None, lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 19), kestrel.CursorError,
     r"mtp_draft: positions 6\.\.24 exceed max_seq=24"),
    ("mtp_draft k not an int", None, lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 2.0), kestrel.KestrelError,
     "k must be an int"),
    ("mtp_draft forced too short", None, lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 3, forced=[1, 2]),
     kestrel.TokenError, "forced holds 2 tokens"),
    ("mtp_draft forced out of range", None, lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 2, forced=[1, V]),
     kestrel.TokenError, "out of range"),
    ("mtp_draft hidden not finite", None, lambda e, V, rng: e.mtp_draft(6, 1, np.full(e.cfg.hidden_size, np.nan, np.float32), 2),
     kestrel.KestrelError, "mtp_draft: hidden contains NaN or Inf"),
    ("mtp_draft fill tokens without their hidden", None,
     lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 2, fill_tokens=[1, 2]),
     kestrel.TokenError, "fill_tokens and fill_hidden go together"),
    ("mtp_draft fill hidden misshapen", None,
     lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 2, fill_tokens=[1, 2], fill_hidden=hidden(e, rng, 3, e.cfg.hidden_size)),
     kestrel.TokenError, "mtp_draft: fill_hidden has shape"),
    ("mtp_draft fill hidden not finite", None,
     lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 2, fill_tokens=[1],
                                   fill_hidden=np.full((1, e.cfg.hidden_size), np.inf, np.float32)),
     kestrel.TokenError, "mtp_draft: fill_hidden contains NaN or Inf"),
    ("mtp_draft fill token out of range", None,
     lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 2, fill_tokens=[V], fill_hidden=hidden(e, rng, 1, e.cfg.hidden_size)),
     kestrel.TokenError, "fill_tokens: token id .* out of range"),
    ("mtp_draft fill rows and chain past max_seq", None,
     lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 9, fill_tokens=[1] * 10, fill_hidden=hidden(e, rng, 10, e.cfg.hidden_size)),
     kestrel.CursorError, r"mtp_draft: positions 6\.\.24 exceed max_seq=24"),
    ("verify fed another engine's draft", None, lambda e, V, rng: e.verify_checkpointed(9, other_draft(e, rng).feed([1])),
     kestrel.TokenError, "not made by this engine"),
    ("verify fed a draft feed with a token out of range", None,
     lambda e, V, rng: e.verify_checkpointed(9, own_draft(e, rng).feed([V])), kestrel.TokenError, "out of range"),
    ("verify fed a draft feed with a negative token", None,
     lambda e, V, rng: e.step_m(9, own_draft(e, rng).feed([-1])), kestrel.TokenError, "out of range"),
    ("verify fed a draft feed with a bool", None,
     lambda e, V, rng: e.verify_cached(9, own_draft(e, rng).feed([True])), kestrel.TokenError, "bool"),
    ("verify fed a hand-built draft out of range", None,
     lambda e, V, rng: e.verify_checkpointed(9, kestrel.Draft([1, V + 5], None, owner=e).feed()),
     kestrel.TokenError, "out of range"),
    ("verify fed the engine's own draft after a token out of range", with_own_draft,
     lambda e, V, rng: e.verify_checkpointed(9, e.test_draft.feed([V])), kestrel.TokenError, "out of range"),
    ("verify fed an empty draft feed", None, lambda e, V, rng: e.step_m(9, own_draft(e, rng).feed([], n=0)),
     kestrel.TokenError, "empty DraftFeed"),
    ("step fed a draft feed", None, lambda e, V, rng: e.step(9, own_draft(e, rng).feed(n=1)),
     kestrel.TokenError, "not a DraftFeed"),
    ("mtp_draft forced as a draft feed", None,
     lambda e, V, rng: e.mtp_draft(6, 1, hidden(e, rng), 2, forced=other_draft(e, rng).feed()),
     kestrel.TokenError, "not a DraftFeed"),
    ("a draft feed of more tokens than its draft", None, lambda e, V, rng: own_draft(e, rng).feed(n=3),
     kestrel.TokenError, r"n=3 outside \[0, 2\]"),
    ("truncate past the rows written", None, lambda e, V, rng: e.mtp_truncate(7), kestrel.CursorError, r"\[0, 6\]"),
    ("truncate negative", None, lambda e, V, rng: e.mtp_truncate(-1), kestrel.CursorError, "mtp_truncate"),
    ("select without verify", None, lambda e, V, rng: e.select_checkpoint(1), kestrel.SnapshotError, "no checkpointed"),
]


@pytest.mark.parametrize("name,setup,call,exc,match", CASES, ids=[c[0] for c in CASES])
def test_bad_call_raises_and_leaves_state(model_a, rng, name, setup, call, exc, match):
    e = busy_engine(model_a, rng)
    if setup is not None:
        setup(e)
    before = e.snapshot_state()
    with pytest.raises(exc, match=match):
        call(e, model_a.cfg.vocab_size, rng)
    same_state(before, e.snapshot_state())


def test_rollback_without_mark(model_a, rng):
    e = busy_engine(model_a, rng)
    e.rollback()
    before = e.snapshot_state()
    with pytest.raises(kestrel.SnapshotError, match="without a valid mark"):
        e.rollback()
    same_state(before, e.snapshot_state())


def test_strict_width_and_pending_checkpoint(model_a, rng):
    e = busy_engine(model_a, rng, batch="strict")
    before = e.snapshot_state()
    for m in (1, 2):
        with pytest.raises(kestrel.BatchWidthError, match="strict batch requires M == mmax == 3"):
            e.step_m(9, [1] * m)
    same_state(before, e.snapshot_state())
    e.verify_checkpointed(9, [1, 2, 3])
    before = e.snapshot_state()
    for call in (lambda: e.step(12, 1), lambda: e.mark(), lambda: e.rollback(), lambda: e.select_checkpoint(4)):
        with pytest.raises((kestrel.SnapshotError, kestrel.BatchWidthError)):
            call()
    same_state(before, e.snapshot_state())


def test_engine_arguments():
    m = kestrel.load("test-a", device="cpu")
    for kw, match in [({"max_seq": 0}, "max_seq"), ({"mmax": 9}, "mmax"), ({"batch": "loose"}, "batch")]:
        with pytest.raises(kestrel.KestrelError, match=match):
            kestrel.Engine(m, **kw)
    with pytest.raises(kestrel.KestrelError, match="dtype"):
        kestrel.load("test-a", device="cpu", dtype="fp8")


# ---- checkpoints --------------------------------------------------------------------------
@pytest.fixture
def ckpt(tmp_path):
    cfg = kestrel.preset("test-b")
    save_dir(tmp_path, cfg, random_weights(cfg, seed=1))
    return tmp_path


def _rewrite(ckpt, fn):
    t = read_safetensors(ckpt / "model.safetensors")
    fn(t)
    write_safetensors(ckpt / "model.safetensors", t)


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("model.layers.2.linear_attn.A_log"), "missing tensor 'model.layers.2.linear_attn.A_log'"),
    (lambda t: t.update({"model.layers.1.self_attn.k_proj.weight": np.ones((3, 3), np.float32)}),
     r"'model.layers.1.self_attn.k_proj.weight' has shape \[3, 3\]"),
    (lambda t: t.update({"model.layers.9.mlp.up_proj.weight": np.ones((3, 3), np.float32)}), "does not describe"),
    (lambda t: t["mtp.fc.weight"].__setitem__((0, 0), np.nan), "'mtp.fc.weight' contains NaN"),
    (lambda t: t.pop("lm_head.weight"), "missing tensor 'lm_head.weight'"),
])
def test_bad_checkpoint_tensor_is_named(ckpt, edit, match):
    _rewrite(ckpt, edit)
    with pytest.raises(CheckpointError, match=match):
        kestrel.load(ckpt, device="cpu")


def test_pickle_only_checkpoint_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(kestrel.preset("test-a").to_hf()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(CheckpointError, match="safetensors only"):
        kestrel.load(tmp_path, device="cpu")


def test_corrupt_header_and_missing_shard(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(CheckpointError, match="header"):
        kestrel.load(ckpt, device="cpu")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="do not exist"):
        kestrel.load(ckpt, device="cpu")


def test_unknown_config_key_of_consequence(ckpt):
    d = json.loads((ckpt / "config.json").read_text())
    d["attention_bias"] = True
    (ckpt / "config.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="attention_bias"):
        kestrel.load(ckpt, device="cpu")


# ---- property-based: random call sequences against a model of the rules --------------------
MODEL = None


def _model():
    global MODEL
    if MODEL is None:
        MODEL = kestrel.load("test-a", device="cpu", seed=5)
    return MODEL


class EngineRules(RuleBasedStateMachine):
    """The rules: cursor contiguity, width per batch mode, max_seq, one-shot snapshots that
    truncate invalidates, MTP cursor <= rows written, one pending verify (checkpointed or
    cached) that only its own finish call ends."""

    def __init__(self):
        super().__init__()
        self.m = _model()
        self.V, self.D = self.m.cfg.vocab_size, self.m.cfg.hidden_size
        self.batch = "strict" if np.random.default_rng().random() < 0.5 else "flex"
        self.e = kestrel.Engine(self.m, max_seq=20, mmax=3, batch=self.batch)
        self.pos = self.mtp = 0
        self.snap = None      # (pos, mtp) of the live mark
        self.pending = None   # (kind, pos, M)

    def attempt(self, valid, call):
        before = self.e.snapshot_state()
        if valid:
            call()
        else:
            with pytest.raises(kestrel.KestrelError):
                call()
            same_state(before, self.e.snapshot_state())
        return valid

    @rule(n=st.integers(0, 6))
    def prefill(self, n):
        toks = list(range(1, n + 1))
        ok = n >= 1 and self.pos == 0 and self.pending is None  # prefill starts a sequence at 0
        if self.attempt(ok, lambda: self.e.prefill(toks)):
            self.pos = n

    @rule(dp=st.integers(-2, 2), tok=st.integers(-1, 100))
    def step(self, dp, tok):
        p = self.pos + dp
        ok = dp == 0 and 0 <= tok < self.V and p + 1 <= 20 and self.pending is None
        if self.attempt(ok, lambda: self.e.step(p, tok)):
            self.pos += 1

    @rule(dp=st.integers(-1, 1), m=st.integers(0, 4), entry=st.sampled_from(["step_m", "checkpointed", "cached"]))
    def step_m(self, dp, m, entry):
        p = self.pos + dp
        width_ok = m == 3 if self.batch == "strict" else 1 <= m <= 3
        ok = dp == 0 and width_ok and p + m <= 20 and self.pending is None
        fn = {"step_m": self.e.step_m, "checkpointed": self.e.verify_checkpointed, "cached": self.e.verify_cached}[entry]
        if self.attempt(ok, lambda: fn(p, [2] * m)):
            if entry != "step_m":
                self.pending = (entry, self.pos, m)
            self.pos += m

    @rule(n=st.integers(-1, 4), entry=st.sampled_from(["checkpointed", "cached"]))
    def accept(self, n, entry):
        ok = self.pending is not None and self.pending[0] == entry and 0 <= n <= self.pending[2]
        fn = self.e.select_checkpoint if entry == "checkpointed" else self.e.fold_cached
        if self.attempt(ok, lambda: fn(n)):
            self.pos = self.pending[1] + n
            self.pending = None

    @rule(dq=st.integers(-1, 1), m=st.integers(1, 3), bad_hidden=st.booleans(), fill=st.booleans())
    def mtp_rows(self, dq, m, bad_hidden, fill):
        q = self.mtp + dq
        hid = np.ones((m, self.D + (1 if bad_hidden else 0)), np.float32)
        ok = dq == 0 and q + m <= 20 and not bad_hidden
        entry = self.e.mtp_fill if fill else self.e.mtp_step
        if self.attempt(ok, lambda: entry(q, [3] * m, hid)):
            self.mtp += m

    @rule(dq=st.integers(-1, 1), k=st.integers(0, 4), bad_hidden=st.booleans())
    def mtp_draft(self, dq, k, bad_hidden):
        q = self.mtp + dq
        hid = np.ones(self.D + (1 if bad_hidden else 0), np.float32)
        ok = dq == 0 and k >= 1 and q + k <= 20 and not bad_hidden
        if self.attempt(ok, lambda: self.e.mtp_draft(q, 3, hid, k)):
            self.mtp += k

    @rule()
    def mark(self):
        if self.attempt(self.pending is None, self.e.mark):
            self.snap = (self.pos, self.mtp)

    @rule()
    def rollback(self):
        if self.attempt(self.snap is not None and self.pending is None, self.e.rollback):
            self.pos, self.mtp = self.snap
            self.snap = None

    @rule(n=st.integers(-1, 8))
    def truncate(self, n):
        if self.attempt(0 <= n <= self.mtp, lambda: self.e.mtp_truncate(n)):
            self.mtp, self.snap = n, None

    @invariant()
    def cursors_agree(self):
        assert (self.e.cursor, self.e.mtp_cursor, self.e.has_snapshot) == (self.pos, self.mtp, self.snap is not None)


EngineRules.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
test_engine_rules = EngineRules.TestCase
