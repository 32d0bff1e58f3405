"""Dense projection y = x @ W^T, batch-invariant.

BLAS picks a different kernel (gemv vs gemm, other blockings) for different M, and a
different kernel sums in a different order: row j of a 3-row call would then differ in
the last bit from the same row alone. So every projection runs on blocks of exactly
ROWS rows (zero padded): one GEMM shape for every call, so a row's result never depends
on how many rows came with it.
"""
import numpy as np

ROWS = 8  # one fixed GEMM shape; >= any verify width kestrel uses (k <= 8)


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
