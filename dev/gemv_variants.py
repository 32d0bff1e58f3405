"""GEMV variants that no engine option selects, compiled and launched for development.

The engine's projections (kestrel/ops/linear.py) compile one shape table per kernel and choose
among them by rule. What this module adds, only for measuring and checking:
  - the first tensor-core GEMV, gemv_tc (dev/kernels/gemv_tc.cu: mma.sync with the weights loaded
    straight from the row-major matrix): slower than the CUDA-core GEMV at M = 1 on the H200
    (results/bench_projections.md), kept to compare against;
  - the shape sweeps: every CUDA-core (MT, RR, PF, UP) of GEMV_FMA_SWEEP and every gemv_tmb
    (NW, KC, ST) of TMB_SWEEP beside the engine's tables;
  - launches with a chosen K split (the engine's is fixed by K: linear.ksplit, linear.tmb_ksplit).
Every variant sums in the order its family's header in kernels/linear.cu describes, so a sweep
changes speed, never bits; dev/test_gemv_variants.py holds them to that on a GPU.

One module, compiled once per process: kernels/linear.cu, then dev/kernels/gemv_tc.cu (which
uses linear.cu's tensor-core helpers), with the sweep's instantiation lists as -D macros.
"""
from __future__ import annotations

from pathlib import Path

from kestrel import nvrtc as L
from kestrel.ops import linear

DEV_KERNELS = Path(__file__).resolve().parent / "kernels"

# the CUDA-core shapes a sweep compiles beside linear.GEMV_FMA (MT, RR, PF, UP)
GEMV_FMA_SWEEP = tuple(sorted({(mt, rr, 2, up) for mt in (1, 2, 3, 4, 8) for rr in (2, 4, 8) for up in (0, 1)}
                              | {(mt, 4, 3, 0) for mt in (1, 2, 3, 4, 8)}))
# the gemv_tmb shapes a sweep compiles beside linear.TMB_SHAPES (NW, KC, ST); KC divides linear.TMB_CG
TMB_SWEEP = ((1, 256, 3), (4, 256, 3), (2, 256, 3), (8, 256, 2), (4, 128, 4), (4, 128, 3), (2, 128, 4), (2, 128, 6),
             (8, 128, 3), (4, 64, 6), (2, 64, 8))
TMB_ALL = tuple(sorted({*linear.TMB_SHAPES, *TMB_SWEEP}))
# gemv_tcg (dev/kernels/gemv_tcg.cu, not kept): (NT tiles a block, NS warps a tile, P 32-k blocks a
# stage, DB: the next stage's loads in flight during this one's mma)
TCG_SWEEP = ((1, 4, 4, 0), (1, 8, 4, 0), (1, 16, 4, 0), (1, 4, 2, 1), (1, 8, 2, 1), (1, 16, 2, 1), (2, 4, 4, 1),
             (2, 4, 4, 0), (2, 2, 8, 0), (1, 2, 4, 1))
# gemv_tc: (RT tiles of 16 rows a warp, U k-blocks of 32 a super-chunk, ST register stages)
TC_VARIANTS = ((1, 4, 2), (1, 4, 3), (1, 2, 4), (2, 2, 2))
TC_VARIANT = (1, 4, 2)          # the one it ran with while it was an engine option
TC_KSPLITS = (2, 4, 8)


def tc_ksplit(K: int) -> int:
    """Warps that share one tile's K range in gemv_tc: from K alone."""
    return 2 if K <= 2048 else 4


def _defines() -> dict:
    d = L.defines("linear")
    d.update({"GEMV_VARIANTS_BF16": linear.instantiations("GEMV_BF16", (*linear.GEMV_FMA.values(), *GEMV_FMA_SWEEP)),
              "GEMV_TMB_VARIANTS": linear.instantiations("GEMV_TMB", TMB_ALL),
              "GEMV_TCG_VARIANTS": linear.instantiations("GEMV_TCG", TCG_SWEEP)})
    return d


_FUNCS: dict = {}


def kernel(name: str):
    """A kernel of the development module (every engine kernel, the sweeps and gemv_tc), one object
    per name (nvrtc.smem remembers a kernel's shared-memory opt-in by the object)."""
    if name not in _FUNCS:
        mod = L.source_module("linear+dev", [L.KERNEL_DIR / "linear.cu", DEV_KERNELS / "gemv_tc.cu",
                                             DEV_KERNELS / "gemv_tcg.cu"], _defines())
        _FUNCS[name] = mod.get_function(name)
    return _FUNCS[name]


