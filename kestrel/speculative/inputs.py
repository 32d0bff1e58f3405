"""The speculative driver's argument checks: each raises a named error before any engine state changes.

Sizes (T, k) are ints: Python or NumPy integers, never bools, floats or strings. Token ids
(prompts, reference streams) likewise, each in [0, vocab_size). A run never reaches past the
model's max_position_embeddings.
"""
from __future__ import annotations

import numpy as np

from ..errors import TokenError
from ..inputs import is_int
from .errors import SpecArgumentError


def check_size(x, name: str, lo: int = 1) -> int:
    if not is_int(x) or x < lo:
        raise SpecArgumentError(f"{name} must be an int >= {lo}, got {x!r}")
    return int(x)


def check_length(T, model, P: int) -> int:
    """T tokens after P prompt tokens: positions 0..P+T-1 must exist in the model."""
    T = check_size(T, "T")
    limit = model.cfg.max_position_embeddings
    if P + T > limit:
        raise SpecArgumentError(f"T={T} after a prompt of {P} tokens needs {P + T} positions; the model has "
                                f"max_position_embeddings={limit}")
    return T


def check_tokens(tokens, model, what: str, allow_empty: bool = False) -> list:
    """A 1-D sequence of int token ids in [0, vocab_size) -> a list of Python ints."""
    if isinstance(tokens, (str, bytes, dict)) or not hasattr(tokens, "__len__"):
        raise TokenError(f"{what} must be a list of int token ids, got {type(tokens).__name__}")
    if isinstance(tokens, np.ndarray) and tokens.ndim != 1:
        raise TokenError(f"{what} must be 1-D, got shape {tokens.shape}")
    out = []
    V = model.cfg.vocab_size
    for i, t in enumerate(tokens):
        if not is_int(t):
            raise TokenError(f"{what}[{i}] = {t!r} is not an int token id")
        if not 0 <= t < V:
            raise TokenError(f"{what}[{i}] = {int(t)} is outside the vocabulary [0, {V})")
        out.append(int(t))
    if not out and not allow_empty:
        raise TokenError(f"the {what} needs at least one token")
    return out
