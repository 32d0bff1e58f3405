"""What a decode step reads and launches, the bandwidth it can read at, and where a model size fits:
the floor and the roofline that the size sweep (kestrel.lab.sweep) and the engine benchmark divide by.

    roofline(cfg, dtype="bf16", bandwidth=..., launch_ms_per_kernel=...)   # floor vs launch cost
    read_bandwidth(be)          # the best streaming-read bandwidth here (kernels/stream_read.cu)
    gpu_fits(presets)           # (True, why) when the GPU's free memory holds the largest
"""
from __future__ import annotations

import datetime as _dt
import gc
import math
import statistics
import sys
import time

import numpy as np

from kestrel.config import PRESETS, load_config
from kestrel.program import expected_shapes, main_program, param_count
from kestrel import ASSETS, nvrtc as L
from kestrel.ops import stream_read
from kestrel.backend import cuda_available, get_backend

CPU_WEIGHT_LIMIT = 64 * 2 ** 20     # the largest weights a CPU sweep loads (tiny and the test shapes)
HEADROOM = 1.25                     # GPU memory for states, caches and plans beyond the weights


def timed_ms(be, fn, reps: int, warm: int = 3, before=None, after=None) -> list:
    """ms of each of `reps` calls of fn() on backend `be` (device events on a GPU), after `warm`
    untimed ones; before() and after() run around each call, outside the clock."""
    out = []
    for r in range(warm + reps):
        if before:
            before()
        be.sync()
        a = be.now()
        fn()
        b = be.now()
        ms = be.elapsed_ms(a, b)
        if after:
            after()
        if r >= warm:
            out.append(ms)
    return out


def device_of(model) -> str:
    be = model.be
    return getattr(be, "device_name", be.name)


def now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


# ---- shapes: what a step reads and launches ---------------------------------------------------------
def config_of(preset: str):
    """The Config of a preset name ('tiny': the embedded model's config.json)."""
    if preset == "tiny":
        return load_config(ASSETS / "tiny")
    return PRESETS[preset]


def native_dtype(preset: str, dtype: str = "bf16") -> str:
    """The projection dtype a size runs in: the real shapes in `dtype`, the embedded and test
    models in fp32 (their own weights; bench_engine measures them the same way)."""
    return "fp32" if preset == "tiny" or preset.startswith("test-") else dtype


def weight_bytes(cfg, dtype: str) -> int:
    """Bytes one decode step must read: every main-model weight once (matrices in `dtype`,
    vectors fp32), the embedding only for its one looked-up row unless it is tied to the head."""
    total = 0
    for name, shape in expected_shapes(cfg).items():
        if name.startswith("mtp."):
            continue
        size = 2 if dtype == "bf16" and len(shape) == 2 else 4
        if name == "embed_tokens.weight" and not cfg.tie_word_embeddings:
            total += shape[1] * size
        else:
            total += math.prod(shape) * size
    return int(total)


def kernels_per_step(cfg) -> int:
    """Kernel launches of one decode step: one per op of the main program, two for a GDN layer
    (convolution, recurrence) and two for attention (append to the cache, decode), as the CUDA
    backend lowers it with stacked projections. On the CPU: the ops the NumPy twins run."""
    return sum(2 if op.kind in ("gdn", "attention") else 1 for op in main_program(cfg).ops)


