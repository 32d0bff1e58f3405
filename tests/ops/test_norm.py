"""RMSNorms: the NumPy twins vs float64, and kernels/norm.cu vs its twin."""
import numpy as np
import pytest

from gpu import F32, dev, go, host, needs_gpu, rel
from kestrel.ops import norm
from reference64 import rmsnorm_zc, silu


def test_rmsnorm_zero_centred(rng):
    x = rng.standard_normal((5, 3, 48)).astype(np.float32) * 3
    w = (0.2 * rng.standard_normal(48)).astype(np.float32)
    assert rel(norm.rmsnorm(x, w, 1e-6), rmsnorm_zc(x, w, 1e-6)) < F32


def test_gated_norm(rng):
    o, z = rng.standard_normal((2, 4, 24)).astype(np.float32)
    w = (1 + 0.2 * rng.standard_normal(24)).astype(np.float32)
    ref = w * (o / np.sqrt((o.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)) * silu(z.astype(np.float64))
    assert rel(norm.gated_rmsnorm(o, z, w, 1e-6), ref) < F32


@pytest.mark.parametrize("n", [48, 1000, 9000])
@pytest.mark.parametrize("col", [0, 7])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_rmsnorm_kernel(be, rng, n, col):
    """rows of a strided input into a column range of a wider output (the MTP's concatenation)."""
    rows = 5
    x = (3 * rng.standard_normal((rows, n + 3))).astype(np.float32)
    w = (0.2 * rng.standard_normal(n)).astype(np.float32)
    y = be.empty((rows, n + col))
    go(be, norm.rmsnorm_launch(dev(x), n + 3, dev(w), y[:, col:], n + col, rows, n, 1e-6))
    got = host(y)
    assert np.all(np.isfinite(got[:, col:])) and rel(got[:, col:], norm.rmsnorm(x[:, :n], w, 1e-6)) < F32
    if col:
        assert np.all(np.isnan(got[:, :col]))          # columns before the range untouched
