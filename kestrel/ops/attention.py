"""Gated attention decode over a KV cache with a cursor (NumPy twin of kernels/attention.cu).

Row j of a batch starting at position pos sits at position pos + j and attends to cache rows
0 .. pos + j (causal inside the batch: its own K/V were appended first). Rows at or past the
cursor are never read. GQA: query head i reads kv head i // (nh / nkv). Scores are scaled by
hd^-0.5, softmax in fp32. Each row is computed by the same calls whatever M is.
"""
import numpy as np


def attention_rows(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos: int, scale: float) -> np.ndarray:
    """q [M, nh, hd] (normed, rotated); kc/vc [max_seq, nkv, hd] with rows < pos + M valid.
    Returns [M, nh * hd]."""
    M, nh, hd = q.shape
    nkv = kc.shape[1]
    g = nh // nkv
    out = np.empty((M, nh * hd), np.float32)
    for j in range(M):
        L = pos + j + 1
        K = np.ascontiguousarray(kc[:L].transpose(1, 2, 0))     # [nkv, hd, L]
        V = np.ascontiguousarray(vc[:L].transpose(1, 0, 2))     # [nkv, L, hd]
        s = (q[j].reshape(nkv, g, hd) @ K) * np.float32(scale)  # [nkv, g, L]
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        out[j] = (p @ V).reshape(-1)
    return out
