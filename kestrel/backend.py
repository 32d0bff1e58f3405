"""Backends: NumPy (CPU, the reference) or CuPy (CUDA, kernels/*.cu), chosen once per model.

A backend is a small object whose methods are the ops the model calls. The CPU backend
below calls the NumPy twins in kestrel/ops; kestrel/cuda.py implements the same methods
with our kernels. Model and engine code never touch numpy/cupy directly for math.
"""
from __future__ import annotations

import platform
import time

import numpy as np

from .errors import DeviceError
from .weights import bf16_to_f32, f32_to_bf16
from .ops import attention as _attn
from .ops import gdn as _gdn
from .ops import linear as _linear
from .ops import mlp as _mlp
from .ops import norm as _norm
from .ops import rope as _rope


def _single_threaded_blas():
    """Run BLAS on one thread (process-wide). kestrel's projections are small GEMMs (8 rows),
    where handing work to a second thread costs more than it saves, and OpenBLAS threads that
    spin-wait on a busy 2-core machine made a tiny-model token take 645 ms instead of 10 ms
    (measured 2026-11-30). Results do not depend on it: each output element's reduction order
    is the same on one thread or several."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")


class CPUBackend:
    name = "cpu"
    xp = np

    def __init__(self):
        self.device_name = f"CPU ({platform.machine()}, NumPy {np.__version__})"
        _single_threaded_blas()

    # ---- memory ---------------------------------------------------------------------
    def put_weight(self, name: str, a: np.ndarray, dtype: str = "fp32"):
        """Weights live in float32. dtype='bf16' rounds the projection matrices through bf16
        first (RNE), so the CPU computes with exactly the weights a bf16 GPU run holds."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "bf16" and a.ndim == 2:
            a = bf16_to_f32(f32_to_bf16(a))
        return a

    def asarray(self, a, dtype=np.float32):
        return np.ascontiguousarray(a, dtype=dtype)

    def zeros(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a)

    def sync(self):
        pass

    def now(self):
        """A timestamp; elapsed_ms(a, b) gives ms between two. (CUDA: device events.)"""
        return time.perf_counter()

    def elapsed_ms(self, a, b) -> float:
        return (b - a) * 1e3

    # ---- ops --------------------------------------------------------------------------
    def embed(self, table, tokens):
        return table[np.asarray(tokens, dtype=np.int64)].astype(np.float32)

    def linear(self, x, w):
        return _linear.linear(x, w)

    def rmsnorm(self, x, w, eps):
        return _norm.rmsnorm(x, w, eps)

    def add(self, a, b):
        return a + b

    def swiglu(self, gate, up):
        return _mlp.swiglu(gate, up)

    def attn_core(self, qg, k, v, q_norm, k_norm, cos, sin, kc, vc, pos, eps, scale):
        """qg [M, nh, 2hd] = [query | gate] per head; k/v [M, nkv, hd] raw projections.
        q/k RMSNorm (zero-centred) -> partial RoPE -> append K/V at rows pos.. -> causal
        attention over rows < pos+j+1 -> * sigmoid(gate). Returns [M, nh*hd]."""
        M, nh, hd2 = qg.shape
        hd = hd2 // 2
        q = _rope.apply_rope(_norm.rmsnorm(qg[..., :hd], q_norm, eps), cos, sin)
        k = _rope.apply_rope(_norm.rmsnorm(k, k_norm, eps), cos, sin)
        kc[pos:pos + M] = k
        vc[pos:pos + M] = v
        o = _attn.attention_rows(q, kc, vc, pos, scale)
        return o * _norm.sigmoid(np.ascontiguousarray(qg[..., hd:]).reshape(M, nh * hd))

    def gdn_core(self, sh, qkv, z, b, a, conv_w, A_log, dt_bias, norm_w, S, hist, S_slots=None, hist_slots=None):
        return _gdn.gdn_rows(sh, qkv, z, b, a, conv_w.reshape(conv_w.shape[0], -1), A_log, dt_bias, norm_w,
                             S, hist, S_slots, hist_slots)

    def argmax(self, logits) -> np.ndarray:
        return np.argmax(np.asarray(logits), axis=-1)

    def rope_tables(self, rot_dim, theta, n_pos):
        return _rope.rope_tables(rot_dim, theta, n_pos)


def cuda_available() -> bool:
    try:
        import cupy  # noqa: F401
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def get_backend(device: str = "auto"):
    if device not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"unknown device {device!r}; use 'auto', 'cpu' or 'cuda'")
    if device == "cpu" or (device == "auto" and not cuda_available()):
        return CPUBackend()
    if not cuda_available():
        raise DeviceError("device='cuda' but no CUDA GPU is visible to CuPy (is cupy installed and a GPU present?)")
    from .cuda import CUDABackend  # noqa: PLC0415 (only on GPU machines)
    return CUDABackend()
