"""The segment tables of a batched pass, written by the host before each run.

A batched plan (lower.py lower_batch) launches each op with state once for every sequence of
the pass, through a segment table (kernels/common.cuh): per sequence its first row in the pass,
its rows, its state (P0, P1), its ctrl block, ring slots and GDN mode. If those words were
frozen into the plan, every new mix of row counts (a fold of 1 row here and 3 there, draft
chains that start with different fill rows) would lower and capture a new plan, and a plan cache
cycling through such mixes re-lowers every round. So a plan is made for *bounds*, not for one
mix, and the host rewrites all its tables before each run:

    nseg    segments (sequences), a power of two; segments past the pass's have M = 0 and null
            state pointers, and every kernel returns for M = 0 before it touches anything
    rows    the most rows of one segment, a power of two (the attention and move kernels' grid)
    total   rows of the pass's activation buffers: the rows rounded up to a multiple of 8, or
            to 1.5 or 2 times a power of two past 64 (the projections pay for padded rows;
            rows past the pass's are computed, belong to no segment and are never read)

A table entry's state pointer is one of the state's buffers (DeviceState.buffers) plus an
offset that is the same for every state of one layout (a layer's slice): TableSpec holds the
buffer names and offsets, found once at lowering. `words` then builds every table of a pass
with NumPy alone. Pure NumPy: importable and testable without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..nvrtc import SEG_CTRL, SEG_LO, SEG_M, SEG_MODE, SEG_NSLOTS, SEG_P0, SEG_P1, SEG_WORDS
from ..program import GDN_MODES

BUFFERS = ("S", "hist", "kc", "vc", "S_snap", "hist_snap", "gdn_in", "mtp_kc", "mtp_vc")


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def pass_total(rows: int) -> int:
    """The activation rows a pass of `rows` rows is planned for: exact up to 8, then a multiple
    of 8 (the projections' row groups) up to 64, then 1.5 or 2 times a power of two (at most a
    third more rows, and few distinct plans for the many sums a batch of chains makes)."""
    if rows <= 8:
        return int(rows)
    if rows <= 64:
        return -(-rows // 8) * 8
    p = _pow2(rows)
    return p * 3 // 4 if rows <= p * 3 // 4 else p


def totals(rows_at_most: int) -> list:
    """Every `total` a pass of 1..rows_at_most rows is planned for (pass_total), smallest first:
    the plans a batch can need, which BatchEngine.prepare makes before a timed run."""
    return sorted({pass_total(n) for n in range(1, int(rows_at_most) + 1)})


def bounds(ms: list, has_projections: bool = True, rows_at_most: int | None = None, room: tuple = (1, 1)) -> tuple:
    """(nseg, rows, total) a batched plan is made for, given its sequences' row counts ms.
    room = (sequences, rows a sequence) the caller's passes can have (a BatchEngine's slots and
    widest call): nseg and rows are made for it, not for this pass alone, so that a batch whose
    sequences finish one by one, or whose draft chains start with different fill rows, keeps
    its plans. Only `total` follows the pass (the projections compute every planned row).
    A pass without projections (the fold) pads its rows for free: it is planned for the most
    rows any sequence can have (rows_at_most, the layout's input-cache rows), total = nseg * rows."""
    nseg = _pow2(max(len(ms), int(room[0])))
    if not has_projections:
        rows = _pow2(max(max(ms), rows_at_most or 1))
        return nseg, rows, nseg * rows
    return nseg, _pow2(max(max(ms), int(room[1]))), pass_total(sum(ms))


@dataclass(frozen=True)
class TableSpec:
    """One table of a plan: which rows each segment moves ("all", or "cache": only a cached
    verify's, the move kernel's to_cache table), and where P0 and P1 point in each state."""
    p0: tuple                 # (buffer name, byte offset) or None
    p1: tuple = None
    rows: str = "all"


def words(specs: list, ms: list, modes: list, bases: list, ctrl: list, nslots: int, nseg: int) -> np.ndarray:
    """Every table of one run: int64 [len(specs), nseg, SEG_WORDS].
    ms, modes: each sequence's rows and GDN mode (a GDN_MODES name); bases: each sequence's
    {buffer name: device address}; ctrl: each sequence's ctrl block address. Segments past
    len(ms) keep M = 0 and null pointers."""
    n = len(ms)
    out = np.zeros((len(specs), nseg, SEG_WORDS), np.int64)
    if not specs or not n:
        return out
    m = np.asarray(ms, np.int64)
    lo = np.concatenate([[0], np.cumsum(m)[:-1]])
    mode = np.asarray([GDN_MODES[x] for x in modes], np.int64)
    base = np.asarray([[b.get(name, 0) for name in BUFFERS] for b in bases], np.uint64).view(np.int64)
    out[:, :n, SEG_LO] = lo
    out[:, :n, SEG_M] = m
    out[:, :n, SEG_CTRL] = np.asarray(ctrl, np.uint64).view(np.int64)
    out[:, :n, SEG_NSLOTS] = nslots
    out[:, :n, SEG_MODE] = mode
    for col, which in ((SEG_P0, "p0"), (SEG_P1, "p1")):
        idx = np.asarray([BUFFERS.index(getattr(s, which)[0]) if getattr(s, which) else 0 for s in specs])
        off = np.asarray([getattr(s, which)[1] if getattr(s, which) else 0 for s in specs], np.int64)
        have = np.asarray([getattr(s, which) is not None for s in specs])
        out[:, :n, col] = np.where(have[:, None], base[:, idx].T + off[:, None], 0)
    cache_only = np.asarray([s.rows == "cache" for s in specs])
    if cache_only.any():          # the move-to-cache table: only a cached verify's rows
        keep = mode == GDN_MODES["cache"]
        out[cache_only, :n, SEG_M] = np.where(keep[None, :], m[None, :], 0)
    return out
