"""Each op against the independent float64 reference (tests/reference64.py)."""
import numpy as np
import pytest

import kestrel
from kestrel.ops import attention, linear, norm, rope
from kestrel.ops.gdn import GDNShape, gdn_rows
from reference64 import Reference, attn_token, gdn_token, rmsnorm_zc, rope_row, silu

F32_TOL = 2e-5


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def test_rmsnorm_zero_centred(rng):
    x = rng.standard_normal((5, 3, 48)).astype(np.float32) * 3
    w = (0.2 * rng.standard_normal(48)).astype(np.float32)
    assert rel(norm.rmsnorm(x, w, 1e-6), rmsnorm_zc(x, w, 1e-6)) < F32_TOL


def test_gated_norm(rng):
    o, z = rng.standard_normal((2, 4, 24)).astype(np.float32)
    w = (1 + 0.2 * rng.standard_normal(24)).astype(np.float32)
    ref = w * (o / np.sqrt((o.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)) * silu(z.astype(np.float64))
    assert rel(norm.gated_rmsnorm(o, z, w, 1e-6), ref) < F32_TOL


@pytest.mark.parametrize("m", [1, 3, 8, 11])
def test_linear(rng, m):
    x = rng.standard_normal((m, 40)).astype(np.float32)
    w = rng.standard_normal((33, 40)).astype(np.float32)
    assert rel(linear.linear(x, w), x.astype(np.float64) @ w.T.astype(np.float64)) < F32_TOL


def test_rope_partial_neox(rng):
    hd, rot, theta = 32, 8, 1e4
    x = rng.standard_normal((4, 3, hd)).astype(np.float32)
    pos = rng.integers(0, 500, 4)
    cos, sin = rope.rope_tables(rot, theta, 600)
    got = rope.apply_rope(x, cos[pos], sin[pos])
    ref = np.stack([rope_row(x[j], pos[j], rot, theta) for j in range(4)])
    assert rel(got, ref) < F32_TOL
    assert np.array_equal(got[..., rot:], x[..., rot:])  # the unrotated channels pass through


def _gdn_case(model, rng, m):
    cfg, w = model.cfg, model.w
    p = f"layers.{cfg.gdn_layers[0]}.linear_attn"
    xn = rng.standard_normal((m, cfg.hidden_size)).astype(np.float32)
    S0 = (0.3 * rng.standard_normal((cfg.lin_num_value_heads, cfg.lin_key_head_dim, cfg.lin_value_head_dim))).astype(np.float32)
    h0 = rng.standard_normal((cfg.conv_dim, cfg.conv_kernel - 1)).astype(np.float32)
    return cfg, w, p, xn, S0, h0


@pytest.mark.parametrize("m", [1, 4])
def test_gdn_mixer_vs_float64(model, rng, m):
    cfg, w, p, xn, S0, h0 = _gdn_case(model, rng, m)
    S, h = S0.copy(), h0.copy()
    got = model.gdn_mixer(p, xn, S, h)
    Sr, hr = S0.astype(np.float64), h0.astype(np.float64)
    ref = np.stack([gdn_token(cfg, w, p, xn[j].astype(np.float64), Sr, hr) for j in range(m)])
    assert rel(got, ref) < 1e-4
    assert rel(S, Sr) < 1e-5 and rel(h, hr) < 1e-6


def test_gdn_slots_equal_in_place(model, rng):
    """Per-row checkpoint slots: slot j == the in-place state after row j; the source stays intact."""
    cfg, w, p, xn, S0, h0 = _gdn_case(model, rng, 3)
    sh = model.gdn_shape
    qkv, z = linear.linear(xn, w[f"{p}.in_proj_qkv.weight"]), linear.linear(xn, w[f"{p}.in_proj_z.weight"])
    b, a = linear.linear(xn, w[f"{p}.in_proj_b.weight"]), linear.linear(xn, w[f"{p}.in_proj_a.weight"])
    args = (w[f"{p}.conv1d.weight"][:, 0, :], w[f"{p}.A_log"], w[f"{p}.dt_bias"], w[f"{p}.norm.weight"])
    S_slots = [np.full_like(S0, np.nan) for _ in range(3)]
    h_slots = [np.full_like(h0, np.nan) for _ in range(3)]
    S, h = S0.copy(), h0.copy()
    y_slots = gdn_rows(sh, qkv, z, b, a, *args, S, h, S_slots, h_slots)
    assert np.array_equal(S, S0) and np.array_equal(h, h0)
    for j in range(3):
        y = gdn_rows(sh, qkv[j:j + 1], z[j:j + 1], b[j:j + 1], a[j:j + 1], *args, S, h)
        assert np.array_equal(y[0], y_slots[j])
        assert np.array_equal(S, S_slots[j]) and np.array_equal(h, h_slots[j])


def test_attention_vs_float64(model, rng):
    cfg, w = model.cfg, model.w
    p = f"layers.{cfg.attn_layers[0]}.self_attn"
    n = 9
    xs = rng.standard_normal((n, cfg.hidden_size)).astype(np.float32)
    kc = np.full((32, cfg.num_kv_heads, cfg.head_dim), np.nan, np.float32)  # rows past the cursor: never read
    vc = kc.copy()
    got = np.concatenate([model.attn_mixer(p, xs[:5], kc, vc, 0), model.attn_mixer(p, xs[5:], kc, vc, 5)])
    K, V = [], []
    ref = np.stack([attn_token(cfg, w, p, xs[j].astype(np.float64), K, V, j) for j in range(n)])
    assert rel(got, ref) < 1e-4


def test_whole_model_and_mtp_vs_float64(model, rng):
    cfg = model.cfg
    toks = rng.integers(0, cfg.vocab_size, 12)
    eng = kestrel.Engine(model, max_seq=32, mmax=3)
    s = eng.prefill(toks[:7])
    ref = Reference(cfg, model.w)
    rh, rl = zip(*[ref.step(int(t)) for t in toks[:7]])
    assert rel(s.logits, np.stack(rl)) < 1e-4 and rel(s.hidden, np.stack(rh)) < 1e-4
    s2 = eng.step_m(7, toks[7:10])
    for j in range(3):
        h, lg = ref.step(int(toks[7 + j]))
        assert rel(s2.logits[j], lg) < 1e-4
    # MTP: rows 0..4 batched, then one more row, against the reference head
    hid = rng.standard_normal((6, cfg.hidden_size)).astype(np.float32)
    mt = eng.mtp_step(0, toks[1:6], hid[:5])
    m1 = eng.mtp_step(5, int(toks[6]), hid[5])
    got = np.concatenate([mt.logits, m1.logits[None]])
    want = np.stack([ref.mtp_step(int(toks[1 + j]), hid[j].astype(np.float64), j)[1] for j in range(6)])
    assert rel(got, want) < 1e-4
