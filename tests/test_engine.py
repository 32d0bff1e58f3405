"""Engine rules: batch invariance, the three primitives, per-row checkpoints, cached verify + fold, cursors."""
import numpy as np
import pytest

import kestrel
from conftest import verify_fed_both_ways, draft_both_ways, fresh_engine, mtp_rows_both_ways


def live(eng):
    """Host copy of the live state: S/hist of the live slot and the KV rows below the cursors."""
    S, h = eng.live_state()
    d = {"S": np.array(eng.be.to_numpy(S)), "hist": np.array(eng.be.to_numpy(h)),
         "kc": np.array(eng.be.to_numpy(eng.state.kc[:, :eng.cursor])), "vc": np.array(eng.be.to_numpy(eng.state.vc[:, :eng.cursor])),
         "pos": eng.cursor, "attn_len": list(eng.attn_len), "mtp_len": eng.mtp_cursor}
    if eng.model.has_mtp:
        d["mtp_kc"] = np.array(eng.be.to_numpy(eng.state.mtp_kc[:eng.mtp_cursor]))
    return d


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert np.array_equal(a[k], b[k]), k     # bit-exact, NaN-free by construction
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("batch,mmax", [("flex", 4), ("flex", 8), ("strict", 3), ("strict", 1)])
def test_batch_invariance(model, rng, batch, mmax):
    """Row j of step_m(p, [t1..tM]) == the j-th of M successive steps: hidden, logits, state."""
    V = model.cfg.vocab_size
    widths = [mmax] if batch == "strict" else range(1, mmax + 1)
    for m in widths:
        prompt = rng.integers(0, V, int(rng.integers(1, 9))).tolist()
        toks = rng.integers(0, V, m).tolist()
        a, _ = fresh_engine(model, prompt, mmax=mmax, batch=batch)
        b, _ = fresh_engine(model, prompt, mmax=mmax, batch=batch)
        sa = a.step_m(len(prompt), toks)
        rows = [b.step(len(prompt) + j, t) for j, t in enumerate(toks)]
        assert np.array_equal(sa.hidden, np.stack([r.hidden for r in rows]))
        assert np.array_equal(sa.logits, np.stack([r.logits for r in rows]))
        assert_same(live(a), live(b))


def _goes_on_like_steps(e, model, prompt, toks, n, rng):
    """After accepting n rows, e's next step equals that of an engine that stepped them."""
    nxt = int(rng.integers(0, model.cfg.vocab_size))
    e2, _ = fresh_engine(model, prompt, mmax=4)
    for j in range(n):
        e2.step(len(prompt) + j, toks[j])
    assert np.array_equal(e.step(len(prompt) + n, nxt).logits, e2.step(len(prompt) + n, nxt).logits)


def test_verify_checkpointed_slots(model, rng):
    """Checkpointed verify rows == step_m rows; selecting n == n successive steps, no copy."""
    V = model.cfg.vocab_size
    prompt = rng.integers(0, V, 5).tolist()
    toks = rng.integers(0, V, 4).tolist()
    ref, _ = fresh_engine(model, prompt, mmax=4)
    rows = [ref.step(5, toks[0])]
    states = [live(ref)]
    for j in range(1, 4):
        rows.append(ref.step(5 + j, toks[j]))
        states.append(live(ref))
    for n in range(0, 5):
        e, _ = fresh_engine(model, prompt, mmax=4)
        before = live(e)
        S_ptr = e.state.S.__array_interface__["data"][0]
        s = e.verify_checkpointed(5, toks)
        assert np.array_equal(s.logits, np.stack([r.logits for r in rows]))
        e.select_checkpoint(n)
        got = live(e)
        want = before if n == 0 else states[n - 1]
        # KV rows past the selected cursor exist but are invisible; compare the visible state
        assert_same(got, want)
        assert e.state.S.__array_interface__["data"][0] == S_ptr  # selection moved an index, not data
        # and the engine keeps going from there exactly like the reference
        _goes_on_like_steps(e, model, prompt, toks, n, rng)


