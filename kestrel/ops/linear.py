"""Dense projection y = x · Wᵀ, batch-invariant (NumPy twin and launcher of kernels/linear.cu).

BLAS picks a different kernel (gemv vs gemm, other blockings) for different M, and a
different kernel sums in a different order: row j of a 3-row call would then differ in
the last bit from the same row alone. So on the CPU every projection runs on blocks of
exactly ROWS rows (zero padded): one GEMM shape for every call, so a row's result never
depends on how many rows came with it. On the GPU, kernels/linear.cu sums each row in an
order fixed by K alone (its header says how).
"""
import numpy as np

from ..cuda import launch as L

ROWS = 8                # one fixed CPU GEMM shape; >= any verify width kestrel uses (k <= 8)
LINEAR_THREADS = 128    # 4 warps a block
CUDA_DEFINES = {"LINEAR_THREADS": LINEAR_THREADS}
EPI = {"store": 0, "add": 1, "swiglu": 2}


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [M, K] float32, w [N, K] float32 -> [M, N] float32."""
    m, k = x.shape
    out = np.empty((m, w.shape[0]), np.float32)
    block = np.zeros((ROWS, k), np.float32)
    wt = w.T
    for s in range(0, m, ROWS):
        n = min(ROWS, m - s)
        block[:n] = x[s:s + n]
        block[n:] = 0.0
        out[s:s + n] = (block @ wt)[:n]
    return out


def ksplit(K: int) -> int:
    """Warps that share one output row's K range: from K alone, so the order is fixed
    (chosen by a sweep on the H200, results/cuda_notes.md)."""
    return L.KSPLIT_BY_K.get(K) or (1 if K < 4096 else 2)


def gemv_launch(W, X, Y, M: int, K: int, ldx: int, ldy: int, epilogue: str = "store", half: int = 0):
    """(fn, grid, block, args, smem) for Y (op)= X · Wᵀ over M rows.

    W [N, K] (uint16 bf16 bits or float32, C-contiguous rows), X [M, ldx], Y [M, ldy].
    epilogue: store, add (Y += X·Wᵀ, the residual) or swiglu over W = [gate; up] (half = gate rows)."""
    bf16 = W.dtype == np.uint16
    N, ldw = W.shape[0], W.strides[0] // W.itemsize
    v = 8 if bf16 else 4
    vec = v if (K % v == 0 and ldw % v == 0 and ldx % 4 == 0 and W.data.ptr % 16 == 0
                and X.data.ptr % 16 == 0) else 1
    mt = 1 if M == 1 else (4 if (M <= 4 and vec > 1) else 8)
    rr = 8 if mt == 8 else 4
    epi = EPI[epilogue]
    rl = rr // 2 if epi == 2 else rr
    ks = ksplit(K)
    nout = half if epi == 2 else N
    grid = (L.cdiv(nout, rl * ((LINEAR_THREADS // 32) // ks)), L.cdiv(M, mt))
    fn = L.kernel("linear", f"gemv_{'bf16' if bf16 else 'f32'}_v{vec}_m{mt}_e{epi}")
    args = (L.ptr(W), L.i32(ldw), L.ptr(X), L.i32(ldx), L.ptr(Y), L.i32(ldy), L.i32(nout), L.i32(K), L.i32(M),
            L.i32(half), L.i32(ks))
    return fn, grid, (LINEAR_THREADS,), args, 0
