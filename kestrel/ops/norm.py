"""RMSNorms. Zero-centred (Qwen3.5's default): x * rsqrt(mean(x^2) + eps) * (1 + w).
The gated norm inside GDN uses a plain w: w * rmsnorm(o) * silu(z).
All in float32, reduced over the last axis, one row at a time in effect."""
import numpy as np


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