def test_verify_cached_fold(model, rng):
    """Cached verify rows == step_m rows, the live state untouched until the fold; folding n
    rows leaves exactly the state of n successive steps; the engine goes on identically."""
    V = model.cfg.vocab_size
    prompt = rng.integers(0, V, 5).tolist()
    toks = rng.integers(0, V, 4).tolist()
    ref, _ = fresh_engine(model, prompt, mmax=4)
    rows, states = [], []
    for j in range(4):
        rows.append(ref.step(5 + j, toks[j]))
        states.append(live(ref))
    for n in range(0, 5):
        e, _ = fresh_engine(model, prompt, mmax=4)
        before = live(e)
        s = e.verify_cached(5, toks)
        assert np.array_equal(s.logits, np.stack([r.logits for r in rows]))
        assert np.array_equal(s.hidden, np.stack([r.hidden for r in rows]))
        S, h = e.live_state()
        assert np.array_equal(S, before["S"]) and np.array_equal(h, before["hist"])   # only read
        with pytest.raises(kestrel.SnapshotError, match="fold_cached"):
            e.step(9, 1)
        with pytest.raises(kestrel.SnapshotError, match="no checkpointed verify"):
            e.select_checkpoint(n)
        e.fold_cached(n)
        assert_same(live(e), before if n == 0 else states[n - 1])
        _goes_on_like_steps(e, model, prompt, toks, n, rng)


def test_fold_cached_refuses_bad_n_unchanged(model, rng):
    V = model.cfg.vocab_size
    e, _ = fresh_engine(model, rng.integers(0, V, 4).tolist(), mmax=3)
    with pytest.raises(kestrel.SnapshotError, match="no cached verify is pending"):
        e.fold_cached(0)
    e.verify_cached(4, rng.integers(0, V, 3).tolist())
    snap = e.snapshot_state()
    for bad in (-1, 4, 1.0, True, "1", None):
        with pytest.raises(kestrel.KestrelError):
            e.fold_cached(bad)
        now = e.snapshot_state()
        for k in snap:
            if isinstance(snap[k], np.ndarray):
                assert np.array_equal(now[k], snap[k]), k
            else:
                assert now[k] == snap[k], k
    e.fold_cached(np.int64(2))          # NumPy ints are ints
    assert e.cursor == 6


def test_mark_rollback_restores_everything(model, rng):
    V, D = model.cfg.vocab_size, model.cfg.hidden_size
    e, s = fresh_engine(model, rng.integers(0, V, 6).tolist(), mmax=3)
    e.mtp_step(0, rng.integers(0, V, 6), s.hidden)
    before = live(e)
    e.mark()
    e.step_m(6, rng.integers(0, V, 3).tolist())
    e.step(9, int(rng.integers(0, V)))
    e.mtp_step(6, int(rng.integers(0, V)), rng.standard_normal(D).astype(np.float32))
    assert e.cursor == 10 and e.mtp_cursor == 7
    e.rollback()
    assert_same(live(e), before)
    with pytest.raises(kestrel.SnapshotError):
        e.rollback()  # one-shot


def test_negative_control_mtp_cursor_left_out(model_a, rng):
    """The article's negative control: drop the MTP cursor from the snapshot and the result changes."""
    V, D = model_a.cfg.vocab_size, model_a.cfg.hidden_size
    outcomes = {}
    for include in (True, False):
        e, s = fresh_engine(model_a, [1, 2, 3, 4], mmax=3)
        e.mtp_step(0, [2, 3, 4], s.hidden[:3])
        e.mark(include_mtp_cursor=include)
        e.mtp_step(3, 5, s.hidden[3])
        e.rollback()
        outcomes[include] = e.mtp_cursor
    assert outcomes[True] == 3 and outcomes[False] == 4


