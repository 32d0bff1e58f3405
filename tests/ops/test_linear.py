"""Projections: the batch-invariant NumPy twin vs float64, and kernels/linear.cu vs its twin:
every row of an M-row launch is bit-identical to that row launched alone, for every epilogue,
for both bf16 kernels (CUDA-core "fma" and tensor-core "tensor") and the fp32 one."""
import numpy as np
import pytest

from gpu import F32, dev, finite, go, host, needs_gpu, rel
from kestrel.cuda import launch as L
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


def test_gemv_kernel_choice_refuses_unknown_names(rng):
    w = rng.integers(0, 1 << 16, (4, 8)).astype(np.uint16)
    with pytest.raises(ValueError, match="bf16_gemv"):
        linear.gemv_launch(w, None, None, 1, 8, 8, 4, bf16_gemv="cublas")


def test_tc_ksplit_depends_on_k_alone():
    for K in (8, 1024, 1032, 4096, 5120, 6144, 10240, 17408):
        assert linear.tc_ksplit(K) in linear.TC_KSPLITS
    assert [linear.tc_ksplit(K) for K in (64, 2048, 2056, 17408)] == [2, 2, 4, 4]


def _weight(be, rng, N, K, wdtype):
    w32 = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    w_host = bf16_to_f32(f32_to_bf16(w32)) if wdtype == "bf16" else w32
    w = be.put_weight("w", w32, wdtype)
    assert w.dtype == (np.uint16 if wdtype == "bf16" else np.float32)
    assert np.array_equal(host(be.weight_f32(w)), w_host)
    return w, w_host


def _gemv(be, w, x, N, epilogue="store", half=0, y0=None, kernel="fma", launcher=None):
    m, K = x.shape
    y = dev(y0) if y0 is not None else be.empty((m, N))
    if launcher is None:
        go(be, linear.gemv_launch(w, dev(x), y, m, K, K, N, epilogue, half, bf16_gemv=kernel))
    else:
        go(be, launcher(w, dev(x), y, m, K, K, N, epilogue, half))
    return host(y)


KERNELS = [("fp32", "fma"), ("bf16", "fma"), ("bf16", "tensor")]
MS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 17)


@pytest.mark.parametrize("wdtype,kernel", KERNELS)
@pytest.mark.parametrize("N,K", [(37, 64), (130, 96), (50, 30), (70, 4100), (300, 5120), (40, 12288), (21, 1032)])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_kernel(be, rng, wdtype, kernel, N, K):
    """y = x·Wᵀ: vs float64 and the NumPy twin; every row of an M-row call == that row alone."""
    w, w_host = _weight(be, rng, N, K, wdtype)
    if kernel == "tensor":     # the tensor-core kernel runs wherever its loads are legal, else the CUDA-core one
        x0, y0 = dev(rng.standard_normal((1, K))), be.empty((1, N))
        tc = linear.tc_eligible(w, K, x0, K)
        assert tc == (K % 8 == 0)
        fn = linear.gemv_launch(w, x0, y0, 1, K, K, N, bf16_gemv="tensor")[0]
        want = linear.gemv_tc_launch(w, x0, y0, 1, K, K, N) if tc else linear.gemv_launch(w, x0, y0, 1, K, K, N,
                                                                                             bf16_gemv="fma")
        assert fn is want[0]
    x = rng.standard_normal((17, K)).astype(np.float32)
    alone = [_gemv(be, w, x[j:j + 1], N, kernel=kernel)[0] for j in range(17)]
    for m in MS:
        y = _gemv(be, w, x[:m], N, kernel=kernel)
        assert y.shape == (m, N) and np.all(np.isfinite(y))
        assert rel(y, x[:m].astype(np.float64) @ w_host.T.astype(np.float64)) < F32, m
        assert rel(y, linear.linear(x[:m], w_host)) < F32
        for j in range(m):
            assert np.array_equal(y[j], alone[j]), (m, j)       # batch invariance, bit-exact


@pytest.mark.parametrize("wdtype,kernel", KERNELS)
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_epilogues(be, rng, wdtype, kernel):
    """y += x·Wᵀ (the residual) and SwiGLU over a stacked [gate; up]: M = 1..8, rows independent of M."""
    I, K = 72, 200
    w, w_host = _weight(be, rng, 2 * I, K, wdtype)
    x = rng.standard_normal((8, K)).astype(np.float32)
    y0 = rng.standard_normal((8, 2 * I)).astype(np.float32)
    add_alone = [_gemv(be, w, x[j:j + 1], 2 * I, "add", y0=y0[j:j + 1], kernel=kernel)[0] for j in range(8)]
    act_alone = [_gemv(be, w, x[j:j + 1], I, "swiglu", half=I, kernel=kernel)[0] for j in range(8)]
    for m in range(1, 9):
        y = _gemv(be, w, x[:m], 2 * I, "add", y0=y0[:m], kernel=kernel)
        assert rel(y, y0[:m] + linear.linear(x[:m], w_host)) < F32
        act = _gemv(be, w, x[:m], I, "swiglu", half=I, kernel=kernel)
        g, u = linear.linear(x[:m], w_host[:I]), linear.linear(x[:m], w_host[I:])
        assert finite(act) and rel(act, mlp.swiglu(g, u)) < F32
        for j in range(m):
            assert np.array_equal(y[j], add_alone[j]) and np.array_equal(act[j], act_alone[j]), (m, j)


