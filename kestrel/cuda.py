"""CUDA backend: kestrel's own kernels (kernels/*.cu) through CuPy (NVRTC), decode as CUDA graphs.

This module imports CuPy at the top: it is imported only when a CUDA backend is asked for
(kestrel.backend.get_backend), so the CPU path and CI never need CuPy.

Two ways to run the model on the GPU, with the same kernels:

  * op by op: the methods below (embed, linear, rmsnorm, attn_core, gdn_core, ...) implement
    CPUBackend's interface; Model's generic forward calls them one by one (eager launches).
  * fused plans (the default for Engine calls): Model.forward hands the whole pass to
    run_forward, which builds once per (model, engine buffers, M, mode) a fixed list of
    launches over preallocated buffers, with the projections fused ([q|k|v|z|b|a], [q|k|v],
    [gate|up] with SwiGLU in the epilogue, the residual add in the epilogue of o/out/down),
    and from the second call replays it as a CUDA graph. Positions, the live GDN slot and the
    tokens are read from a small device block (`ctrl`, see kernels/common.cuh) that the host
    writes before each replay, so one graph serves every position; the engine's semantics
    (validation and cursors on the host, state buffers updated in place) are unchanged.
    On Hopper the graph is captured with programmatic dependent launch (cuLaunchKernelEx
    through ctypes; KESTREL_PDL=0 turns it off): each kernel may start, and a projection may
    start streaming its weights, while the previous kernel drains. pdl_selftest() checks that
    this gives the same bits as plain graphs.

Both ways give bit-identical results (same kernels, same per-row reduction orders), and
row j of any M-row call is bit-identical to the same row alone (SPEC §3): see kernels/linear.cu.

Weights: 2-D projection matrices in bf16 when asked (raw uint16 bits on the device), everything
else fp32. `weight_f32(w)` widens a stored weight for inspection.
"""
from __future__ import annotations

import collections
import ctypes
import math
import os
from pathlib import Path

import cupy as cp
import numpy as np

from .config import Config, expected_shapes
from .ops import rope as _rope
from .weights import f32_to_bf16, random_weights

KERNEL_DIR = Path(os.environ.get("KESTREL_KERNELS", Path(__file__).resolve().parent.parent / "kernels"))
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")   # (CuPy adds -ftz=true; without --std it passes c++14)
CTRL_POS, CTRL_SLOT, CTRL_TOK = 0, 1, 4      # kernels/common.cuh
GRAPH_MAX_ROWS = 8                            # plans up to this many rows are cached and graphed
PLAN_CACHE = 48                               # cached plans per model (LRU)
GPU_DRAW_MIN_PARAMS = 50_000_000              # random_model draws on the GPU from this size up
POISON = False                                # tests: fill every scratch/output buffer with NaN first
KS_BY_K: dict = {}                            # benchmarks only: override the K-split of linear.cu per K

_i32, _i64, _f32 = np.int32, np.int64, np.float32


def _p(a) -> np.uint64:
    """A device pointer as a kernel argument (works for views with an offset)."""
    return np.uint64(a.data.ptr)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- kernels ---------------------------------------------------------------------------
_MODULES: dict = {}
_FUNCS: dict = {}


def kernel(module: str, name: str):
    """cupy.RawKernel `name` from kernels/<module>.cu (common.cuh pasted in), compiled once."""
    key = (module, name)
    fn = _FUNCS.get(key)
    if fn is None:
        mod = _MODULES.get(module)
        if mod is None:
            common = (KERNEL_DIR / "common.cuh").read_text()
            src = (KERNEL_DIR / f"{module}.cu").read_text().replace('#include "common.cuh"', common)
            mod = cp.RawModule(code=src, options=NVRTC_OPTIONS)
            _MODULES[module] = mod
        fn = mod.get_function(name)
        _FUNCS[key] = fn
    return fn


_SMEM_SET: dict = {}


def _smem(fn, nbytes: int) -> int:
    """Raise the kernel's dynamic shared memory limit when a launch needs more than 48 KB."""
    if nbytes > 48 * 1024 and nbytes > _SMEM_SET.get(id(fn), 0):
        if nbytes > 227 * 1024:
            raise ValueError(f"a launch needs {nbytes} bytes of shared memory (> 227 KB): max_seq or head dims too large")
        fn.max_dynamic_shared_size_bytes = nbytes
        _SMEM_SET[id(fn)] = nbytes
    return nbytes


