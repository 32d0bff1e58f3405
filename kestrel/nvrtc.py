"""Compiling and launching kestrel's kernels (kernels/*.cu) through CuPy's NVRTC.

The bottom of the CUDA side: every op module and the CUDA backend import this one, and it
imports none of them. A *launch* is a tuple (fn, grid, block, args, smem): the launchers in
kestrel/ops build them, a plan (kestrel/cuda/plan.py) stores and replays them. CuPy is
imported only when a kernel is first compiled, so kestrel/ops stays importable without a GPU.

Each kernel file kernels/<op>.cu is compiled with kernels/common.cuh pasted in front and with
-D macros for every constant that Python must agree with: the block sizes and epsilons that
kestrel/ops/<op>.py registers here (register), and the ctrl block's layout below. A constant
is thus written once, in Python.

The kernel sources ship with the package: a wheel holds them as kestrel/kernels/ (pyproject.toml
maps the top-level kernels/ folder there); a checkout reads kernels/ beside kestrel/.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np



def _kernel_dir() -> Path:
    """Where kernels/*.cu are: the installed package's copy, else the checkout's top-level folder."""
    here = Path(__file__).resolve().parent
    for d in (here / "kernels", here.parent / "kernels"):
        if (d / "common.cuh").is_file():
            return d
    return here.parent / "kernels"     # compiling then fails naming this folder


KERNEL_DIR = _kernel_dir()
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")   # (CuPy adds -ftz=true; without --std it passes c++14)
SMEM_DEFAULT = 48 * 1024                          # dynamic shared memory a launch gets without opting in
SMEM_MAX = 227 * 1024                             # the most one block may opt in to (sm_90)

# The ctrl block: int32 words in device memory that the host writes before each launch or
# graph replay, so one captured graph serves every position (kernels/common.cuh).
CTRL_POS, CTRL_SLOT, CTRL_TOK = 0, 1, 4
RED_FLOATS = 32           # shared-memory floats of a block reduction (one per warp, <= 32 warps)
# A segment table: one launch of a kernel with state (GDN, attention) over several sequences' rows,
# SEG_WORDS int64 words a sequence (kernels/common.cuh; written by kestrel/cuda/lower.py lower_batch).
SEG_WORDS = 8
SEG_LO, SEG_M, SEG_P0, SEG_P1, SEG_CTRL, SEG_NSLOTS, SEG_MODE = range(7)
COMMON_DEFINES = {"CTRL_POS": CTRL_POS, "CTRL_SLOT": CTRL_SLOT, "CTRL_TOK": CTRL_TOK, "RED_FLOATS": RED_FLOATS,
                  "SEG_WORDS": SEG_WORDS, "SEG_LO": SEG_LO, "SEG_M": SEG_M, "SEG_P0": SEG_P0, "SEG_P1": SEG_P1,
                  "SEG_CTRL": SEG_CTRL, "SEG_NSLOTS": SEG_NSLOTS, "SEG_MODE": SEG_MODE}

POISON = False            # tests: fill every scratch and output buffer with NaN before use

i32, i64, f32 = np.int32, np.int64, np.float32


def ptr(a) -> np.uint64:
    """A device pointer as a kernel argument (works for views with an offset); None: a null pointer."""
    return np.uint64(0 if a is None else a.data.ptr)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def macro(v) -> str:
    """A Python constant as a C literal: floats as exact float32 hex literals; a str is source
    text (a list of kernel instantiations), passed as written."""
    if isinstance(v, str):
        return v
    if isinstance(v, (float, np.floating)):
        return float(np.float32(v)).hex() + "f"
    return str(int(v))


_DEFINES: dict = {}


def register(module: str, cuda_defines: dict) -> None:
    """The -D constants of kernels/<module>.cu, from the op module that launches its kernels."""
    _DEFINES[module] = dict(cuda_defines)


def defines(module: str) -> dict:
    d = dict(COMMON_DEFINES)
    d.update(_DEFINES.get(module, {}))
    return d


_MODULES: dict = {}
_FUNCS: dict = {}


def source_module(key, files, cuda_defines: dict):
    """cupy.RawModule of the given .cu files (in order, kernels/common.cuh pasted in front), compiled
    once per process under `key` with cuda_defines as -D macros. kernel() uses it for
    kernels/<module>.cu; dev/ compiles its variants through it."""
    mod = _MODULES.get(key)
    if mod is None:
        import cupy as cp
        common = (KERNEL_DIR / "common.cuh").read_text()
        src = "\n".join(Path(f).read_text() for f in files).replace('#include "common.cuh"', common)
        opts = NVRTC_OPTIONS + tuple(f"-D{k}={macro(v)}" for k, v in sorted(cuda_defines.items()))
        mod = _MODULES[key] = cp.RawModule(code=src, options=opts)
    return mod


PDL_ORDERS = ("launch-first", "wait-first")     # griddep_enter() in kernels/common.cuh
_ORIGIN: dict = {}          # id(kernel) -> (module, name, PDL order) of every kernel() made


def kernel(module: str, name: str, pdl_order: str = "launch-first"):
    """cupy.RawKernel `name` from kernels/<module>.cu, compiled once per process for each PDL order
    (the -D macro PDL_WAIT_FIRST; launches outside a PDL graph run the same in both)."""
    key = (module, name, pdl_order)
    fn = _FUNCS.get(key)
    if fn is None:
        if pdl_order not in PDL_ORDERS:
            raise ValueError(f"pdl_order={pdl_order!r}: expected one of {PDL_ORDERS}")
        d = dict(defines(module), PDL_WAIT_FIRST=int(pdl_order == "wait-first"))
        fn = _FUNCS[key] = source_module((module, pdl_order), [KERNEL_DIR / f"{module}.cu"], d).get_function(name)
        _ORIGIN[id(fn)] = key
    return fn


def in_pdl_order(fn, pdl_order: str):
    """The same kernel as fn compiled for `pdl_order` (with fn's shared-memory opt-in); fn itself
    when it already is, or when kernel() did not make it (dev/'s own modules)."""
    origin = _ORIGIN.get(id(fn))
    if origin is None or origin[2] == pdl_order:
        return fn
    twin = kernel(origin[0], origin[1], pdl_order)
    nbytes = _SMEM_SET.get(id(fn), 0)
    if nbytes > _SMEM_SET.get(id(twin), 0):
        twin.max_dynamic_shared_size_bytes = nbytes
        _SMEM_SET[id(twin)] = nbytes
    return twin


_SMEM_SET: dict = {}


def smem(fn, nbytes: int, what: str) -> int:
    """Opt the kernel in to `nbytes` of dynamic shared memory when a launch needs more than
    the default; refuse sizes no block can have, naming what made them that large."""
    if nbytes > SMEM_MAX:
        raise ValueError(f"{what}: a launch needs {nbytes} bytes of shared memory (> {SMEM_MAX})")
    if nbytes > SMEM_DEFAULT and nbytes > _SMEM_SET.get(id(fn), 0):
        fn.max_dynamic_shared_size_bytes = nbytes
        _SMEM_SET[id(fn)] = nbytes
    return nbytes


_PROPS: dict = {}


def device_props() -> dict:
    """The current GPU's properties as the CUDA runtime reports them (CuPy's getDeviceProperties,
    the name decoded to str), read once per device. Whatever sizes a launch or names the device
    reads them here."""
    import cupy as cp
    dev = cp.cuda.Device().id
    p = _PROPS.get(dev)
    if p is None:
        p = dict(cp.cuda.runtime.getDeviceProperties(dev))
        name = p.get("name", "?")
        p["name"] = name.decode() if isinstance(name, bytes) else str(name)
        _PROPS[dev] = p
    return p


def compute_capability() -> int:
    """The current GPU's compute capability as one number: 90 for sm_90."""
    p = device_props()
    return 10 * int(p["major"]) + int(p["minor"])


_OCCUPANCY: dict = {}


def blocks_per_sm(fn, threads: int, nbytes: int = 0) -> int:
    """How many blocks of `threads` threads (and `nbytes` of dynamic shared memory) of kernel fn
    one multiprocessor holds at once, as the CUDA occupancy calculator counts: the fewest that its
    registers (256 a warp at a time, in four quarters of the register file), warps, shared memory
    (128-byte units, plus what the driver reserves a block) and block slots allow. Once a shape."""
    key = (id(fn), threads, nbytes)
    if key not in _OCCUPANCY:
        p = device_props()
        warps = cdiv(threads, 32)
        per_warp = cdiv(fn.num_regs * 32, 256) * 256
        by_regs = (p["regsPerMultiprocessor"] // 4 // per_warp) * 4 // warps
        smem = cdiv(fn.shared_size_bytes + nbytes, 128) * 128 + p.get("reservedSharedMemPerBlock", 1024)
        _OCCUPANCY[key] = min(by_regs, p["maxThreadsPerMultiProcessor"] // 32 // warps,
                              p["sharedMemPerMultiprocessor"] // smem, p.get("maxBlocksPerMultiProcessor", 32))
    return _OCCUPANCY[key]


def go(launch, stream):
    """Launch one (fn, grid, block, args, smem) now, on `stream`."""
    fn, grid, block, args, sm = launch
    with stream:
        fn(grid, block, args, shared_mem=sm)
