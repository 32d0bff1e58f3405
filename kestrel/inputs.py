"""Checks of what a caller hands the engine: token ids, hidden-state rows, sizes.

Pure functions: each returns a clean value or raises a named kestrel error, and touches no
state, so an entry that calls them before doing anything leaves the engine bit-identical
when they raise. The rules, the same everywhere:

  token ids   Python ints and NumPy integers (scalars or arrays, or object arrays holding
              them); never bools (True is not token 1), floats, strings or bytes; each in
              [0, vocab). Values too large for int64 are out of range, not an OverflowError.
  hidden rows finite real floating values (float16/32/64) of exactly the expected shape;
              never NaN/Inf, complex, bool, integer or object arrays. Returned as float32.
  sizes       Python ints or NumPy integers (never bools), in a stated [lo, hi].
  positions   the same; converted to a Python int before any arithmetic, so a NumPy int8 or
              uint8 never wraps (127 + 1 in int8 is -128) and every stored cursor is an int.

`is_int` is the package's one integer check (config, engine, draft, speculative and lab use it).
"""
from __future__ import annotations

import numbers

import numpy as np

from .errors import KestrelError, TokenError


def is_int(x) -> bool:
    """A Python or NumPy integer scalar; bools (Python or NumPy) are not integers here."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _host(x):
    """A device array (CuPy) as a host array; anything else unchanged."""
    if hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):
        return x.get()
    return x


def _kind(x) -> str:
    return type(x).__name__


def token_ids(x, vocab: int, what: str) -> np.ndarray:
    """An int, or a non-empty 1-D sequence/array of ints -> int64 array of ids in [0, vocab)."""
    x = _host(x)
    if isinstance(x, (str, bytes, bytearray)):
        raise TokenError(f"{what}: tokens must be ints, got a {_kind(x)} {x!r:.40} (encode text with a tokenizer first)")
    if isinstance(x, (bool, np.bool_)):
        raise TokenError(f"{what}: token ids must be ints, got the bool {x!r}")
    if is_int(x):
        values = [int(x)]
    elif isinstance(x, np.ndarray) or not isinstance(x, (list, tuple, range)):
        try:
            arr = x if isinstance(x, np.ndarray) else np.asarray(x)
        except Exception:
            raise TokenError(f"{what}: tokens must be an int or a 1-D sequence of ints, got a {_kind(x)}") from None
        if arr.ndim == 0 and not isinstance(x, np.ndarray):
            raise TokenError(f"{what}: tokens must be an int or a 1-D sequence of ints, got a {_kind(x)}")
        if arr.dtype.kind == "b":
            raise TokenError(f"{what}: token ids must be ints, got a bool array")
        if arr.ndim > 1:
            raise TokenError(f"{what}: tokens must be a 1-D sequence of ints, got shape {list(arr.shape)}")
        if arr.dtype.kind in "iu":
            flat = arr.reshape(-1)
            if flat.size == 0:
                raise TokenError(f"{what}: tokens must be a non-empty 1-D sequence of ints, got shape {list(arr.shape)}")
            bad = (flat < 0) | (flat >= vocab)   # compared in the array's own dtype: no wrap-around
            if bad.any():
                raise TokenError(f"{what}: token id {int(flat[bad][0])} out of range [0, {vocab})")
            return flat.astype(np.int64)
        if arr.dtype.kind != "O":
            raise TokenError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
        values = arr.reshape(-1).tolist() if arr.ndim else [arr.item()]
        return _checked(values, vocab, what)
    else:
        values = list(x)
        if not values:
            raise TokenError(f"{what}: tokens must be a non-empty 1-D sequence of ints, got an empty {_kind(x)}")
    return _checked(values, vocab, what)


def _checked(values: list, vocab: int, what: str) -> np.ndarray:
    out = []
    for v in values:
        if isinstance(v, np.ndarray) and v.ndim == 0:
            v = v[()]
        if isinstance(v, (bool, np.bool_)):
            raise TokenError(f"{what}: token ids must be ints, got the bool {v!r} in the sequence")
        if not is_int(v):
            if isinstance(v, (list, tuple, np.ndarray)):
                raise TokenError(f"{what}: tokens must be a 1-D sequence of ints, got a nested {_kind(v)}")
            raise TokenError(f"{what}: token ids must be ints, got {v!r:.40} ({_kind(v)})")
        v = int(v)
        if not 0 <= v < vocab:
            raise TokenError(f"{what}: token id {v} out of range [0, {vocab})")
        out.append(v)
    if not out:
        raise TokenError(f"{what}: tokens must be a non-empty 1-D sequence of ints")
    return np.asarray(out, dtype=np.int64)


def hidden_rows(x, shape: tuple, what: str, xp=np, finite: bool = True):
    """Hidden-state rows: finite real floats of exactly `shape` -> a float32 array.

    A device array (it has __cuda_array_interface__) is checked where it lives, with `xp`
    (the backend's array module), and returned on the device; anything else is checked
    and returned on the host. finite=False leaves the NaN/Inf check to the caller
    (all_finite, which checks several arrays with one wait for the device)."""
    shape = tuple(shape)
    device = hasattr(x, "__cuda_array_interface__")
    mod = xp if device else np
    if isinstance(x, (list, tuple)):
        # Element types first: np.asarray would quietly turn True into 1.0 and 3 into 3.0.
        flat = np.asarray(x, dtype=object)
        if flat.shape != shape:
            raise TokenError(f"{what} has shape {list(flat.shape)}, expected {list(shape)}")
        bad = [v for v in flat.reshape(-1) if not isinstance(v, (float, np.floating)) or isinstance(v, bool)]
        if bad:
            raise TokenError(f"{what} must hold real floats, got {bad[0]!r:.40} ({_kind(bad[0])})")
        arr = np.asarray(flat.tolist(), dtype=np.float64)
    elif device or isinstance(x, np.ndarray) or isinstance(x, np.floating):
        arr = x
    else:
        raise TokenError(f"{what} must be a float array of shape {list(shape)}, got a {_kind(x)}")
    got = tuple(getattr(arr, "shape", ()))
    if got != shape:
        raise TokenError(f"{what} has shape {list(got)}, expected {list(shape)}")
    kind = np.dtype(arr.dtype).kind
    if kind != "f":
        names = {"c": "a complex", "b": "a bool", "O": "an object", "i": "an integer", "u": "an integer"}
        raise TokenError(f"{what} must be real floats, got {names.get(kind, 'a ' + str(arr.dtype))} array "
                         f"(dtype {arr.dtype})")
    with np.errstate(over="ignore"):   # an overflow to Inf is reported below, by name
        out = mod.ascontiguousarray(arr, dtype=np.float32)
    if out is arr:
        out = out.copy()  # the engine keeps no reference to the caller's array
    if finite:
        all_finite([(out, what)], mod)
    return out


def all_finite(arrays, xp=np):
    """TokenError naming the first of [(float32 array, what)] that holds a NaN or an Inf. The
    arrays live where xp computes; their flags come back in one read (one wait for a device)."""
    flags = xp.stack([xp.isfinite(a).all() for a, _ in arrays])
    ok = flags.get() if hasattr(flags, "get") else np.asarray(flags)
    for good, (_, what) in zip(ok, arrays):
        if not good:      # checked after the cast: 1e300 in float64 is Inf in float32
            raise TokenError(f"{what} contains NaN or Inf (as float32)")


def count(x, what: str, lo: int = 0, hi: int | None = None, bound: str | None = None,
          error: type = KestrelError) -> int:
    """A size, count or position: an int (Python or NumPy, never a bool) in [lo, hi] -> a Python int.

    bound: where hi comes from, for the message (e.g. "the model's max_position_embeddings").
    error: the KestrelError subclass to raise."""
    if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "iu":
        x = x[()]
    rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
    if bound and hi is not None:
        rng += f" ({hi} = {bound})"
    if not is_int(x):
        raise error(f"{what} must be an int {rng}, got {x!r:.40} ({_kind(x)})")
    v = int(x)
    if v < lo or (hi is not None and v > hi):
        raise error(f"{what} must be an int {rng}, got {v}")
    return v