# ---- launch descriptions ---------------------------------------------------------------
def gemv_launch(W, X, Y, M: int, K: int, ldx: int, ldy: int, epi: int = 0, half: int = 0):
    """(fn, grid, block, args, smem) for y (op)= x · Wᵀ over M rows (kernels/linear.cu).

    W [N, K] (uint16 bf16 bits or float32, C-contiguous rows), X [M, ldx], Y [M, ldy].
    epi 0 store, 1 accumulate, 2 SwiGLU over W = [gate; up] (half = rows of gate)."""
    bf16 = W.dtype == np.uint16
    N, ldw = W.shape[0], W.strides[0] // W.itemsize
    v = 8 if bf16 else 4
    vec = v if (K % v == 0 and ldw % v == 0 and ldx % 4 == 0 and W.data.ptr % 16 == 0
                and X.data.ptr % 16 == 0) else 1
    mt = 1 if M == 1 else (4 if (M <= 4 and vec > 1) else 8)
    rr = 8 if mt == 8 else 4
    rl = rr // 2 if epi == 2 else rr
    ks = KS_BY_K.get(K) or (1 if K < 4096 else 2)     # from K alone: fixes the order (sweep: results/cuda_notes.md)
    nout = half if epi == 2 else N
    grid = (_cdiv(nout, rl * (4 // ks)), _cdiv(M, mt))
    fn = kernel("linear", f"gemv_{'bf16' if bf16 else 'f32'}_v{vec}_m{mt}_e{epi}")
    args = (_p(W), _i32(ldw), _p(X), _i32(ldx), _p(Y), _i32(ldy), _i32(nout), _i32(K), _i32(M), _i32(half), _i32(ks))
    return fn, grid, (128,), args, 0


def rmsnorm_launch(X, ldx, w, Y, ldy, rows: int, n: int, eps: float):
    return kernel("norm", "rmsnorm_zc"), (rows,), (256,), (_p(X), _i32(ldx), _p(w), _p(Y), _i32(ldy), _i32(n), _f32(eps)), 0


def embed_launch(table, tok, Y, ldy, M: int):
    H = table.shape[1]
    name = "embed_bf16" if table.dtype == np.uint16 else "embed_f32"
    return kernel("head", name), (M,), (256,), (_p(table), _p(tok), _p(Y), _i32(ldy), _i32(H)), 0


def kv_append_launch(K_, ldk, V_, ldv, knw, cos, sin, rope_row0, kc, vc, ctrl, M, nkv, hd, rh, eps):
    fn = kernel("attention", "attn_kv_append")
    smem = _smem(fn, (hd + 32) * 4)
    args = (_p(K_), _i32(ldk), _p(V_), _i32(ldv), _p(knw), _p(cos), _p(sin), _i32(rope_row0), _p(kc), _p(vc),
            _p(ctrl), _i32(nkv), _i32(hd), _i32(rh), _f32(eps))
    return fn, (nkv, M), (128,), args, smem


def attn_decode_launch(Q, ldq, qnw, cos, sin, rope_row0, kc, vc, O, ldo, ctrl, M, nh, nkv, hd, rh, eps, scale, lmax):
    fn = kernel("attention", "attn_decode")
    smem = _smem(fn, (hd + 32 + lmax) * 4)
    args = (_p(Q), _i32(ldq), _p(qnw), _p(cos), _p(sin), _i32(rope_row0), _p(kc), _p(vc), _p(O), _i32(ldo),
            _p(ctrl), _i32(nh), _i32(nkv), _i32(hd), _i32(rh), _f32(eps), _f32(scale))
    return fn, (nh, M), (256,), args, smem


def gdn_conv_launch(QKV, ldq, conv_w, XC, ldx, hist_ring, slot_stride, nslots, ck, ctrl, M, C, K):
    if K > 8:
        raise ValueError(f"conv kernel size {K} > 8 is not supported by kernels/gdn.cu")
    args = (_p(QKV), _i32(ldq), _p(conv_w), _p(XC), _i32(ldx), _p(hist_ring), _i64(slot_stride), _i32(nslots),
            _i32(ck), _p(ctrl), _i32(M), _i32(C), _i32(K))
    return kernel("gdn", "gdn_conv"), (_cdiv(C, 128),), (128,), args, 0


def gdn_recur_launch(XC, ldx, Z, ldz, B, ldb, A, lda, A_log, dt_bias, norm_w, Y, ldy, S_ring, slot_stride, nslots,
                     ck, ctrl, M, nk, nv, dk, dv, eps):
    if dk > 512 or dv > 512 or (dk * dv + 2 * dk + dv + 544) * 4 > 227 * 1024:
        raise ValueError(f"GDN head dims dk={dk}, dv={dv} are not supported by kernels/gdn.cu (shared memory)")
    fn = kernel("gdn", "gdn_recur")
    smem = _smem(fn, (dk * dv + 2 * dk + dv + 512 + 32) * 4)
    args = (_p(XC), _i32(ldx), _p(Z), _i32(ldz), _p(B), _i32(ldb), _p(A), _i32(lda), _p(A_log), _p(dt_bias),
            _p(norm_w), _p(Y), _i32(ldy), _p(S_ring), _i64(slot_stride), _i32(nslots), _i32(ck), _p(ctrl), _i32(M),
            _i32(nk), _i32(nv), _i32(dk), _i32(dv), _f32(np.float32(dk ** -0.5)), _f32(eps))
    return fn, (nv,), (512,), args, smem


def _go(launch):
    fn, grid, block, args, smem = launch
    fn(grid, block, args, shared_mem=smem)


# ---- programmatic dependent launch (inside captured graphs) -----------------------------------
class _LaunchAttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("i", ctypes.c_int)]


class _LaunchAttr(ctypes.Structure):       # CUlaunchAttribute (cuda.h): 72 bytes, value at 8
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttrValue)]


