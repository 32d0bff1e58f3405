"""The streaming-read floor: how fast this device reads memory once (launcher and NumPy twin of
kernels/stream_read.cu). Not a model op: benchmarks and kestrel.lab.sweep time it, and a decode
step's weight bytes divided by its bandwidth is the floor the step is measured against."""
import numpy as np

from .. import nvrtc as L

UNROLLS = (4, 8)
# (UNROLL loads in flight, blocks per multiprocessor, threads a block): the shapes timed; the
# fastest is the device's read bandwidth (results/bench_projections.md has each shape's)
SHAPES = tuple((u, bps, t) for u in UNROLLS for bps, t in ((4, 512), (8, 256), (16, 256), (32, 128)))
MAX_BLOCKS_PER_SM = max(bps for _, bps, _ in SHAPES)


def xor_words(buf: np.ndarray) -> int:
    """The twin: XOR of every 32-bit word of a buffer whose size is a multiple of 16 bytes."""
    return int(np.bitwise_xor.reduce(np.ascontiguousarray(buf).view(np.uint32)))   # empty: 0


def shape_name(shape) -> str:
    """How the benchmarks and results files name a shape: unroll8_grid16xSM_256t."""
    return "unroll{}_grid{}xSM_{}t".format(*shape)


def out_buffer(sm_count: int):
    """The uint32 device array every shape's launch can write its block XORs into."""
    import cupy as cp
    return cp.zeros(sm_count * MAX_BLOCKS_PER_SM, cp.uint32)


def stream_read_launch(buf, out, sm_count: int, shape=SHAPES[0]):
    """(fn, grid, block, args, smem) of one read of `buf` (a contiguous device array, a multiple
    of 16 bytes, 16-byte aligned); out: uint32 device array of at least sm_count ·
    MAX_BLOCKS_PER_SM words (block b writes out[b])."""
    unroll, bps, threads = shape
    if (unroll, bps, threads) not in SHAPES:
        raise ValueError(f"stream_read shape {shape} not one of {SHAPES}")
    if buf.nbytes % 16 or buf.data.ptr % 16:
        raise ValueError(f"stream_read needs a 16-byte aligned buffer of a multiple of 16 bytes ({buf.nbytes} bytes)")
    grid = sm_count * bps
    if out.dtype != np.uint32 or out.size < grid:
        raise ValueError(f"stream_read: out must be uint32 with >= {grid} words, got {out.dtype} x {out.size}")
    args = (L.ptr(buf), np.int64(buf.nbytes // 16), L.ptr(out))
    return L.kernel("stream_read", f"stream_read_u{unroll}"), (grid,), (threads,), args, 0
