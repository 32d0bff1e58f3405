"""Exceptions: each names the problem; a call that raises leaves the engine unchanged (SPEC §9)."""


class KestrelError(ValueError):
    """Base class for kestrel's input errors."""


class CursorError(KestrelError):
    """A position not contiguous with a cursor, or past max_seq."""


class BatchWidthError(KestrelError):
    """A batch width M the engine's batch mode forbids (strict: M == mmax; flex: 1 <= M <= mmax)."""


class SnapshotError(KestrelError):
    """rollback without a valid mark, or a mark/step that conflicts with pending state."""


class TokenError(KestrelError):
    """Token ids out of range, or wrongly shaped token/hidden inputs."""


class DeviceError(RuntimeError):
    """device='cuda' without a usable GPU, or an unknown device."""
