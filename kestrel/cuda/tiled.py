"""The kernel option tiled_only: a projection kept only as its tiled copy (linear.tmb_tiled).

Under gemv="tmb" the engine reads every eligible projection from its tiled copy, so the original
matrix is dead weight, as many bytes again as the copy. drop_original replaces every
reference to it by a linear.TiledOnly, which carries the shape and dtype the launchers read and
refuses to be read back; CuPy frees the original once the caller lets go of it.
"""
from __future__ import annotations

import cupy as cp

from ..ops import linear as _linear


def drop_original(model, stacks: dict, W, tiled) -> bool:
    """Replace every reference `model` and its backend's `stacks` hold to W (a stack, a weight, or
    row views of W) by a linear.TiledOnly (the one of W's own shape and address carries `tiled`).
    Not where the embedding lookup reads W's rows (a tied head). True if dropped."""
    lo, hi = int(W.data.ptr), int(W.data.ptr) + int(W.nbytes)

    def inside(a):
        return isinstance(a, cp.ndarray) and a.size and lo <= int(a.data.ptr) < hi

    emb = model.w.get("embed_tokens.weight")
    if isinstance(emb, cp.ndarray) and int(emb.data.ptr) < hi and lo < int(emb.data.ptr) + int(emb.nbytes):
        return False     # W and the embedding share memory

    def marker(name, a):
        same = int(a.data.ptr) == lo and a.shape == W.shape
        return _linear.TiledOnly(name, a.shape, tiled if same else None)

    for name, a in list(stacks.items()):
        if inside(a):
            stacks[name] = marker(name, a)
    for name, a in list(model.w.items()):
        if inside(a):
            model.w[name] = marker(name, a)
    if inside(model.head):
        model.head = marker("head", model.head)
    return True
