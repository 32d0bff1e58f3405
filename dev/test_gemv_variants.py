"""The GEMV variants of dev/gemv_variants.py on a GPU (skipped without one): every swept shape and K
split sums in its family's order, so gives the engine kernel's bits; gemv_tc against float64 and
row by row. Run from the repository root: python3 -m pytest -q dev/test_gemv_variants.py"""
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "dev")]
from gpu import F32, dev, finite, go, host, needs_gpu, rel  # noqa: E402
from kestrel.ops import linear, mlp  # noqa: E402
from kestrel.weights import bf16_to_f32, f32_to_bf16  # noqa: E402

import gemv_variants as V  # noqa: E402



@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % 10 ** 6
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def be():
    from kestrel.cuda import CUDABackend
    return CUDABackend()


def _weight(be, rng, N, K):
    w32 = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    return be.put_weight("w", w32, "bf16"), bf16_to_f32(f32_to_bf16(w32))


def _run(be, launch_of, x, n, epi="store", half=0, y_init=None):
    m = x.shape[0]
    y = dev(y_init) if y_init is not None else be.empty((m, n))
    go(be, launch_of(dev(x), y, m))
    return host(y)


def test_tc_ksplit_depends_on_k_alone():
    assert [V.tc_ksplit(K) for K in (64, 2048, 2056, 17408)] == [2, 2, 4, 4]


@pytest.mark.parametrize("variant", V.TC_VARIANTS)
@pytest.mark.parametrize("ks", V.TC_KSPLITS)
@needs_gpu
def test_gemv_tc_variants(be, rng, variant, ks):
    """Every gemv_tc variant, every epilogue, N and K not multiples of a tile or a super-chunk:
    vs float64, every element written, rows independent of M."""
    I, K = 45, 1064
    w, w_host = _weight(be, rng, 2 * I, K)
    x = rng.standard_normal((11, K)).astype(np.float32)
    y0 = rng.standard_normal((11, 2 * I)).astype(np.float32)
    ref = x.astype(np.float64) @ w_host.T.astype(np.float64)
    for epi, n, half, y_init, want in (("store", 2 * I, 0, None, ref), ("add", 2 * I, 0, y0, y0 + ref),
                                       ("swiglu", I, I, None, mlp.swiglu(ref[:, :I], ref[:, I:]))):
        def launch_of(X, Y, m):
            return V.gemv_tc_launch(w, X, Y, m, K, K, n, epi, half, variant=variant, ks=ks)
        alone = [_run(be, launch_of, x[j:j + 1], n, epi, half, None if y_init is None else y_init[j:j + 1])[0]
                 for j in range(11)]
        for m in (1, 2, 3, 4, 5, 8, 11):
            y = _run(be, launch_of, x[:m], n, epi, half, None if y_init is None else y_init[:m])
            assert finite(y) and rel(y, want[:m]) < F32, (epi, m)
            for j in range(m):
                assert np.array_equal(y[j], alone[j]), (epi, m, j)


@needs_gpu
def test_swept_shapes_give_the_engine_kernels_bits(be, rng):
    """Every CUDA-core shape of GEMV_FMA_SWEEP (each K split), every gemv_tmb shape of TMB_ALL and
    every gemv_tcg shape of TCG_SWEEP: the bits of the engine's own launch (linear.gemv_launch) for
    M = 1, 3, 8."""
    N, K = 70, 1056
    w, _ = _weight(be, rng, N, K)
    x = rng.standard_normal((8, K)).astype(np.float32)
    tiled = linear.tmb_tiled(w, K)
    for m in (1, 3, 8):
        want_fma = _run(be, lambda X, Y, mm: linear.gemv_launch(w, X, Y, mm, K, K, N, gemv="fma"), x[:m], N)
        for shape in V.GEMV_FMA_SWEEP:
            got = _run(be, lambda X, Y, mm: V.gemv_fma_launch(w, X, Y, mm, K, K, N, fma=shape), x[:m], N)
            assert np.array_equal(got, want_fma), (m, shape)
        want_tmb = _run(be, lambda X, Y, mm: linear.gemv_launch(w, X, Y, mm, K, K, N, gemv="tmb", tiled=tiled),
                        x[:m], N)
        for shape in V.TMB_ALL:
            try:
                got = _run(be, lambda X, Y, mm: V.gemv_tiled_launch("tmb", w, tiled, X, Y, mm, K, K, N, shape=shape),
                           x[:m], N)
            except Exception as e:
                raise AssertionError(f"gemv_tmb shape {shape}, M = {m}: {e}") from e
            assert np.array_equal(got, want_tmb), (m, shape)
        for shape in V.TCG_SWEEP:
            got = _run(be, lambda X, Y, mm: V.gemv_tiled_launch("tcg", w, tiled, X, Y, mm, K, K, N, shape=shape),
                       x[:m], N)
            assert np.array_equal(got, want_tmb), (m, shape)
