"""SwiGLU: the NumPy twin vs float64, and kernels/mlp.cu vs its twin."""
import numpy as np

from gpu import F32, dev, go, host, needs_gpu, rel
from kestrel.ops import mlp
from reference64 import silu


def test_swiglu(rng):
    g, u = (4 * rng.standard_normal((2, 7, 33))).astype(np.float32)
    assert rel(mlp.swiglu(g, u), silu(g.astype(np.float64)) * u) < F32


@needs_gpu
def test_swiglu_kernel(be, rng, poison):
    g, u = (4 * rng.standard_normal((2, 7, 33))).astype(np.float32)
    y = be.empty(g.shape)
    go(be, mlp.swiglu_launch(dev(g), dev(u), y, g.size))
    assert np.all(np.isfinite(host(y))) and rel(host(y), mlp.swiglu(g, u)) < F32
