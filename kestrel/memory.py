"""Memory an allocation needs, checked against what its device has before the attempt.

Sizes that a caller's input sets (an Engine's max_seq, a preset's or a config's random
weights, a checkpoint's tensors) could ask for more than the machine holds; numpy or CuPy
would then fail halfway with a bare MemoryError, or the kernel's OOM killer would end the
process. `ensure_fits` refuses such a request first, naming what it needs.

Available memory: the CPU's MemAvailable (/proc/meminfo; os.sysconf's available pages
elsewhere), or the GPU's free memory plus what CuPy's pool holds unused. Where neither can be
read the check passes (the allocation itself is then the check).
"""
from __future__ import annotations

import os

from .errors import InsufficientMemoryError


def _cpu_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            text = f.read(1 << 16).decode("ascii", "replace")
        for line in text.splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _cuda_available() -> int | None:
    try:
        import cupy as cp
        free, _ = cp.cuda.Device().mem_info
        return int(free) + int(cp.get_default_memory_pool().free_bytes())
    except Exception:            # no CuPy or no device: kestrel.backend reports those by name
        return None


def available_bytes(device: str) -> int | None:
    """Bytes an allocation may take now on "cpu" or "cuda" (None: unknown)."""
    return _cuda_available() if device == "cuda" else _cpu_available()


def human(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def ensure_fits(nbytes: int, what: str, device: str):
    """InsufficientMemoryError unless `nbytes` fit in the available memory of `device`."""
    avail = available_bytes(device)
    if avail is not None and nbytes > avail:
        raise InsufficientMemoryError(f"{what}: {human(nbytes)} ({nbytes} bytes) of {device} memory needed, "
                                      f"{human(avail)} available")