class _LaunchConfig(ctypes.Structure):     # CUlaunchConfig (cuda.h): 56 bytes
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_CTYPE = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int64): ctypes.c_int64,
          np.dtype(np.int32): ctypes.c_int32, np.dtype(np.float32): ctypes.c_float}


class _PDL:
    """cuLaunchKernelEx (driver API, through ctypes) with programmatic stream serialization, so a
    kernel may begin (griddep_launch / griddep_wait in kernels/common.cuh) while the previous one
    drains: it hides the launch gap and the start of the weight stream between dependent kernels.
    Used only while capturing a plan's CUDA graph."""

    def __init__(self):
        assert ctypes.sizeof(_LaunchAttr) == 72 and ctypes.sizeof(_LaunchConfig) == 56
        lib = ctypes.CDLL("libcuda.so.1")
        self.fn = lib.cuLaunchKernelEx
        self.fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.c_void_p]
        self.fn.restype = ctypes.c_int
        self.attr = _LaunchAttr()
        self.attr.id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        self.attr.value.i = 1

    def launch(self, fn, grid, block, args, smem: int, stream_ptr: int):
        g, b = tuple(grid) + (1, 1), tuple(block) + (1, 1)
        cfg = _LaunchConfig(g[0], g[1], g[2], b[0], b[1], b[2], int(smem), stream_ptr, ctypes.pointer(self.attr), 1)
        vals = [_CTYPE[np.asarray(a).dtype](a.item()) for a in args]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
        rc = self.fn(ctypes.byref(cfg), fn.kernel.ptr, params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernelEx failed (CUresult {rc})")


_PDL_DRIVER = None


def _pdl_driver():
    global _PDL_DRIVER
    if _PDL_DRIVER is None:
        _PDL_DRIVER = _PDL()
    return _PDL_DRIVER


# ---- host -> device control block --------------------------------------------------------
class _Staging:
    """Pinned host buffers in a ring, each reused only after its last copy has completed, so
    the host can enqueue step after step without waiting for the GPU."""

    def __init__(self, stream, n: int = 64, words: int = 1024):
        self.stream = stream
        self.mem = [cp.cuda.alloc_pinned_memory(words * 4) for _ in range(n)]
        self.buf = [np.frombuffer(m, np.int32, words) for m in self.mem]
        self.ev = [None] * n
        self.i = 0

    def put(self, dev, values):
        k = len(values)
        if k > self.buf[0].size:
            dev[:k].set(np.asarray(values, np.int32))
            return
        i = self.i
        self.i = (i + 1) % len(self.buf)
        ev = self.ev[i]
        if ev is not None:
            ev.synchronize()
        else:
            ev = self.ev[i] = cp.cuda.Event(block=False, disable_timing=True)
        self.buf[i][:k] = values
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, self.buf[i].ctypes.data, k * 4,
                                    cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)
        ev.record(self.stream)


class _Plan:
    """A fixed list of launches over fixed buffers; replayed as a CUDA graph from its second run."""

    def __init__(self, be, M: int, graphable: bool):
        self.be, self.M, self.graphable = be, M, graphable
        self.launches = []
        self.keep = []          # buffers the launches point into (the engine's state is not held:
                                # its addresses are part of the plan's key)
        self.graph = None
        self.pdl = False
        self.calls = 0
        self.ctrl = cp.zeros(CTRL_TOK + M, np.int32)

    def add(self, launch):
        self.launches.append(launch)

    def buf(self, *shape):
        a = self.be._empty(shape)
        self.keep.append(a)
        return a

    def _issue(self, pdl: bool = False):
        if pdl:
            drv, sp = _pdl_driver(), self.be.stream.ptr
            for fn, grid, block, args, smem in self.launches:
                drv.launch(fn, grid, block, args, smem, sp)
        else:
            for fn, grid, block, args, smem in self.launches:
                fn(grid, block, args, shared_mem=smem)

    def capture(self, pdl: bool):
        """A CUDA graph of the launches (not launched)."""
        st = self.be.stream
        with st:          # RawKernel launches go to the current stream: make sure it is the captured one
            st.begin_capture()
            try:
                self._issue(pdl)
            finally:
                g = st.end_capture()
        return g

    def run(self):
        be = self.be
        if self.graph is not None:
            self.graph.launch(be.stream)
            be.stats["graph_replays"] += 1
            return
        if self.graphable and be.use_graphs and self.calls >= 1:
            for pdl in ((True, False) if be.pdl else (False,)):
                try:
                    g = self.capture(pdl)
                except Exception as e:  # try without PDL, else keep working eagerly, but say so
                    be.stats["graph_errors"].append(f"capture(pdl={pdl}): {e!r}")
                    if pdl:
                        be.pdl = False
                    continue
                self.graph, self.pdl = g, pdl
                be.stats["graphs_captured"] += 1
                be.stats["pdl_graphs"] += int(pdl)
                g.launch(be.stream)
                be.stats["graph_replays"] += 1
                self.calls += 1
                return
            self.graphable = False
        self._issue()
        be.stats["eager_runs"] += 1
        self.calls += 1