def test_mtp_truncate_invalidates_snapshot(model, rng):
    V = model.cfg.vocab_size
    prompt = rng.integers(0, V, 6).tolist()
    e, s = fresh_engine(model, prompt, mmax=3)
    e.mtp_step(0, prompt, s.hidden)
    e.mark()
    e.mtp_truncate(4)
    assert e.mtp_cursor == 4 and not e.has_snapshot
    with pytest.raises(kestrel.SnapshotError):
        e.rollback()
    # truncation is only a cursor move: the next append overwrites row 4, and the result equals
    # an MTP slot that never held rows 4..5
    hid = rng.standard_normal(model.cfg.hidden_size).astype(np.float32)
    a = e.mtp_step(4, 7, hid)
    g, _ = fresh_engine(model, prompt, mmax=3)
    g.mtp_step(0, prompt[:4], s.hidden[:4])
    b = g.mtp_step(4, 7, hid)
    assert e.mtp_cursor == 5 and np.array_equal(a.logits, b.logits)


def test_mtp_fill_writes_the_rows_mtp_step_writes(model, rng):
    """mtp_fill is the MTP program cut after its attention: the KV rows, the cursor and every
    other buffer are bit-identical to mtp_step's, at any M and any start row."""
    V, D = model.cfg.vocab_size, model.cfg.hidden_size
    prompt = rng.integers(0, V, 9).tolist()
    for q, m in ((0, 8), (3, 1), (5, 3)):
        hid = rng.standard_normal((m, D)).astype(np.float32)
        toks = rng.integers(0, V, m).tolist()
        a, b = (e.snapshot_state() for e in mtp_rows_both_ways(model, prompt, q, toks, hid).values())
        assert a["mtp_cursor"] == b["mtp_cursor"] == q + m
        assert not np.array_equal(a["mtp_kc"][q:q + m], 0 * a["mtp_kc"][q:q + m])
        for k in a:
            assert np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k], k


def test_mtp_draft_is_k_chained_mtp_steps(model, rng):
    """mtp_draft's chain (each row fed the argmax of the row before and its h', or the forced
    tokens) leaves every buffer and cursor bit-identical to k mtp_step calls fed the same way,
    and returns the same drafts and hiddens."""
    V, D = model.cfg.vocab_size, model.cfg.hidden_size
    prompt = rng.integers(0, V, 9).tolist()
    for q, k, forced, m in ((0, 1, False, 0), (4, 3, False, 0), (8, 5, False, 0), (5, 4, True, 0),
                            (0, 1, False, 2), (3, 3, False, 1), (2, 2, True, 3)):
        h = rng.standard_normal(D).astype(np.float32)
        x = int(rng.integers(0, V))
        f = rng.integers(0, V, k).tolist() if forced else None
        fill = (rng.integers(0, V, m).tolist(), rng.standard_normal((m, D)).astype(np.float32)) if m else None
        got = draft_both_ways(model, prompt, q, x, h, k, forced=f, fill=fill)
        (ea, ta, ha), (eb, tb, hb) = got["mtp_draft"], got["mtp_step"]
        assert ta == tb and len(ta) == k and np.array_equal(ha, hb)
        assert ea.mtp_cursor == eb.mtp_cursor == q + m + k
        a, b = ea.snapshot_state(), eb.snapshot_state()
        for name in a:
            assert np.array_equal(a[name], b[name]) if isinstance(a[name], np.ndarray) else a[name] == b[name], name
    # the feed matters: a chain fed other tokens writes other rows (the comparison can fail)
    h = rng.standard_normal(D).astype(np.float32)
    e1, _ = fresh_engine(model, prompt, mmax=3)
    e2, _ = fresh_engine(model, prompt, mmax=3)
    d = e1.mtp_draft(0, 1, h, 3)
    e2.mtp_draft(0, 1, h, 3, forced=[(t + 1) % V for t in d.tokens])
    assert not np.array_equal(e1.state.mtp_kc[2], e2.state.mtp_kc[2])


