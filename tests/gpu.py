"""GPU test helpers: CuPy if a GPU is visible, a skip mark otherwise (CI has no GPU)."""
import numpy as np
import pytest

try:
    import cupy as cp
    NDEV = cp.cuda.runtime.getDeviceCount()
except Exception:  # no CuPy, no driver, no device
    cp, NDEV = None, 0



def needs_gpu(fn):
    """Mark a test as a GPU test; it skips cleanly where CuPy sees no GPU."""
    return pytest.mark.gpu(pytest.mark.skipif(NDEV == 0, reason="no CUDA GPU visible to CuPy")(fn))

F32 = 2e-5      # one fp32 op, GPU vs NumPy (another summation order)
MODEL = 1e-4    # a whole fp32 model, CPU vs GPU


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def host(x):
    return x.get() if hasattr(x, "get") and hasattr(x, "__cuda_array_interface__") else np.asarray(x)


def dev(a, dtype=np.float32):
    return cp.asarray(np.ascontiguousarray(a, dtype=dtype))


def finite(x):
    return bool(np.all(np.isfinite(host(x))))


def ctrl(pos=0, slot=0, tokens=()):
    """A ctrl block (kernels/common.cuh) on the device."""
    from kestrel import nvrtc as L
    v = np.zeros(L.CTRL_TOK + max(len(tokens), 1), np.int32)
    v[L.CTRL_POS], v[L.CTRL_SLOT] = pos, slot
    v[L.CTRL_TOK:L.CTRL_TOK + len(tokens)] = tokens
    return cp.asarray(v)


def go(be, launch):
    from kestrel import nvrtc as L
    L.go(launch, be.stream)
    be.sync()