def copy_ms(be, nbytes: int, reps: int, warm: int = 2) -> list:
    """ms of each of `reps` copies of an nbytes buffer (after `warm` untimed ones): on the GPU a
    device-to-device copy timed with the backend's events, on the CPU np.copyto."""
    ts = []
    if getattr(be, "name", "") == "cuda":
        import cupy as cp
        a = cp.ones(nbytes // 4, cp.float32)
        b = cp.empty_like(a)
        rt = cp.cuda.runtime
        for r in range(reps + warm):
            e0 = be.now()
            rt.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, rt.memcpyDeviceToDevice, be.stream.ptr)
            e1 = be.now()
            if r >= warm:
                ts.append(be.elapsed_ms(e0, e1))
        del a, b
        cp.get_default_memory_pool().free_all_blocks()
    else:
        a = np.ones(nbytes // 4, np.float32)
        b = np.empty_like(a)
        for r in range(reps + warm):
            t0 = time.perf_counter()
            np.copyto(b, a)
            if r >= warm:
                ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def read_ms(be, nbytes: int, reps: int, warm: int = 2, per_timing: int = 8) -> dict:
    """{shape: ms of one read, for each of `reps` timings} of one nbytes buffer (after `warm`
    untimed timings). On the GPU kernels/stream_read.cu in each of its shapes (kestrel.ops.
    stream_read.SHAPES): `per_timing` reads back to back between two of the backend's events,
    divided by per_timing, so that the host's time to submit the first launch (tens of µs from
    Python, a tenth of a 1 GiB read) is not counted as reading. On the CPU one NumPy
    XOR-reduction over the buffer's 64-bit words (one core), under the shape name "numpy"."""
    out = {}
    if getattr(be, "name", "") == "cuda":
        import cupy as cp
        sms = be.device_props["sm_count"]
        buf = cp.ones(nbytes // 4, cp.uint32)
        sink = stream_read.out_buffer(sms)
        for shape in stream_read.SHAPES:
            launch = stream_read.stream_read_launch(buf, sink, sms, shape)
            ts = []
            for r in range(reps + warm):
                e0 = be.now()
                for _ in range(per_timing):
                    L.go(launch, be.stream)
                e1 = be.now()
                if r >= warm:
                    ts.append(be.elapsed_ms(e0, e1) / per_timing)
            out[stream_read.shape_name(shape)] = ts
        del buf, sink
        cp.get_default_memory_pool().free_all_blocks()
    else:
        a = np.ones(nbytes // 8, np.uint64)
        ts = []
        for r in range(reps + warm):
            t0 = time.perf_counter()
            np.bitwise_xor.reduce(a)
            if r >= warm:
                ts.append((time.perf_counter() - t0) * 1e3)
        out["numpy"] = ts
    return out


def read_bandwidth(be, nbytes: int | None = None, reps: int = 10, warm: int = 2) -> dict:
    """The streaming-read bandwidth: bytes read once / time, the fastest shape's median of reps
    (read_ms). -> {"Bps", "bytes", "shape", "kind"}. The floor of a decode step is its weight
    bytes over this; a copy (copy_ms) reads and writes, so it gives a lower figure."""
    nbytes = nbytes or (1 << 30 if getattr(be, "name", "") == "cuda" else 1 << 27)
    med = {k: statistics.median(v) for k, v in read_ms(be, nbytes, reps, warm).items()}
    best = min(med, key=med.get)
    kind = "streaming read, kernels/stream_read.cu" if best != "numpy" else "NumPy XOR-reduction, one core"
    return {"Bps": nbytes / (med[best] * 1e-3), "bytes": nbytes, "shape": best, "kind": kind}


def roofline(cfg, *, dtype: str, bandwidth: float, launch_ms_per_kernel: float, units=None) -> dict:
    """The back-of-envelope cost of a decode step and of a verify of M rows.

    floor_ms  = weight bytes / bandwidth           (reading the weights once; any M <= a few;
                                                    bandwidth: read_bandwidth's, bytes read once)
    launch_ms = kernels per step x cost per kernel (paid once per call, whatever M is)
    bound     = 'bandwidth' where the floor is the larger term, else 'launch'
    With measured unit costs (spec.UnitCosts) it adds the measured step, verify_checkpointed(M),
    verify(M) / step and the measured extra cost of each row beyond the first (row_ms)."""
    wb = weight_bytes(cfg, dtype)
    n = kernels_per_step(cfg)
    floor = wb / bandwidth * 1e3
    launch = n * launch_ms_per_kernel
    out = {"weight_bytes": wb, "dtype": dtype, "bandwidth_Bps": bandwidth, "floor_ms": floor,
           "kernels_per_step": n, "launch_ms_per_kernel": launch_ms_per_kernel, "launch_ms": launch,
           "roof_step_ms": floor + launch, "bound": "bandwidth" if floor >= launch else "launch"}
    if units is not None:
        ms = dict(sorted(units.ckpt.items()))
        M = max(ms)
        out.update({"step_ms": units.step, "verify_ms": ms,
                    "verify_over_step": {m: v / units.step for m, v in ms.items()},
                    "row_ms": (ms[M] - ms[1]) / (M - 1) if M > 1 else 0.0,
                    "floor_share": floor / units.step, "draft_over_step": units.draft / units.step})
    return out


def launch_cost(sizes: list) -> float:
    """The fixed cost of one kernel, from measurements: per size, what its step costs beyond
    reading its weights, per kernel; the smallest of these, an upper bound on what every kernel
    pays (each size's figure also holds its kernels' own work beyond the weight reads)."""
    per = [max(s["units"]["step"] - s["floor_ms"], 0.0) / s["kernels_per_step"] for s in sizes]
    return min(per) if per else 0.0


# ---- where a size can run -----------------------------------------------------------------------------
def resident_bytes(preset: str, dtype: str = "bf16") -> int:
    """Bytes of a preset's weights in memory, MTP included (its projection dtype: native_dtype)."""
    return param_count(config_of(preset)) * (2 if native_dtype(preset, dtype) == "bf16" else 4)


def gpu_fits(presets, dtype: str = "bf16", headroom: float = HEADROOM) -> tuple:
    """(True, why) when this machine's backend is a CUDA GPU whose free memory holds the largest
    of `presets` (weights x headroom, one at a time), else (False, why)."""
    if not cuda_available():
        return False, f"no CUDA GPU is visible here; the backend is {get_backend('cpu').device_name}"
    be = get_backend("auto")
    import cupy
    free, total = cupy.cuda.runtime.memGetInfo()
    need = max(resident_bytes(p, dtype) for p in presets) * headroom
    dev = getattr(be, "device_name", "the GPU")
    if free < need:
        return False, (f"{dev} has {free / 2**30:.0f} GiB free; the largest of {list(presets)} needs "
                       f"about {need / 2**30:.0f} GiB")
    return True, f"{dev} has {free / 2**30:.0f} GiB free of {total / 2**30:.0f} GiB"


def runnable(presets, device: str = "auto", dtype: str = "bf16") -> tuple:
    """(the presets this machine's backend runs, [(preset, why not)]): on a GPU, those whose
    weights fit its free memory; on the CPU, those with weights under CPU_WEIGHT_LIMIT."""
    be = get_backend(device)
    ok, skipped = [], []
    free = None
    if getattr(be, "name", "") == "cuda":
        import cupy
        free = cupy.cuda.runtime.memGetInfo()[0]
    for p in presets:
        wb = resident_bytes(p, dtype)
        if free is not None and wb * HEADROOM > free:
            skipped.append((p, f"needs about {wb * HEADROOM / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"))
        elif free is None and wb > CPU_WEIGHT_LIMIT:
            skipped.append((p, f"{wb / 2**20:.0f} MiB of weights: too slow on the CPU"))
        else:
            ok.append(p)
    return ok, skipped


def free_device_memory():
    """Drop what the last model left on the GPU (the 27B weights are ~52 GB) before the next."""
    gc.collect()
    cp = sys.modules.get("cupy")
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
