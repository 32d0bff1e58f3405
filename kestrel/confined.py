"""Opening the files of a model directory, and nothing outside it.

A checkpoint directory names its own files (config.json, the shard index, the shards). A name
inside those files is data, so every file kestrel opens for a checkpoint goes through here:
the name must be relative, without `..`, must resolve (symlinks followed) to a path inside
the directory, and must be a regular file. The checks run before the file is opened, so a
name such as `/dev/zero`, `../other/model.safetensors` or a FIFO is refused without a read.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath

from .errors import CheckpointError, CheckpointNotFoundError

# The open flags: never follow a symlink swapped in after the checks, never block on a FIFO.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def model_root(path) -> Path:
    """The model directory, symlinks resolved: the directory actually read."""
    p = Path(path)
    try:
        root = p.resolve(strict=True)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"checkpoint directory {p} does not exist") from None
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop
        raise CheckpointError(f"checkpoint directory {p} cannot be resolved ({e})") from None
    if not root.is_dir():
        raise CheckpointError(f"checkpoint path {p} is not a directory")
    return root


def member(root: Path, name, what: str) -> Path:
    """`name` (as written in the checkpoint) -> the resolved path of a regular file inside root.

    what: which file this is, for the message ("shard", "config"). Nothing is opened."""
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{what} name {name!r} is not a non-empty string")
    if "\x00" in name:
        raise CheckpointError(f"{what} name {name!r} contains a NUL byte")
    pure = PurePosixPath(name)
    if pure.is_absolute() or os.path.isabs(name):
        raise CheckpointError(f"{what} {name!r} is an absolute path; a checkpoint names its files relative "
                              f"to its own directory {root}")
    if ".." in pure.parts:
        raise CheckpointError(f"{what} {name!r} contains '..'; a checkpoint may only name files inside {root}")
    lexical = root / pure
    try:
        real = lexical.resolve(strict=True)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{what} {name!r} does not exist in {root}") from None
    except (OSError, RuntimeError) as e:
        raise CheckpointError(f"{what} {name!r} in {root} cannot be resolved ({e})") from None
    if real != root and root not in real.parents:
        raise CheckpointError(f"{what} {name!r} is a symlink to {real}, outside the model directory {root}; "
                              f"kestrel reads only files inside it (copy the file in instead of linking it)")
    try:
        st = os.stat(real)
    except OSError as e:
        raise CheckpointError(f"{what} {name!r} in {root} cannot be read ({e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{what} {name!r} in {root} is not a regular file")
    return real


def open_member(root: Path, name, what: str) -> tuple:
    """(file descriptor, size in bytes) of a checked member; the caller closes the descriptor."""
    real = member(root, name, what)
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as e:
        raise CheckpointError(f"{what} {name!r} in {root} cannot be opened ({e})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # replaced between the check and the open
        os.close(fd)
        raise CheckpointError(f"{what} {name!r} in {root} is not a regular file")
    return fd, st.st_size


def read_member(root: Path, name, what: str, limit: int) -> bytes:
    """The whole content of a small checked member (config, index), refusing more than `limit` bytes."""
    fd, size = open_member(root, name, what)
    try:
        if size > limit:
            raise CheckpointError(f"{what} {name!r} is {size} bytes; more than the {limit} a {what} may have")
        chunks, got = [], 0
        while got <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > limit:
            raise CheckpointError(f"{what} {name!r} grew past {limit} bytes while being read")
        return b"".join(chunks)
    finally:
        os.close(fd)


class _DuplicateKey(ValueError):
    def __init__(self, key):
        super().__init__(key)
        self.key = key


def _object_without_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON value")


def parse_json(raw: bytes, where: str, error=CheckpointError, allow_constants: bool = True):
    """Strict JSON: UTF-8, no key twice in one object (the json module keeps the last one
    silently), optionally no NaN/Infinity. Every failure is `error` naming `where`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text ({e})") from None
    try:
        return json.loads(text, object_pairs_hook=_object_without_duplicates,
                          **({} if allow_constants else {"parse_constant": _no_constant}))
    except _DuplicateKey as e:
        raise error(f"{where}: key {e.key!r} appears twice in one JSON object") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, over-long integers, deep nesting
        raise error(f"{where}: not valid JSON ({type(e).__name__}: {e})") from None
