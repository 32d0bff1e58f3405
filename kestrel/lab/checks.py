"""Reading a results file's JSON field by field: every value a record takes is checked where it
is read, and a value that is missing or of the wrong kind raises ResultsFileError naming the
file and the field's path (e.g. `large.units.ckpt[2]`)."""
from __future__ import annotations

import math

from kestrel.errors import KestrelError


class ResultsFileError(KestrelError):
    """A results file that cannot be read as its benchmark wrote it: missing, too large, not
    UTF-8 JSON, or a field missing or of the wrong kind (the message names the file and field)."""


def _shown(x) -> str:
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


class Field:
    """One value of a results file and where it lies: `file`, `path` (dotted keys, [i] indices)."""

    def __init__(self, value, file: str, path: str = ""):
        self.value, self.file, self.path = value, file, path

    def fail(self, expected: str):
        where = self.path or "the top level"
        raise ResultsFileError(f"{self.file}: {where}: expected {expected}, got {_shown(self.value)}")

    def _child(self, value, key) -> "Field":
        if isinstance(key, int):
            return Field(value, self.file, f"{self.path}[{key}]")
        return Field(value, self.file, f"{self.path}.{key}" if self.path else str(key))

    # ---- containers --------------------------------------------------------------------------
    def obj(self) -> dict:
        if not isinstance(self.value, dict):
            self.fail("an object")
        return self.value

    def has(self, key: str) -> bool:
        return key in self.obj() and self.obj()[key] is not None

    def __getitem__(self, key: str) -> "Field":
        d = self.obj()
        if key not in d:
            where = f"{self.path}.{key}" if self.path else key
            raise ResultsFileError(f"{self.file}: {where}: missing (the file has {sorted(d)[:12]})")
        return self._child(d[key], key)

    def get(self, key: str) -> "Field | None":
        """The field, or None where the file has no such key (or null): an optional field."""
        return self[key] if self.has(key) else None

    def items(self) -> list:
        """The elements of a list, each a Field."""
        if not isinstance(self.value, list):
            self.fail("a list")
        return [self._child(v, i) for i, v in enumerate(self.value)]

    def entries(self) -> list:
        """(key, Field) for each entry of an object."""
        return [(k, self._child(v, k)) for k, v in self.obj().items()]

    # ---- scalars -----------------------------------------------------------------------------
    def num(self, lo: float = 0.0) -> float:
        x = self.value
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < lo:
            self.fail(f"a finite number >= {lo:g}")
        return float(x)

    def int(self, lo: int = 0) -> int:
        x = self.value
        if isinstance(x, bool) or not isinstance(x, int) or x < lo:
            self.fail(f"an integer >= {lo}")
        return x

    def str(self) -> str:
        if not isinstance(self.value, str):
            self.fail("a string")
        return self.value

    def bool(self) -> bool:
        if not isinstance(self.value, bool):
            self.fail("true or false")
        return self.value

    def one_of(self, names) -> str:
        s = self.str()
        if s not in names:
            self.fail(f"one of {list(names)}")
        return s

    def counts(self) -> dict:
        """{int: int} from an object keyed by integers (an n_ok histogram)."""
        return {n: self._child(self.obj()[k], k).int() for n, k in zip(self.table(), self.obj())}

    def table(self, lo: float = 0.0) -> dict:
        """{int: float} from an object keyed by integers (rows M, n): written as strings in a file,
        integers in a dict measured just now."""
        out = {}
        for key, f in self.entries():
            if not ((isinstance(key, str) and key.isdigit()) or (type(key) is int and key >= 0)):
                raise ResultsFileError(f"{self.file}: {self.path}: expected integer keys, got {_shown(key)}")
            out[int(key)] = f.num(lo)
        return out

    def numbers(self, lo: float = 0.0) -> tuple:
        return tuple(f.num(lo) for f in self.items())

    def opt(self, key: str, kind: str, *args):
        """An optional field read as `kind` ('num', 'int', 'str', 'bool', 'table'), else None."""
        f = self.get(key)
        return None if f is None else getattr(f, kind)(*args)