@pytest.mark.parametrize("variant", linear.TC_VARIANTS)
@pytest.mark.parametrize("ks", linear.TC_KSPLITS)
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_tensor_variants(be, rng, variant, ks):
    """Every tensor-core variant (tiles a warp, super-chunk, stages, K-split), every epilogue, N and
    K not multiples of a tile or a super-chunk: vs float64, every element written, rows independent of M."""
    I, K = 45, 1064
    w, w_host = _weight(be, rng, 2 * I, K, "bf16")
    x = rng.standard_normal((11, K)).astype(np.float32)
    y0 = rng.standard_normal((11, 2 * I)).astype(np.float32)

    def launcher(*a):
        return linear.gemv_tc_launch(*a, variant=variant, ks=ks)

    ref = x.astype(np.float64) @ w_host.T.astype(np.float64)
    for epi, n, half, y_init, want in (("store", 2 * I, 0, None, ref), ("add", 2 * I, 0, y0, y0 + ref),
                                       ("swiglu", I, I, None, mlp.swiglu(ref[:, :I], ref[:, I:]))):
        alone = [_gemv(be, w, x[j:j + 1], n, epi, half, None if y_init is None else y_init[j:j + 1],
                       launcher=launcher)[0] for j in range(11)]
        for m in (1, 2, 3, 4, 5, 8, 11):
            y = _gemv(be, w, x[:m], n, epi, half, None if y_init is None else y_init[:m], launcher=launcher)
            assert finite(y) and rel(y, want[:m]) < F32, (epi, m)
            for j in range(m):
                assert np.array_equal(y[j], alone[j]), (epi, m, j)


@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_tensor_unaligned_activations_take_the_cuda_core_kernel(be, rng):
    """Activations with a row stride that is not a multiple of 4: the CUDA-core kernel, still right."""
    N, K, ldx = 40, 64, 66
    w, w_host = _weight(be, rng, N, K, "bf16")
    xs = rng.standard_normal((3, ldx)).astype(np.float32)
    X, y = dev(xs), be.empty((3, N))
    launch = linear.gemv_launch(w, X, y, 3, K, ldx, N, bf16_gemv="tensor")
    assert not linear.tc_eligible(w, K, X, ldx)
    assert launch[0] is linear.gemv_launch(w, X, y, 3, K, ldx, N, bf16_gemv="fma")[0]
    with pytest.raises(ValueError, match="tensor-core"):
        linear.gemv_tc_launch(w, X, y, 3, K, ldx, N)
    go(be, launch)
    assert rel(host(y), xs[:, :K].astype(np.float64) @ w_host.T.astype(np.float64)) < F32


@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_tensor_stacked_rows_equal_their_parts(be, rng):
    """A row of a stacked matrix sits at another place in its mma tile than in its own matrix:
    the bits must not change (the stacked projections rely on it), nor for SwiGLU's [gate; up]."""
    K, parts = 320, (37, 50, 8, 19)
    ws = [_weight(be, rng, n, K, "bf16")[0] for n in parts]
    stacked = cp_concat(ws)
    x = rng.standard_normal((5, K)).astype(np.float32)
    ys = _gemv(be, stacked, x, sum(parts), kernel="tensor")
    r0 = 0
    for w, n in zip(ws, parts):
        assert np.array_equal(ys[:, r0:r0 + n], _gemv(be, w, x, n, kernel="tensor"))
        r0 += n
    I = 27
    gate, up = _weight(be, rng, I, K, "bf16")[0], _weight(be, rng, I, K, "bf16")[0]
    act = _gemv(be, cp_concat([gate, up]), x, I, "swiglu", half=I, kernel="tensor")
    g, u = dev(_gemv(be, gate, x, I, kernel="tensor")), dev(_gemv(be, up, x, I, kernel="tensor"))
    out = be.empty((5, I))
    go(be, mlp.swiglu_launch(g, u, out, 5 * I))
    assert np.array_equal(act, host(out))


@pytest.mark.parametrize("kernel", ["fma", "tensor"])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_bf16_wide_range_activations(be, rng, kernel):
    """Activations over 2^±40 in one row: fp32 accuracy (the tensor-core kernel's three bf16
    terms of x must reproduce it exactly, not to bf16's 8 bits)."""
    N, K = 96, 2048
    w, w_host = _weight(be, rng, N, K, "bf16")
    x = (rng.standard_normal((4, K)) * 2.0 ** rng.uniform(-40, 40, (4, K))).astype(np.float32)
    y = _gemv(be, w, x, N, kernel=kernel)
    ref = x.astype(np.float64) @ w_host.T.astype(np.float64)
    assert finite(y)
    for j in range(4):
        assert rel(y[j], ref[j]) < F32, j


def cp_concat(ws):
    import cupy as cp
    return cp.ascontiguousarray(cp.concatenate(ws, axis=0))