def _fuse_groups(cfg: Config):
    """(key, [names]) of the projections kestrel stores as one matrix (rows stacked)."""
    out = []
    layers = [(f"layers.{i}", t) for i, t in enumerate(cfg.layer_types)]
    if cfg.mtp_layers:
        layers.append(("mtp.layers.0", "full_attention"))
    for p, t in layers:
        if t == "linear_attention":
            a = f"{p}.linear_attn"
            out.append((f"{a}.in", [f"{a}.in_proj_qkv.weight", f"{a}.in_proj_z.weight", f"{a}.in_proj_b.weight",
                                    f"{a}.in_proj_a.weight"]))
        else:
            a = f"{p}.self_attn"
            out.append((f"{a}.qkv", [f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight"]))
        out.append((f"{p}.mlp.gate_up", [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"]))
    return out


_STREAM = None


def _stream():
    """The one stream every CUDABackend launches on (graphs cannot be captured on the legacy
    default stream). It is made the current CuPy stream, so the engine's own CuPy work (resets,
    mark/rollback copies) is ordered with the kernels; it is a blocking stream, so work that
    other code puts on the legacy default stream is ordered with it too."""
    global _STREAM
    if _STREAM is None:
        _STREAM = cp.cuda.Stream(non_blocking=False)
    _STREAM.use()
    return _STREAM


class CUDABackend:
    name = "cuda"
    xp = cp

    def __init__(self, use_graphs: bool = True, fused: bool = True, pdl: bool | None = None):
        self.stream = _stream()
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        self.device_name = f"{name} (CUDA, CuPy {cp.__version__})"
        self.device_props = {"name": name, "sm_count": int(props["multiProcessorCount"]),
                             "memory_bytes": int(props["totalGlobalMem"]), "cc": f"{props['major']}.{props['minor']}"}
        self.use_graphs = use_graphs
        self.fused = fused
        if pdl is None:       # programmatic dependent launch in graphs: Hopper and newer, KESTREL_PDL=0 to disable
            pdl = os.environ.get("KESTREL_PDL", "1") != "0" and int(props["major"]) >= 9
        self.pdl = bool(pdl)
        self._staging = _Staging(self.stream)
        self._rope = {}
        self.stats = {"graphs_captured": 0, "pdl_graphs": 0, "graph_replays": 0, "eager_runs": 0, "graph_errors": []}

    # ---- memory -------------------------------------------------------------------------
    def _empty(self, shape, dtype=np.float32):
        a = cp.empty(shape, dtype)
        if POISON and a.dtype.kind == "f":
            a.fill(np.nan)
        return a

    def put_weight(self, name: str, a, dtype: str = "fp32"):
        """2-D matrices as bf16 bits (uint16) when dtype='bf16', everything else fp32."""
        if isinstance(a, cp.ndarray):
            if a.dtype == np.uint16:
                return a
            a = cp.ascontiguousarray(a, dtype=np.float32)
            if dtype == "bf16" and a.ndim == 2:
                out = cp.empty(a.shape, np.uint16)
                self._to_bf16(a, 1.0, out)
                return out
            return a
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "bf16" and a.ndim == 2:
            return cp.asarray(f32_to_bf16(a))
        return cp.asarray(a)

    def weight_f32(self, w):
        """A stored weight as float32 (bf16 bits widened exactly)."""
        if w.dtype == np.uint16:
            return (w.astype(np.uint32) << 16).view(np.float32)
        return w

    def asarray(self, a, dtype=np.float32):
        if isinstance(a, cp.ndarray):
            return cp.ascontiguousarray(a, dtype=dtype)
        return cp.asarray(np.ascontiguousarray(a, dtype=dtype))

    def zeros(self, shape, dtype=np.float32):
        return cp.zeros(shape, dtype)

    def to_numpy(self, a) -> np.ndarray:
        if isinstance(a, cp.ndarray):
            return a.get()
        return np.asarray(a)

    def sync(self):
        self.stream.synchronize()

    def now(self):
        """A CUDA event recorded on the backend's stream; elapsed_ms(a, b) reads two of them."""
        ev = cp.cuda.Event()
        ev.record(self.stream)
        return ev

    def elapsed_ms(self, a, b) -> float:
        b.synchronize()
        return float(cp.cuda.get_elapsed_time(a, b))

    def _f32(self, a):
        """Contiguous, 16-byte aligned float32 device array (copies only when needed)."""
        a = self.asarray(a, np.float32)
        if a.data.ptr % 16:
            a = a.copy()
        return a

    def _ctrl(self, pos: int = 0, slot: int = 0, tokens=()):
        v = np.zeros(CTRL_TOK + max(len(tokens), 1), np.int32)
        v[CTRL_POS], v[CTRL_SLOT] = pos, slot
        v[CTRL_TOK:CTRL_TOK + len(tokens)] = tokens
        return cp.asarray(v)

    def _to_bf16(self, src, scale, out):
        n = src.size
        fn = kernel("head", "f32_to_bf16")
        fn((min(_cdiv(n, 256), 65535 * 8),), (256,), (_p(src), _f32(scale), _p(out), _i64(n)))

    # ---- ops (CPUBackend's interface) -----------------------------------------------------
    def embed(self, table, tokens, out=None):
        tok = cp.asarray(np.asarray(self.to_numpy(tokens), dtype=np.int32).reshape(-1))
        M, H = tok.size, table.shape[1]
        y = out if out is not None else self._empty((M, H))
        with self.stream:
            _go(embed_launch(table, tok, y, H, M))
        return y

    def linear(self, x, w, out=None):
        x = self._f32(x)
        K = x.shape[-1]
        lead = x.shape[:-1]
        x2 = x.reshape(-1, K)
        M, N = x2.shape[0], w.shape[0]
        if w.shape[1] != K:
            raise ValueError(f"linear: x has {K} columns, weight is {tuple(w.shape)}")
        y = out if out is not None else self._empty((M, N))
        if M:
            with self.stream:
                _go(gemv_launch(w, x2, y, M, K, K, N))
        return y.reshape(lead + (N,))

    def linear_epilogue(self, x, w, y, epi: int, half: int = 0):
        """Fused-path projection on explicit buffers (tests): epi 1 y += x·Wᵀ, epi 2 SwiGLU."""
        x = self._f32(x)
        with self.stream:
            _go(gemv_launch(w, x, y, x.shape[0], x.shape[1], x.shape[1], y.shape[1], epi=epi, half=half))
        return y

    def rmsnorm(self, x, w, eps, out=None):
        x = self._f32(x)
        n = x.shape[-1]
        rows = x.size // n if n else 0
        y = out if out is not None else self._empty(x.shape)
        if rows:
            with self.stream:
                _go(rmsnorm_launch(x, n, w, y, n, rows, n, eps))
        return y

    def add(self, a, b):
        return a + b

    def swiglu(self, gate, up, out=None):
        g, u = self._f32(gate), self._f32(up)
        y = out if out is not None else self._empty(g.shape)
        n = g.size
        if n:
            with self.stream:
                kernel("mlp", "swiglu")((min(_cdiv(n, 256), 65535 * 8),), (256,), (_p(g), _p(u), _p(y), _i64(n)))
        return y

    def attn_core(self, qg, k, v, q_norm, k_norm, cos, sin, kc, vc, pos, eps, scale, out=None):
        """Same contract as CPUBackend.attn_core: appends K/V at rows pos.., returns [M, nh*hd]."""
        qg, k, v = self._f32(qg), self._f32(k), self._f32(v)
        cos, sin = self._f32(cos), self._f32(sin)
        M, nh, hd2 = qg.shape
        hd, nkv, rh = hd2 // 2, k.shape[1], cos.shape[-1]
        for name, c in (("kc", kc), ("vc", vc)):
            if not c.flags.c_contiguous or c.data.ptr % 16:
                raise ValueError(f"attn_core: the {name} cache must be a contiguous, aligned device array")
        ctrl = self._ctrl(pos)
        o = out if out is not None else self._empty((M, nh * hd))
        with self.stream:
            _go(kv_append_launch(k, nkv * hd, v, nkv * hd, k_norm, cos, sin, int(pos), kc, vc, ctrl, M, nkv, hd, rh, eps))
            _go(attn_decode_launch(qg, nh * 2 * hd, q_norm, cos, sin, int(pos), kc, vc, o, nh * hd, ctrl, M, nh, nkv, hd,
                                   rh, eps, scale, int(pos) + M))
        return o

    def gdn_core(self, sh, qkv, z, b, a, conv_w, A_log, dt_bias, norm_w, S, hist, S_slots=None, hist_slots=None):
        """Same contract as CPUBackend.gdn_core (kernels/gdn.cu; slots through a scratch ring)."""
        qkv, z, b, a = self._f32(qkv), self._f32(z), self._f32(b), self._f32(a)
        M, C, K = qkv.shape[0], sh.C, sh.K
        nk, nv, dk, dv = sh.nk, sh.nv, sh.dk, sh.dv
        cw = self._f32(conv_w.reshape(conv_w.shape[0], -1))
        ctrl = self._ctrl()
        xc = self._empty((M, C))
        y = self._empty((M, nv * dv))
        inplace = S_slots is None and S.flags.c_contiguous and hist.flags.c_contiguous and S.data.ptr % 16 == 0
        if inplace:
            S_ring, h_ring, nslots, ck = S, hist, 1, 0
        else:
            S_ring = self._empty((M + 1,) + tuple(S.shape))
            h_ring = self._empty((M + 1,) + tuple(hist.shape))
            S_ring[0] = S
            h_ring[0] = hist
            nslots, ck = M + 1, 1
        with self.stream:
            _go(gdn_conv_launch(qkv, C, cw, xc, C, h_ring, C * (K - 1), nslots, ck, ctrl, M, C, K))
            _go(gdn_recur_launch(xc, C, z, nv * dv, b, nv, a, nv, A_log, dt_bias, norm_w, y, nv * dv, S_ring,
                                 nv * dk * dv, nslots, ck, ctrl, M, nk, nv, dk, dv, sh.eps))
        if not inplace:
            if S_slots is None:     # a non-contiguous live state: write the result back
                S[...] = S_ring[M]
                hist[...] = h_ring[M]
            else:
                for j in range(M):
                    S_slots[j][...] = S_ring[1 + j]
                    hist_slots[j][...] = h_ring[1 + j]
        return y

    def argmax(self, logits):
        x = self._f32(logits)
        one = x.ndim == 1
        x2 = x.reshape(-1, x.shape[-1])
        out = cp.empty(x2.shape[0], np.int64)
        with self.stream:
            kernel("head", "argmax_rows")((x2.shape[0],), (1024,), (_p(x2), _i32(x2.shape[1]), _i32(x2.shape[1]), _p(out)))
        return out[0] if one else out.reshape(x.shape[:-1])

    def rope_tables(self, rot_dim, theta, n_pos):
        return _rope.rope_tables(rot_dim, theta, n_pos)

    # ---- random weights drawn on the device ------------------------------------------------
    def random_model(self, cfg: Config, seed: int = 0, dtype: str = "fp32", gpu_draw: bool | None = None):
        """A Model with random weights of kestrel.weights.random_weights' families.

        Small configs (below GPU_DRAW_MIN_PARAMS, unless gpu_draw=True) draw on the host with
        random_weights itself, so the weights equal the CPU backend's bit for bit. Large ones
        draw the projection matrices on the GPU (cuRAND normal, scaled, rounded to bf16 in
        place): the same distributions, not the same numbers."""
        from .model import Model   # noqa: PLC0415 (import cycle)
        if gpu_draw is None:
            gpu_draw = cfg.param_count() >= GPU_DRAW_MIN_PARAMS
        if not gpu_draw:
            return Model(cfg, random_weights(cfg, seed), self, source=f"random(seed={seed})", weight_dtype=dtype)
        rs = cp.random.RandomState(seed)
        rng = np.random.default_rng(seed)
        shapes = expected_shapes(cfg)
        wdt = np.uint16 if dtype == "bf16" else np.float32
        tensors, fused = {}, {}
        with self.stream:
            for key, names in _fuse_groups(cfg):
                rows, K = sum(shapes[n][0] for n in names), shapes[names[0]][1]
                buf = cp.empty((rows, K), wdt)
                r0 = 0
                for n in names:
                    r = shapes[n][0]
                    tensors[n] = buf[r0:r0 + r]
                    self._fill_normal(rs, tensors[n], 1.0 / math.sqrt(K))
                    r0 += r
                fused[key] = buf
            for n, shape in shapes.items():
                if n in tensors:
                    continue
                if len(shape) == 2:
                    buf = cp.empty(shape, wdt)
                    self._fill_normal(rs, buf, 1.0 if n == "embed_tokens.weight" else 1.0 / math.sqrt(shape[-1]))
                    tensors[n] = buf
                else:
                    tensors[n] = cp.asarray(_host_small(n, shape, rng))
        model = Model(cfg, tensors, self, source=f"random-gpu(seed={seed})", weight_dtype=dtype)
        model._cuda_fused = fused
        return model

    def _fill_normal(self, rs, out, scale: float, chunk: int = 1 << 26):
        flat = out.reshape(-1)
        n = flat.size
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            t = rs.standard_normal(e - s, dtype=np.float32)
            if out.dtype == np.uint16:
                self._to_bf16(t, scale, flat[s:e])
            else:
                cp.multiply(t, np.float32(scale), out=flat[s:e])

    # ---- fused plans ------------------------------------------------------------------------
    def _fused(self, model):
        """The stacked projection matrices; model.w's entries become row views of them."""
        f = model.__dict__.get("_cuda_fused")
        if f is not None:
            return f
        f = {}
        with self.stream:
            for key, names in _fuse_groups(model.cfg):
                parts = [model.w[n] for n in names]
                if len({p.dtype for p in parts}) != 1:
                    raise ValueError(f"{key}: mixed weight dtypes {[p.dtype for p in parts]}")
                buf = cp.concatenate(parts, axis=0)
                r0 = 0
                for n, p in zip(names, parts):
                    model.w[n] = buf[r0:r0 + p.shape[0]]
                    r0 += p.shape[0]
                f[key] = buf
        model._cuda_fused = f
        return f

    def _rope_dev(self, cfg: Config, n: int):
        key = (cfg.rot_dim, cfg.rope_theta, n)
        t = self._rope.get(key)
        if t is None:
            cos, sin = _rope.rope_tables(cfg.rot_dim, cfg.rope_theta, n)
            t = self._rope[key] = (cp.asarray(cos), cp.asarray(sin))
        return t

    def _plan(self, model, key, build, cache: bool):
        if not cache:
            return build()
        plans = model.__dict__.setdefault("_cuda_plans", collections.OrderedDict())
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = build()
            while len(plans) > PLAN_CACHE:
                plans.popitem(last=False)
        else:
            plans.move_to_end(key)
        return plan

    def run_forward(self, model, tokens, pos: int, st):
        """Model.forward's hook: the whole main pass as one fused plan (None: use the generic path)."""
        eng = getattr(st, "engine", None)
        if not self.fused or eng is None:
            return None
        M = len(tokens)
        ck = st.S_slots is not None
        key = ("main", M, ck, eng.S.data.ptr, eng.hist.data.ptr, eng.kc.data.ptr, eng.vc.data.ptr,
               eng.max_seq, eng.nslots)
        cache = M <= GRAPH_MAX_ROWS
        with self.stream:
            plan = self._plan(model, key, lambda: self._build_main(model, eng, M, ck), cache)
            self._staging.put(plan.ctrl, [pos, eng.slot, 0, 0, *[int(t) for t in tokens]])
            plan.run()
            if cache:
                return plan.hidden.copy(), plan.logits.copy()
            return plan.hidden, plan.logits

    def run_mtp_forward(self, model, tokens, hidden, pos: int, kc, vc):
        """Model.mtp_forward's hook: the MTP head as one fused plan."""
        if not self.fused:
            return None
        M = len(tokens)
        key = ("mtp", M, kc.data.ptr, vc.data.ptr, kc.shape[0])
        cache = M <= GRAPH_MAX_ROWS
        with self.stream:
            plan = self._plan(model, key, lambda: self._build_mtp(model, kc, vc, M), cache)
            plan.hid_in[...] = hidden
            self._staging.put(plan.ctrl, [pos, 0, 0, 0, *[int(t) for t in tokens]])
            plan.run()
            if cache:
                return plan.hidden.copy(), plan.logits.copy()
            return plan.hidden, plan.logits

    def _layer(self, P, model, p: str, kind: str, x, M: int, lmax: int, gdn=None, kv=None):
        """Append one decoder layer's launches: x += mixer(norm(x)); x += mlp(norm(x))."""
        c, w, f = model.cfg, model.w, self._fused(model)
        H, eps = c.hidden_size, c.rms_norm_eps
        xn = P.scratch("xn", M, H)
        P.add(rmsnorm_launch(x, H, w[f"{p}.input_layernorm.weight"], xn, H, M, H, eps))
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            nk, nv, dk, dv, K, C = (c.lin_num_key_heads, c.lin_num_value_heads, c.lin_key_head_dim,
                                    c.lin_value_head_dim, c.conv_kernel, c.conv_dim)
            width = C + nv * dv + 2 * nv
            gin, xc, y = P.scratch("gin", M, width), P.scratch("xc", M, C), P.scratch("gy", M, nv * dv)
            S_ring, h_ring, nslots, ck, ctrl = gdn
            P.add(gemv_launch(f[f"{a}.in"], xn, gin, M, H, H, width))
            cw = w[f"{a}.conv1d.weight"].reshape(C, K)
            P.keep.append(cw)
            P.add(gdn_conv_launch(gin, width, cw, xc, C, h_ring, P.h_stride, nslots, ck, ctrl, M, C, K))
            z, bb, aa = gin[:, C:], gin[:, C + nv * dv:], gin[:, C + nv * dv + nv:]
            P.add(gdn_recur_launch(xc, C, z, width, bb, width, aa, width, w[f"{a}.A_log"], w[f"{a}.dt_bias"],
                                   w[f"{a}.norm.weight"], y, nv * dv, S_ring, P.S_stride, nslots, ck, ctrl, M, nk, nv,
                                   dk, dv, eps))
            P.add(gemv_launch(w[f"{a}.out_proj.weight"], y, x, M, nv * dv, nv * dv, H, epi=1))
        else:
            a = f"{p}.self_attn"
            nh, nkv, hd, rh = c.num_heads, c.num_kv_heads, c.head_dim, c.rot_dim // 2
            qd, kd = nh * 2 * hd, nkv * hd
            width = qd + 2 * kd
            ain, ao = P.scratch("ain", M, width), P.scratch("ao", M, nh * hd)
            kc, vc = kv
            cos, sin = P.cos, P.sin
            P.add(gemv_launch(f[f"{a}.qkv"], xn, ain, M, H, H, width))
            P.add(kv_append_launch(ain[:, qd:], width, ain[:, qd + kd:], width, w[f"{a}.k_norm.weight"], cos, sin, 0,
                                   kc, vc, P.ctrl, M, nkv, hd, rh, eps))
            P.add(attn_decode_launch(ain, width, w[f"{a}.q_norm.weight"], cos, sin, 0, kc, vc, ao, nh * hd, P.ctrl, M,
                                     nh, nkv, hd, rh, eps, hd ** -0.5, lmax))
            P.add(gemv_launch(w[f"{a}.o_proj.weight"], ao, x, M, nh * hd, nh * hd, H, epi=1))
        I = c.intermediate_size
        act = P.scratch("act", M, I)
        P.add(rmsnorm_launch(x, H, w[f"{p}.post_attention_layernorm.weight"], xn, H, M, H, eps))
        P.add(gemv_launch(f[f"{p}.mlp.gate_up"], xn, act, M, H, H, I, epi=2, half=I))
        P.add(gemv_launch(w[f"{p}.mlp.down_proj.weight"], act, x, M, I, I, H, epi=1))

    def _new_plan(self, model, M: int, max_seq: int):
        P = _Plan(self, M, graphable=M <= GRAPH_MAX_ROWS)
        P.scratch_bufs = {}

        def scratch(name, *shape):
            b = P.scratch_bufs.get(name)
            if b is None:
                b = P.scratch_bufs[name] = P.buf(*shape)
            return b
        P.scratch = scratch
        P.cos, P.sin = self._rope_dev(model.cfg, max(max_seq, 1))
        P.keep += [P.cos, P.sin]
        return P

    def _build_main(self, model, eng, M: int, ck: bool):
        c = model.cfg
        H, V = c.hidden_size, c.vocab_size
        P = self._new_plan(model, M, eng.max_seq)
        P.S_stride = eng.n_gdn * c.lin_num_value_heads * c.lin_key_head_dim * c.lin_value_head_dim
        P.h_stride = eng.n_gdn * c.conv_dim * (c.conv_kernel - 1)
        x = P.buf(M, H)
        P.hidden, P.logits = P.buf(M, H), P.buf(M, V)
        P.add(embed_launch(model.w["embed_tokens.weight"], P.ctrl[CTRL_TOK:], x, H, M))
        gi = ai = 0
        for i, kind in enumerate(c.layer_types):
            if kind == "linear_attention":
                gdn = (eng.S[0, gi], eng.hist[0, gi], eng.nslots, int(ck), P.ctrl)
                self._layer(P, model, f"layers.{i}", kind, x, M, eng.max_seq, gdn=gdn)
                gi += 1
            else:
                self._layer(P, model, f"layers.{i}", kind, x, M, eng.max_seq, kv=(eng.kc[ai], eng.vc[ai]))
                ai += 1
        P.add(rmsnorm_launch(x, H, model.w["norm.weight"], P.hidden, H, M, H, c.rms_norm_eps))
        P.add(gemv_launch(model.head, P.hidden, P.logits, M, H, H, V))
        return P

    def _build_mtp(self, model, kc, vc, M: int):
        c, w = model.cfg, model.w
        H, V, eps = c.hidden_size, c.vocab_size, c.rms_norm_eps
        P = self._new_plan(model, M, kc.shape[0])
        P.hid_in = P.buf(M, H)
        e, cat, u = P.buf(M, H), P.buf(M, 2 * H), P.buf(M, H)
        P.hidden, P.logits = P.buf(M, H), P.buf(M, V)
        P.add(embed_launch(w["embed_tokens.weight"], P.ctrl[CTRL_TOK:], e, H, M))
        P.add(rmsnorm_launch(e, H, w["mtp.pre_fc_norm_embedding.weight"], cat, 2 * H, M, H, eps))
        P.add(rmsnorm_launch(P.hid_in, H, w["mtp.pre_fc_norm_hidden.weight"], cat[:, H:], 2 * H, M, H, eps))
        P.add(gemv_launch(w["mtp.fc.weight"], cat, u, M, 2 * H, 2 * H, H))
        self._layer(P, model, "mtp.layers.0", "full_attention", u, M, kc.shape[0], kv=(kc, vc))
        P.add(rmsnorm_launch(u, H, w["mtp.norm.weight"], P.hidden, H, M, H, eps))
        P.add(gemv_launch(model.head, P.hidden, P.logits, M, H, H, V))
        return P


def _host_small(name: str, shape, rng) -> np.ndarray:
    """The small (non-matrix) tensors, drawn on the host with random_weights' formulas."""
    if name.endswith("A_log"):
        a = np.log(rng.uniform(1.0, 16.0, shape))
    elif name.endswith("dt_bias"):
        a = rng.uniform(-1.0, 1.0, shape)
    elif name.endswith("linear_attn.norm.weight"):
        a = 1.0 + 0.1 * rng.standard_normal(shape)
    elif name.endswith("norm.weight") or "layernorm" in name or "pre_fc_norm" in name:
        a = 0.1 * rng.standard_normal(shape)
    elif name.endswith("conv1d.weight"):
        a = rng.standard_normal(shape) / np.sqrt(shape[-1])
    else:
        a = rng.standard_normal(shape) / np.sqrt(shape[-1])
    return np.ascontiguousarray(a, dtype=np.float32)


def pdl_selftest(steps: int = 6) -> bool:
    """True when graphs captured with programmatic dependent launch give the same bits as graphs
    without it (test-a shape, fp32 and bf16; prefill, steps, step_m, a checkpointed verify, MTP).
    Run it in a child process first: a driver that mishandles the launch could take the process."""
    from .config import PRESETS
    from .engine import Engine
    from .model import Model
    cfg = PRESETS["test-a"]
    t = random_weights(cfg, 21)
    outs = []
    for pdl in (False, True):
        be = CUDABackend(pdl=pdl)
        for dtype in ("fp32", "bf16"):
            m = Model(cfg, t, be, weight_dtype=dtype)
            e = Engine(m, max_seq=64, mmax=3)
            s = e.prefill([1, 2, 3, 4, 5])
            r = [s.logits]
            for i in range(steps):
                r.append(e.step(e.cursor, (7 * i) % cfg.vocab_size).logits)
            for _ in range(3):
                r.append(e.step_m(e.cursor, [3, 1, 4]).logits)
                r.append(e.verify_checkpointed(e.cursor, [1, 5, 9]).logits)
                e.select_checkpoint(2)
                r.append(e.mtp_step(e.mtp_cursor, 6, s.hidden[0]).logits)
            outs.append([x.get() for x in r])
        if pdl and (be.stats["pdl_graphs"] == 0 or be.stats["graph_errors"]):
            return False
    n = len(outs) // 2
    return all(np.array_equal(a, b) for x, y in zip(outs[:n], outs[n:]) for a, b in zip(x, y))
