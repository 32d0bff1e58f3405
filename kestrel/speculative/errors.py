"""The speculative driver's errors. Each is a KestrelError raised before any engine state changes
(bad arguments), or by the per-round check (InvariantError)."""
from __future__ import annotations

from ..errors import KestrelError


class SpecArgumentError(KestrelError):
    """An argument of the speculative driver of the wrong type or out of range: T, k, a name
    (policy, drafter, pairing, tail), a reference stream, or an engine that does not fit the run."""


class ScheduleError(SpecArgumentError):
    """An n_ok histogram, sequence or acceptance profile the run cannot replay: n_ok outside
    [the pairing's minimum, k], duplicate entries, counts that are not non-negative ints, no
    rounds, rates outside [0, 1], too few depths."""


class InvariantError(KestrelError):
    """The round broke consumed == emitted, or a cursor invariant."""
