"""Partial NeoX RoPE: the first rot = int(hd * partial_rotary_factor) channels of each head
rotate as two halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin); the rest pass.
Tables are computed once in float64 and stored float32, so every call reads the same bits."""
import numpy as np


def rope_tables(rot_dim: int, theta: float, n_pos: int):
    inv = 1.0 / (theta ** (np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim))
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [M, heads, hd]; cos/sin [M, rot/2] rows for the M positions."""
    h = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :h], x[..., h:2 * h]
    out = x.copy()
    out[..., :h] = x1 * c - x2 * s
    out[..., h:2 * h] = x2 * c + x1 * s
    return out
