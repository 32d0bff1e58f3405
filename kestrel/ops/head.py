"""Token embedding, argmax over the vocabulary, and bf16 rounding on the device (NumPy twins
and launchers of kernels/head.cu; the host bf16 rounding is f32_to_bf16 in kestrel/weights.py).

    embed   y[m] = table[tok[m]] (widened to float32)
    argmax  the smallest index of the largest value of each row (NaN counts as largest)
"""
import numpy as np

from .. import nvrtc as L

EMBED_THREADS = 256
ARGMAX_THREADS = 1024
BF16_THREADS = 256
CUDA_DEFINES = {"EMBED_THREADS": EMBED_THREADS, "ARGMAX_THREADS": ARGMAX_THREADS, "BF16_THREADS": BF16_THREADS}
L.register("head", CUDA_DEFINES)


def embed(table: np.ndarray, tokens) -> np.ndarray:
    return table[np.asarray(tokens, dtype=np.int64)].astype(np.float32)


def argmax(logits: np.ndarray) -> np.ndarray:
    return np.argmax(logits, axis=-1)


def embed_launch(table, tok, Y, ldy: int, M: int):
    """Y[m, :H] = table[tok[m]] for M rows; tok int32 (the ctrl block's token words)."""
    name = "embed_bf16" if table.dtype == np.uint16 else "embed_f32"
    args = (L.ptr(table), L.ptr(tok), L.ptr(Y), L.i32(ldy), L.i32(table.shape[1]))
    return L.kernel("head", name), (M,), (EMBED_THREADS,), args, 0


def argmax_launch(X, ldx: int, rows: int, n: int, out):
    """out[r] (int64) = argmax of X[r, :n] for `rows` rows."""
    return L.kernel("head", "argmax_rows"), (rows,), (ARGMAX_THREADS,), (L.ptr(X), L.i32(ldx), L.i32(n), L.ptr(out)), 0


def to_bf16_launch(src, scale: float, out, n: int):
    """out (uint16 bf16 bits) = round-to-nearest-even(src * scale), n elements."""
    grid = (min(L.cdiv(n, BF16_THREADS), 65535 * 8),)
    return L.kernel("head", "f32_to_bf16"), grid, (BF16_THREADS,), (L.ptr(src), L.f32(scale), L.ptr(out), L.i64(n)), 0
