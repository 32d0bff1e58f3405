"""Gated attention: the NumPy twin vs float64 (through the model program's ops), and
kernels/attention.cu vs its twin: rows past the cursor are never read nor written, and row j
of a batch is bit-identical to row j alone."""
import numpy as np
import pytest

from gpu import F32, ctrl, dev, go, host, needs_gpu, rel
from kestrel.ops import attention, rope
from kestrel.state import DeviceState
from reference64 import attn_token


def _mixer_ops(model, a):
    ops = model.main_prog.ops
    i = next(n for n, op in enumerate(ops) if op.kind == "attention" and op.state == ("kv", a))
    return ops[i - 1:i + 2]


def test_attention_vs_float64(model, rng):
    cfg, w = model.cfg, model.w
    p = f"layers.{cfg.attn_layers[0]}.self_attn"
    n = 9
    st = DeviceState.allocate(cfg, model.be, 32, 2, False)
    st.kc[...] = np.nan                    # rows past the cursor: never read
    st.vc[...] = np.nan
    xs = rng.standard_normal((n, cfg.hidden_size)).astype(np.float32)
    x0 = rng.standard_normal((n, cfg.hidden_size)).astype(np.float32)
    got = []
    for lo, hi in ((0, 5), (5, n)):
        env = model.be.execute(model, model.main_prog, _mixer_ops(model, 0), {"xn": xs[lo:hi], "x": x0[lo:hi].copy()}, st, lo)
        got.append(env["x"] - x0[lo:hi])
    K, V = [], []
    ref = np.stack([attn_token(cfg, w, p, xs[j].astype(np.float64), K, V, j) for j in range(n)])
    assert rel(np.concatenate(got), ref) < 1e-4


def _kernels(be, ain, qn, kn, cos, sin, kc, vc, pos, nh, nkv, hd, rot, eps, lmax):
    """kv_append + attn_decode exactly as the lowered plan launches them."""
    m, width = ain.shape
    qd, kd = nh * 2 * hd, nkv * hd
    A = dev(ain)
    out = be.empty((m, nh * hd))
    c = ctrl(pos)
    go(be, attention.kv_append_launch(A[:, qd:], width, A[:, qd + kd:], width, dev(kn), cos, sin, 0, kc, vc, c, m, nkv,
                                      hd, rot // 2, eps))
    go(be, attention.attn_decode_launch(A, width, dev(qn), cos, sin, 0, kc, vc, out, nh * hd, c, m, nh, nkv, hd,
                                        rot // 2, eps, hd ** -0.5, lmax))
    return host(out)


@pytest.mark.parametrize("nh,nkv,hd,rot", [(4, 2, 16, 4), (2, 1, 32, 16), (6, 1, 256, 64)])
@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_attention_kernels(be, rng, nh, nkv, hd, rot, m):
    """q/k norm + partial RoPE + causal attention over cache rows < pos+j+1 + sigmoid gate."""
    pos, max_seq, eps = int(rng.integers(0, 40)), 64, 1e-6
    ain = rng.standard_normal((m, nh * 2 * hd + 2 * nkv * hd)).astype(np.float32)
    qn, kn = (0.2 * rng.standard_normal((2, hd))).astype(np.float32)
    cos_h, sin_h = rope.rope_tables(rot, 1e4, max_seq)
    cos, sin = dev(cos_h), dev(sin_h)
    kc0 = np.full((max_seq, nkv, hd), np.nan, np.float32)
    vc0 = kc0.copy()
    kc0[:pos] = rng.standard_normal((pos, nkv, hd))
    vc0[:pos] = rng.standard_normal((pos, nkv, hd))
    kc_cpu, vc_cpu = kc0.copy(), vc0.copy()
    qg, k, v = attention.split_in_proj(ain, nh, nkv, hd)
    want = attention.attention_block(qg, k, v, qn, kn, cos_h[pos:pos + m], sin_h[pos:pos + m], kc_cpu, vc_cpu, pos,
                                     eps, hd ** -0.5)
    kc, vc = dev(kc0), dev(vc0)
    got = _kernels(be, ain, qn, kn, cos, sin, kc, vc, pos, nh, nkv, hd, rot, eps, max_seq)
    assert np.all(np.isfinite(got)) and rel(got, want) < F32
    kcg, vcg = host(kc), host(vc)
    assert rel(kcg[pos:pos + m], kc_cpu[pos:pos + m]) < F32 and np.array_equal(vcg[pos:pos + m], vc_cpu[pos:pos + m])
    assert np.array_equal(kcg[:pos], kc0[:pos]) and np.array_equal(vcg[:pos], vc0[:pos])   # older rows untouched
    assert np.all(np.isnan(kcg[pos + m:])) and np.all(np.isnan(vcg[pos + m:]))             # rows past the batch too
    kc1, vc1 = dev(kc0), dev(vc0)      # row j alone (after rows < j appended) == row j of the batch
    for j in range(m):
        r = _kernels(be, ain[j:j + 1], qn, kn, cos, sin, kc1, vc1, pos + j, nh, nkv, hd, rot, eps, max_seq)
        assert np.array_equal(r[0], got[j])
