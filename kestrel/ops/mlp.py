"""SwiGLU MLP core: silu(gate) * up (NumPy twin and launcher of kernels/mlp.cu; the
projections are ops.linear, whose "swiglu" epilogue computes the same formula)."""
from .. import nvrtc as L
from .norm import silu

MLP_THREADS = 256
CUDA_DEFINES = {"MLP_THREADS": MLP_THREADS}
L.register("mlp", CUDA_DEFINES)


def swiglu(gate, up):
    return silu(gate) * up


def swiglu_launch(G, U, Y, n: int):
    """Y[i] = silu(G[i]) * U[i] over n contiguous elements (grid-stride)."""
    grid = (min(L.cdiv(n, MLP_THREADS), 65535 * 8),)
    return L.kernel("mlp", "swiglu"), grid, (MLP_THREADS,), (L.ptr(G), L.ptr(U), L.ptr(Y), L.i64(n)), 0