@pytest.mark.parametrize("entry", ["verify_checkpointed", "verify_cached", "step_m"])
def test_verify_fed_a_draft_feed(model, rng, entry):
    """A verify fed draft.feed(head) (the drafted tokens never read by the host before it) gives
    the rows, and leaves the state, of the same verify fed the tokens as a list; the Draft's
    tokens read afterwards are the ones verified."""
    V, D = model.cfg.vocab_size, model.cfg.hidden_size
    prompt = rng.integers(0, V, 7).tolist()
    for head, k in (((), 3), ((int(rng.integers(0, V)),), 2), ((), 1)):
        h = rng.standard_normal(D).astype(np.float32)
        (ea, sa, ta), (eb, sb, tb) = verify_fed_both_ways(model, prompt, head, int(rng.integers(0, V)), h, k, entry)
        assert ta == tb and len(ta) == len(head) + k
        assert np.array_equal(sa.logits, sb.logits) and np.array_equal(sa.hidden, sb.hidden)
        a, b = ea.snapshot_state(), eb.snapshot_state()
        for name in a:
            assert np.array_equal(a[name], b[name]) if isinstance(a[name], np.ndarray) else a[name] == b[name], name
    # the feed is what is verified: another draft's tokens give other logits
    e, _ = fresh_engine(model, prompt, mmax=3)
    d = e.mtp_draft(0, 1, rng.standard_normal(D).astype(np.float32), 3)
    s1 = e.verify_checkpointed(e.cursor, d.feed())
    e.select_checkpoint(0)
    s2 = e.verify_checkpointed(e.cursor, [(t + 1) % V for t in d.tokens])
    assert not np.array_equal(s1.logits, s2.logits)


def test_rows_past_cursors_are_never_read(model, rng):
    """Poison everything invisible with NaN (KV rows >= cursor, MTP rows >= its cursor, the
    non-live GDN slots, the snapshot buffers): results and visible state are unchanged."""
    V, D = model.cfg.vocab_size, model.cfg.hidden_size
    prompt = rng.integers(0, V, 7).tolist()
    toks = rng.integers(0, V, 3).tolist()
    runs = []
    for poison in (False, True):
        e, s = fresh_engine(model, prompt, mmax=3)
        e.mtp_step(0, prompt[1:], s.hidden[:6])
        if poison:
            e.state.kc[:, e.cursor:] = np.nan
            e.state.vc[:, e.cursor:] = np.nan
            e.state.mtp_kc[e.mtp_cursor:] = np.nan
            e.state.mtp_vc[e.mtp_cursor:] = np.nan
            for k in range(e.nslots):
                if k != e.slot:
                    e.state.S[k] = np.nan
                    e.state.hist[k] = np.nan
        r1 = e.step_m(7, toks)
        r2 = e.mtp_step(6, toks[0], r1.hidden[0])
        e.mark()
        r3 = e.step(10, toks[1])
        e.rollback()
        r4 = e.verify_checkpointed(10, toks)
        e.select_checkpoint(2)
        r5 = e.step(12, toks[2])
        out = [r1.logits, r2.logits, r3.logits, r4.logits, r5.logits]
        assert all(np.isfinite(x).all() for x in out)
        runs.append((out, live(e)))
    for a, b in zip(runs[0][0], runs[1][0]):
        assert np.array_equal(a, b)
    assert_same(runs[0][1], runs[1][1])


def test_generate_matches_manual_loop(model, rng):
    V = model.cfg.vocab_size
    prompt = rng.integers(0, V, 5).tolist()
    stream = kestrel.generate(model, prompt, 12)
    e, s = fresh_engine(model, prompt)
    lg, manual = s.logits[-1], []
    for i in range(12):
        t = int(np.argmax(lg))
        manual.append(t)
        lg = e.step(5 + i, t).logits
    assert stream == manual


def test_device_cuda_without_gpu_is_refused():
    from kestrel.backend import cuda_available
    if cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(kestrel.DeviceError, match="no CUDA GPU"):
        kestrel.load("test-a", device="cuda")
    with pytest.raises(kestrel.DeviceError, match="unknown device"):
        kestrel.load("test-a", device="tpu")
