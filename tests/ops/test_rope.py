"""Partial NeoX RoPE vs float64 (on the GPU it is part of kernels/attention.cu: tests/ops/test_attention.py)."""
import numpy as np

from gpu import F32, rel
from kestrel.ops import rope
from reference64 import rope_row


def test_rope_partial_neox(rng):
    hd, rot, theta = 32, 8, 1e4
    x = rng.standard_normal((4, 3, hd)).astype(np.float32)
    pos = rng.integers(0, 500, 4)
    cos, sin = rope.rope_tables(rot, theta, 600)
    got = rope.apply_rope(x, cos[pos], sin[pos])
    ref = np.stack([rope_row(x[j], pos[j], rot, theta) for j in range(4)])
    assert rel(got, ref) < F32
    assert np.array_equal(got[..., rot:], x[..., rot:])  # the unrotated channels pass through
