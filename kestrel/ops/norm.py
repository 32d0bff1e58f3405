"""RMSNorms (NumPy twins; the launcher of kernels/norm.cu).

Zero-centred (Qwen3.5's default): x * rsqrt(mean(x^2) + eps) * (1 + w). The gated norm inside
GDN uses a plain w: w * rmsnorm(o) * silu(z) (its kernel is part of kernels/gdn.cu).
All in float32, reduced over the last axis, one row at a time in effect."""
import numpy as np

from .. import nvrtc as L

NORM_THREADS = 256
NORM_PER = 32          # elements a thread keeps in registers: rows up to NORM_PER * NORM_THREADS
CUDA_DEFINES = {"NORM_THREADS": NORM_THREADS, "NORM_PER": NORM_PER}
L.register("norm", CUDA_DEFINES)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32, copy=False)
    var = np.mean(x * x, axis=-1, keepdims=True)
    return (x * (np.float32(1.0) / np.sqrt(var + np.float32(eps)))) * (np.float32(1.0) + w)


def gated_rmsnorm(o: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(o * o, axis=-1, keepdims=True)
    return (w * (o * (np.float32(1.0) / np.sqrt(var + np.float32(eps))))) * silu(z)


def rmsnorm_launch(X, ldx, w, Y, ldy, rows: int, n: int, eps: float):
    """Y[r, :n] = rmsnorm(X[r, :n]) * (1 + w) for `rows` rows (row strides ldx, ldy)."""
    args = (L.ptr(X), L.i32(ldx), L.ptr(w), L.ptr(Y), L.i32(ldy), L.i32(n), L.f32(eps))
    return L.kernel("norm", "rmsnorm_zc"), (rows,), (NORM_THREADS,), args, 0