def gemv_tc_launch(W, X, Y, M: int, K: int, ldx: int, ldy: int, epilogue: str = "store", half: int = 0,
                   variant: tuple | None = None, ks: int | None = None):
    """(fn, grid, block, args, smem) of gemv_tc (bf16 W with K and row stride multiples of 8, ldx a
    multiple of 4, 16-byte aligned W and X)."""
    ldw = W.strides[0] // W.itemsize
    if not (W.dtype.kind == "u" and W.itemsize == 2 and K % 8 == 0 and ldw % 8 == 0 and W.data.ptr % 16 == 0
            and ldx % 4 == 0 and X.data.ptr % 16 == 0):
        raise ValueError(f"gemv_tc needs bf16 weights with K and row stride multiples of 8, ldx a multiple of 4 "
                         f"and 16-byte aligned W and X (dtype {W.dtype}, K {K}, row stride {ldw}, ldx {ldx})")
    rt, u, st = variant or TC_VARIANT
    if (rt, u, st) not in TC_VARIANTS:
        raise ValueError(f"gemv_tc variant {(rt, u, st)} not one of {TC_VARIANTS}")
    ks = ks or tc_ksplit(K)
    if ks not in TC_KSPLITS:
        raise ValueError(f"gemv_tc K split {ks} not one of {TC_KSPLITS}")
    epi = linear.EPI[epilogue]
    nout = half if epi == 2 else W.shape[0]
    tiles = L.cdiv(nout, 8 if epi == 2 else 16)
    tpb = 1 if ks >= 4 else 4 // ks
    fn = kernel(f"gemv_tc_k{ks}_r{rt}_u{u}_s{st}_e{epi}")
    args = (L.ptr(W), L.i32(ldw), L.ptr(X), L.i32(ldx), L.ptr(Y), L.i32(ldy), L.i32(nout), L.i32(K), L.i32(M),
            L.i32(half))
    return fn, (L.cdiv(tiles, rt * tpb), L.cdiv(M, 8)), (32 * ks * tpb,), args, 0


def gemv_tiled_launch(kind: str, W, tiled, X, Y, M: int, K: int, ldx: int, ldy: int, epilogue: str = "store",
                      half: int = 0, shape: tuple | None = None, ks: int | None = None):
    """gemv_tmb ("tmb", shape in TMB_ALL), gemv_tmr ("tmr", shape in linear.TMR_SHAPES) or gemv_tcg
    ("tcg", shape in TCG_SWEEP) with any compiled shape and K split; defaults: the engine's choice."""
    T = linear.tmb_tiles(W.shape[0], epilogue, half)
    ks = ks or linear.tmb_ksplit(K, T)
    if shape is None:
        shape = {"tmb": linear.tmb_shape, "tmr": linear.tmr_shape, "tcg": lambda T, ks: TCG_SWEEP[0]}[kind](T, ks)
    compiled = {"tmb": TMB_ALL, "tmr": linear.TMR_SHAPES, "tcg": TCG_SWEEP}[kind]
    if tuple(shape) not in compiled:
        raise ValueError(f"gemv_{kind} shape {tuple(shape)} not compiled (one of {compiled})")
    epi = linear.EPI[epilogue]
    name = {"tmb": "gemv_tmb_w{}_c{}_s{}", "tmr": "gemv_tmr_t{}_p{}", "tcg": "gemv_tcg_t{}_s{}_p{}_d{}"}[kind]
    name = name.format(*shape) + f"_e{epi}"
    if kind == "tcg":
        return _tcg_launch(shape, ks, W, tiled, X, Y, M, K, ldx, ldy, epilogue, half, kernel(name))
    return linear._tiled_launch(kind, shape, ks, W, tiled, X, Y, M, K, ldx, ldy, epilogue, half, fn=kernel(name))


def tcg_groups(K: int, ks: int) -> int:
    """Chain groups of one tile over its ks parts (each part's groups start at the part's start)."""
    nkb, G = K // 32, linear.TMB_CG // 32
    return sum(-(-((z + 1) * nkb // ks - z * nkb // ks) // G) for z in range(ks))


def tcg_smem(nt: int, K: int, ks: int) -> int:
    """gemv_tcg's shared memory: every chain group's sum (a float4 a lane) of the block's NT tiles."""
    return nt * tcg_groups(K, ks) * 512


def _tcg_launch(shape, ks, W, tiled, X, Y, M, K, ldx, ldy, epilogue, half, fn):
    """gemv_tcg: the K split is an order only (no scratch)."""
    T = linear._tiled_checks("gemv_tcg", W, tiled, X, K, ldx, epilogue, half, ks)
    nt, ns, _, _ = shape
    nout = half if epilogue == "swiglu" else W.shape[0]
    sm = L.smem(fn, tcg_smem(nt, K, ks), "gemv_tcg")
    args = (L.ptr(tiled), L.ptr(X), L.i32(ldx), L.ptr(Y), L.i32(ldy), L.i32(nout), L.i32(K), L.i32(M), L.i32(T),
            L.i32(ks))
    return fn, (L.cdiv(T, nt) * L.cdiv(M, 8), 1, 1), (32 * nt * ns,), args, sm


def gemv_fma_launch(W, X, Y, M: int, K: int, ldx: int, ldy: int, epilogue: str = "store", half: int = 0,
                    fma: tuple | None = None, ks: int | None = None):
    """The CUDA-core GEMV with any (MT, RR, PF, UP) of the sweep and any K split (1, 2 or 4);
    defaults: the engine's choice."""
    shape = fma or linear.fma_shape(M)
    if shape not in (*linear.GEMV_FMA.values(), *GEMV_FMA_SWEEP):
        raise ValueError(f"CUDA-core GEMV shape {shape} not compiled")
    if ks not in (None, 1, 2, 4):
        raise ValueError(f"CUDA-core GEMV K split {ks}: expected 1, 2 or 4")
    bf16 = W.dtype.kind == "u"
    mt, rr, pf, up = shape
    fn = kernel(f"gemv_{'bf16' if bf16 else 'f32'}_v{8 if bf16 else 4}_m{mt}_r{rr}_p{pf}_u{up}_e{linear.EPI[epilogue]}")
    return linear._fma_launch(shape, W, X, Y, M, K, ldx, ldy, epilogue, half, fn=fn, ks=ks)
