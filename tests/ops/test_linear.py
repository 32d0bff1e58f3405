"""Projections: the batch-invariant NumPy twin vs float64, and kernels/linear.cu vs its twin:
every row of an M-row launch is bit-identical to that row launched alone, for every epilogue."""
import numpy as np
import pytest

from gpu import F32, dev, finite, go, host, needs_gpu, rel
from kestrel.ops import linear, mlp
from kestrel.weights import bf16_to_f32, f32_to_bf16


@pytest.mark.parametrize("m", [1, 3, 8, 11])
def test_linear(rng, m):
    x = rng.standard_normal((m, 40)).astype(np.float32)
    w = rng.standard_normal((33, 40)).astype(np.float32)
    assert rel(linear.linear(x, w), x.astype(np.float64) @ w.T.astype(np.float64)) < F32


def test_linear_rows_do_not_depend_on_m(rng):
    x = rng.standard_normal((17, 64)).astype(np.float32)
    w = rng.standard_normal((50, 64)).astype(np.float32)
    alone = np.concatenate([linear.linear(x[j:j + 1], w) for j in range(17)])
    for m in (2, 3, 8, 9, 17):
        assert np.array_equal(linear.linear(x[:m], w), alone[:m]), m


def _weight(be, rng, N, K, wdtype):
    w32 = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    w_host = bf16_to_f32(f32_to_bf16(w32)) if wdtype == "bf16" else w32
    w = be.put_weight("w", w32, wdtype)
    assert w.dtype == (np.uint16 if wdtype == "bf16" else np.float32)
    assert np.array_equal(host(be.weight_f32(w)), w_host)
    return w, w_host


def _gemv(be, w, x, N, epilogue="store", half=0, y0=None):
    m, K = x.shape
    y = dev(y0) if y0 is not None else be.empty((m, N))
    go(be, linear.gemv_launch(w, dev(x), y, m, K, K, N, epilogue, half))
    return host(y)


@pytest.mark.parametrize("wdtype", ["fp32", "bf16"])
@pytest.mark.parametrize("N,K", [(37, 64), (130, 96), (50, 30), (70, 4100), (300, 5120), (40, 12288)])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_kernel(be, rng, wdtype, N, K):
    """y = x·Wᵀ: vs float64 and the NumPy twin; every row of an M-row call == that row alone."""
    w, w_host = _weight(be, rng, N, K, wdtype)
    x = rng.standard_normal((17, K)).astype(np.float32)
    alone = [_gemv(be, w, x[j:j + 1], N)[0] for j in range(9)]
    for m in (1, 2, 3, 4, 5, 8, 9, 17):
        y = _gemv(be, w, x[:m], N)
        assert y.shape == (m, N) and np.all(np.isfinite(y))
        assert rel(y, x[:m].astype(np.float64) @ w_host.T.astype(np.float64)) < F32, m
        assert rel(y, linear.linear(x[:m], w_host)) < F32
        for j in range(min(m, 9)):
            assert np.array_equal(y[j], alone[j]), (m, j)       # batch invariance, bit-exact


@pytest.mark.parametrize("wdtype", ["fp32", "bf16"])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_epilogues(be, rng, wdtype):
    """y += x·Wᵀ (the residual) and SwiGLU over a stacked [gate; up]; rows independent of M."""
    I, K = 72, 64
    w, w_host = _weight(be, rng, 2 * I, K, wdtype)
    x = rng.standard_normal((4, K)).astype(np.float32)
    y0 = rng.standard_normal((4, 2 * I)).astype(np.float32)
    for m in (1, 3, 4):
        y = _gemv(be, w, x[:m], 2 * I, "add", y0=y0[:m])
        assert rel(y, y0[:m] + linear.linear(x[:m], w_host)) < F32
        act = _gemv(be, w, x[:m], I, "swiglu", half=I)
        g, u = linear.linear(x[:m], w_host[:I]), linear.linear(x[:m], w_host[I:])
        assert finite(act) and rel(act, mlp.swiglu(g, u)) < F32
        alone = np.concatenate([_gemv(be, w, x[j:j + 1], I, "swiglu", half=I) for j in range(m)])
        assert np.array_equal(act, alone)
