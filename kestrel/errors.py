"""Exceptions: each names the problem; a call that raises leaves the engine unchanged.

Every error kestrel raises for bad input derives from `KestrelError`, so one
`except kestrel.KestrelError` catches them all. `KestrelError` is a `ValueError`, so
callers written against the older plain-ValueError behaviour keep working.
"""


class KestrelError(ValueError):
    """Base class of every kestrel input error (a ValueError)."""


class ConfigError(KestrelError):
    """A model config kestrel cannot run faithfully: names the key and its value."""


class CheckpointError(KestrelError):
    """A checkpoint kestrel refuses to load: names the file and, where one is at fault, the tensor."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint directory, its config.json, or a file its index names does not exist.

    Also a FileNotFoundError, so code that catches missing files that way keeps working."""


class CursorError(KestrelError):
    """A position not contiguous with a cursor, or past max_seq."""


class BatchWidthError(KestrelError):
    """A batch width M the engine's batch mode forbids (strict: M == mmax; flex: 1 <= M <= mmax)."""


class SnapshotError(KestrelError):
    """rollback without a valid mark, or a mark/step that conflicts with pending state."""


class TokenError(KestrelError):
    """Token ids that are not integers or out of range, or hidden-state rows that are not finite
    real floats of the expected shape."""


class SlotError(KestrelError):
    """A batched engine's slot that is not in use (never joined, or left), or a join when every
    slot is in use."""


class DeviceError(KestrelError, RuntimeError):
    """device='cuda' without a usable GPU, or an unknown device.

    A KestrelError like every other kestrel error (one base class to catch), and also a
    RuntimeError, which it has always been: a missing GPU is a property of the machine rather
    than of a value, and callers that catch RuntimeError for it keep working."""


class InsufficientMemoryError(KestrelError, MemoryError):
    """An allocation that a caller's input sizes (engine buffers, random weights, checkpoint
    tensors) would not fit in the device's available memory: refused before the attempt, with
    what it needs and what is available. Also a MemoryError."""
