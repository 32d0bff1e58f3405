"""Dense projection y = x · Wᵀ, batch-invariant (NumPy twin and launchers of kernels/linear.cu).

BLAS picks a different kernel (gemv vs gemm, other blockings) for different M, and a
different kernel sums in a different order: row j of a 3-row call would then differ in
the last bit from the same row alone. So on the CPU every projection runs on blocks of
exactly ROWS rows (zero padded): one GEMM shape for every call, so a row's result never
depends on how many rows came with it. On the GPU, kernels/linear.cu sums each row in an
order fixed by K alone (its header says how).

GPU kernels (kernels/linear.cu), one order per engine option (CUDABackend's KernelOptions.gemv):
"tmb", the default for bf16 weights, tensor cores (activation rows padded to 8 columns, x split
exactly into three bf16 terms, so its arithmetic does not depend on M) on weights stored tiled in
fragment order (tmb_tiled; by default the tiled copy replaces the original, the kernel option
tiled_only; with tiled_only=False the engine keeps it beside the original, CUDABackend.tiled, about
the weights' size again; sm_90 and later); "fma", the CUDA-core GEMV (fp32 FMA, every weight dtype:
fp32 weights always take it), the bf16 default until 2026-12-07 and kept as an option for comparison
(results/cuda_notes.md has the record of the two). "tmb" is two kernels with one order, so one set
of bits, and tmb_kernel picks one per matrix and M: gemv_tmr, each warp loading its tile's weights
straight into registers, where its warps hold the whole matrix at once, and gemv_tmb, fed by bulk
copies into shared memory, for matrices of many waves (the 27B gate|up, the head) and for every
launch of more than 8 rows (a batch's), several row groups a block. fp32 weights, and bf16 matrices
whose K, row stride or address is not a multiple of 8 elements / 16 bytes, always take the CUDA-core
kernel (as do activations whose row stride or address is not a multiple of 4 elements / 16 bytes,
and "tmb" where tmb_eligible says no; a matrix kept only tiled refuses such a launch instead,
kestrel/cuda/lower.py, and the engine's own programs make none). All are batch-invariant; "fma" and "tmb" differ in the last
bits, so one engine uses one of them throughout. Which is faster where is measured by
scripts/bench_engine.py and dev/bench_projections.py (results/bench_engine*.md,
results/bench_projections.md). Kernel variants that no engine option selects (the first tensor-core
GEMV, shape sweeps) live in dev/ with their harness.
"""
import importlib

import numpy as np

from .. import nvrtc as L

ROWS = 8                # one fixed CPU GEMM shape; >= any verify width kestrel uses (k <= 8)
LINEAR_THREADS = 128    # 4 warps a block

# CUDA-core GEMV shapes (MT activation rows a block, RR weight rows a warp group, PF register
# stages, UP 1: widen the weights once for all MT rows), by the widest M they serve: the first
# entry with M <= its key is used. All of them sum in one order, so the choice changes speed,
# never bits. MT = M exactly up to 4: a block that holds accumulators for rows it does not have
# costs registers, hence occupancy (results/cuda_notes.md has the sweep behind this table).
# One table for bf16 and fp32 weights.
GEMV_FMA = {1: (1, 4, 2, 0), 2: (2, 4, 2, 0), 3: (3, 4, 2, 0), 4: (4, 4, 2, 0), 8: (8, 4, 2, 0)}
KSPLIT_MIN_K = 4096            # the CUDA-core kernel splits a row's K over 2 warps from this K up

# gemv_tmb: (NW tiles a block, KC k a stage, ST stages). The chain group (TMB_CG k: the mma chains
# restart and fold into the sum at each group's end) and the K split (tmb_ksplit) fix a row's order;
# NW, KC (a divisor of TMB_CG) and ST only its speed, so the engine picks a shape by the work
# (tmb_shape) among TMB_SHAPES, widest first.
TMB_CG = 256
TMB_SHAPES = ((4, 256, 2), (3, 256, 2), (2, 256, 2))
# gemv_tmb over RG row groups of 8 a block (NW, KC, ST, RG), for launches of more than 8 rows (a
# batch's): NW·RG warps, each one (tile, row group), share a stage's weights in shared memory, so a
# block reads its tiles once for 8·RG rows where one row group a block re-reads them for every
# further 8 rows. The same order as TMB_SHAPES (RG changes which block and warp hold a row group,
# not its arithmetic), so tmb_kernel takes it for every M > 8: tmbg_shape(M, ks) picks from
# TMBG_PICK (a matrix in one K part) or TMBG_PICK_KSPLIT (split K), by the widest M each entry
# serves. TMBG_SHAPES are every compiled shape (dev/bench_rows.py times them all). Timed on an H100
# for five 9B and 27B matrices (dev/results/bench_rows_h100_warp_per_group.json, results/cuda_notes.md):
# two row groups a block at KC = 128 (8 warps, three blocks a multiprocessor) was the fastest
# compiled shape at M = 64 for all five and at M = 16 for four (the fifth 5 % behind one row group
# a block); at M = 32 it was fastest for the three matrices of many tiles, while the two K-split
# matrices of few tiles (the 27B down and out projections) took 19 and 21 % longer on it than on
# four row groups a block, whose fewer blocks still cover the multiprocessors there. Eight row
# groups a block lost everywhere.
TMBG_PICK = {64: (4, 128, 2, 2)}
TMBG_PICK_KSPLIT = {16: (4, 128, 2, 2), 32: (4, 128, 2, 4), 64: (4, 128, 2, 2)}
TMBG_SHAPES = tuple(sorted(set(TMBG_PICK.values()) | set(TMBG_PICK_KSPLIT.values())
                          | {(4, 256, 2, 2), (4, 128, 2, 4), (4, 128, 2, 8), (2, 256, 2, 4), (2, 128, 2, 8)}))
TMB_KSPLITS = (1, 2, 3, 4)
TMB_KSPLIT_TILES = 512         # tmb_ksplit: a matrix of at least this many tiles is one part
TMB_KSPLIT_MIN_K = 2048        # tmb_ksplit: so is a row shorter than this
TMB_KSPLIT_FEW_TILES = 128     # tmb_ksplit: up to this many tiles, TMB_KSPLIT_FEW parts; else TMB_KSPLIT_SOME
TMB_KSPLIT_FEW, TMB_KSPLIT_SOME = 4, 3
TMB_SCRATCH_SLOTS = 1 << 17    # (part, row group, tile) slots of the first K-split scratch: 64 MiB
TMB_FILL = 0.8                 # tmb_shape: the least share of every wave's block slots a shape must fill
# gemv_tmr: (T tiles = compute warps a block, P 32-k blocks of weights a warp keeps in flight). The
# same tiled weights, K split and order as gemv_tmb, so the same bits: "tmb" picks one of the two
# kernels per matrix (tmb_kernel), which changes only the speed.
TMR_SHAPES = ((8, 8), (4, 8), (2, 8), (8, 4), (4, 4), (2, 4), (1, 8))


def instantiations(kind: str, shapes) -> str:
    """The kernel instantiation list one -D macro carries: kind(a,b,...) for each shape."""
    return " ".join(f"{kind}({','.join(str(v) for v in s)})" for s in sorted(set(shapes)))


CUDA_DEFINES = {"LINEAR_THREADS": LINEAR_THREADS, "TMB_CG": TMB_CG,
                "GEMV_VARIANTS_BF16": instantiations("GEMV_BF16", GEMV_FMA.values()),
                "GEMV_VARIANTS_F32": instantiations("GEMV_F32", GEMV_FMA.values()),
                "GEMV_TMB_VARIANTS": instantiations("GEMV_TMB", TMB_SHAPES),
                "GEMV_TMBG_VARIANTS": instantiations("GEMV_TMBG", TMBG_SHAPES),
                "GEMV_TMR_VARIANTS": instantiations("GEMV_TMR", TMR_SHAPES)}
L.register("linear", CUDA_DEFINES)
EPI = {"store": 0, "add": 1, "swiglu": 2}

GEMVS = ("fma", "tmb")          # the engine's bf16 GEMV options (KernelOptions.gemv; default: kestrel.settings)


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [M, K] float32, w [N, K] float32 -> [M, N] float32."""
    m, k = x.shape
    out = np.empty((m, w.shape[0]), np.float32)
    block = np.zeros((ROWS, k), np.float32)
    wt = w.T
    for s in range(0, m, ROWS):
        n = min(ROWS, m - s)
        block[:n] = x[s:s + n]
        block[n:] = 0.0
        out[s:s + n] = (block @ wt)[:n]
    return out


def ksplit(K: int) -> int:
    """Warps that share one output row's K range: from K alone, so the order is fixed
    (chosen by a sweep, results/cuda_notes.md)."""
    return 1 if K < KSPLIT_MIN_K else 2


def tmb_ksplit(K: int, tiles: int) -> int:
    """Blocks that share one tile's K range in gemv_tmb and gemv_tmr: from the matrix's shape alone
    (its K and its tile count), never from M or the GPU, so a matrix sums in one order on every
    device and for every batch. A matrix of few tiles and long rows (the down and out projections)
    is split so that its few tiles still give every multiprocessor work: TMB_KSPLIT_FEW parts for
    the fewest tiles, TMB_KSPLIT_SOME below TMB_KSPLIT_TILES; rows shorter than TMB_KSPLIT_MIN_K
    and matrices of many tiles are one part (a part's scratch, fence and count would cost more
    than the parallelism gives). The thresholds come from dev/sweep_tiled.py (results/cuda_notes.md)."""
    if tiles >= TMB_KSPLIT_TILES or K < TMB_KSPLIT_MIN_K:
        return 1
    return TMB_KSPLIT_FEW if tiles <= TMB_KSPLIT_FEW_TILES else TMB_KSPLIT_SOME


def _device() -> dict:
    """The current GPU's compute capability (90 for sm_90) and multiprocessor count."""
    return {"cc": L.compute_capability(), "sms": int(L.device_props()["multiProcessorCount"])}


def tmb_eligible(W, K: int, X, ldx: int) -> bool:
    """bf16 weights, K in 32-k blocks, activations in 16-byte aligned rows, a GPU with bulk copies
    (sm_90 and later: gemv_tmb needs them; gemv_tmr does not, but "tmb" is one engine option)."""
    return (W.dtype == np.uint16 and K % 32 == 0 and K >= 32 and ldx % 4 == 0
            and X.data.ptr % 16 == 0 and _device()["cc"] >= 90)


def tmb_tiles(rows: int, epilogue: str = "store", half: int = 0) -> int:
    return -(-half // 8) if epilogue == "swiglu" else -(-rows // 16)


def tmb_tiled(W, K: int, epilogue: str = "store", half: int = 0):
    """W [rows, K] bf16 bits (NumPy or CuPy) -> the same array module's [tiles·16, K] uint16 array
    whose bytes are gemv_tmb's layout: tile T (rows 16T.. of W, or for swiglu the gate rows 8T..
    then the up rows half + 8T..; zero rows past the end), 32-k block kb, mma step s, g, t, then
    (q, h, j) -> W[row g + 8h of the tile, 32kb + 8t + 4s + 2q + j]: lane (g, t)'s 16 bytes of
    step s are its A fragment, the four registers in the order the mma reads them."""
    xp = np if isinstance(W, np.ndarray) else importlib.import_module("cupy")
    if K % 32 or W.shape[1] != K:
        raise ValueError(f"tmb_tiled: K {K} must be the row length ({W.shape[1]}) and a multiple of 32")
    T = tmb_tiles(W.shape[0], epilogue, half)
    if epilogue == "swiglu":
        rows = xp.zeros((T, 16, K), xp.uint16)
        for j, r0 in ((0, 0), (8, half)):   # gate rows, then up rows, 8 a tile
            part = xp.zeros((T * 8, K), xp.uint16)
            part[:half] = W[r0:r0 + half]
            rows[:, j:j + 8] = part.reshape(T, 8, K)
    else:
        rows = xp.zeros((T * 16, K), xp.uint16)
        rows[:W.shape[0]] = W
    t = rows.reshape(T, 2, 8, K // 32, 4, 2, 2, 2).transpose(0, 3, 5, 2, 4, 6, 1, 7)   # [T][kb][s][g][t][q][h][j]
    return xp.ascontiguousarray(t).reshape(T * 16, K)


class TiledOnly:
    """A projection matrix kept only as its tiled copy (the engine option tiled_only): the shape and
    dtype its launches read, and `tiled` (tmb_tiled of the dropped original; None for a row view of a
    stack, whose stack holds the copy). Its contents cannot be read back: the original's rows no
    longer exist, and the tiled bytes are in another order."""

    def __init__(self, name: str, shape: tuple, tiled=None):
        self.name, self.shape, self.tiled = name, tuple(shape), tiled
        self.dtype, self.ndim = np.dtype(np.uint16), len(shape)

    def _refuse(self, *args, **kwargs):
        raise ValueError(f"weight {self.name} {self.shape} is kept only as its tiled copy (kernel option "
                         f"tiled_only): its rows cannot be read back; load the model without tiled_only")

    __array__ = __getitem__ = _refuse

    def __repr__(self):
        return f"TiledOnly({self.name!r}, {self.shape})"


def tmb_smem(nw: int, kc: int, st: int, rg: int = 1) -> int:
    """ST ring slots (NW tiles' weights, 8·RG padded x rows), then one stage's split activations
    (RG row groups)."""
    return st * (nw * 32 * kc + 8 * rg * (4 * kc + 16)) + rg * (kc // 32) * 1536


def tmbg_shape(M: int, ks: int = 1) -> tuple:
    """The engine's gemv_tmb shape over several row groups a block, for an M-row launch (M > 8) on a
    matrix split ks ways: the pick table's (TMBG_PICK, or TMBG_PICK_KSPLIT when ks > 1) entry for
    the least M at least this one, else its widest. Bits do not depend on it."""
    pick = TMBG_PICK_KSPLIT if ks > 1 else TMBG_PICK
    return next((v for m, v in sorted(pick.items()) if M <= m), pick[max(pick)])


def tmb_shape(tiles: int, ks: int) -> tuple:
    """The engine's gemv_tmb shape for a matrix of `tiles` tiles split ks ways: the widest NW (x
    shared by more tiles) whose blocks fill at least TMB_FILL of the block slots of every wave, the last
    one included (a last wave of a few blocks runs each alone, with one stage in flight); else the
    shape that fills them best. Bits do not depend on it."""
    def fill(shape):
        slots = _device()["sms"] * max(1, (L.SMEM_MAX + 1024) // (tmb_smem(*shape) + 1024))
        blocks = L.cdiv(tiles, shape[0]) * ks
        return blocks / (L.cdiv(blocks, slots) * slots)
    return next((s for s in TMB_SHAPES if fill(s) >= TMB_FILL), max(TMB_SHAPES, key=fill))


_TMB_SCRATCH: list = []     # (slots, part, count), each larger than the one before; none is freed


def tmb_scratch(slots: int = 0):
    """The K-split scratch that gemv_tmb and gemv_tmr launches share: partial D fragments (a float4 per lane) of
    `slots` (part, row group, tile) slots at least, and one arrival count per slot, zero between
    launches (the last block of a tile resets it). Launches in one stream never overlap their use
    of it: a kernel touches it only after griddep_wait(), when the kernel before it has finished.
    A launch that needs more (a long prefill) gets a new, larger scratch; the old ones stay
    allocated, since launches already built (cached plans) point into them."""
    if not _TMB_SCRATCH or _TMB_SCRATCH[-1][0] < slots:
        import cupy as cp
        n = max(slots, TMB_SCRATCH_SLOTS, 2 * _TMB_SCRATCH[-1][0] if _TMB_SCRATCH else 0)
        _TMB_SCRATCH.append((n, cp.empty((n * 32, 4), cp.float32), cp.zeros(n, cp.int32)))
    return _TMB_SCRATCH[-1][1], _TMB_SCRATCH[-1][2]


def _tiled_checks(name: str, W, tiled, X, K: int, ldx: int, epilogue: str, half: int, ks: int) -> int:
    """What gemv_tmb and gemv_tmr both ask of a launch (the same tiled weights and K split):
    the tile count, or a ValueError naming the problem."""
    if not tmb_eligible(W, K, X, ldx):
        raise ValueError(f"{name} needs bf16 weights, K a positive multiple of 32, ldx a multiple of 4 and "
                         f"16-byte aligned X (dtype {W.dtype}, K {K}, ldx {ldx})")
    if ks not in TMB_KSPLITS or ks > K // 32:
        raise ValueError(f"{name} K split {ks}: expected one of {TMB_KSPLITS}, at most K/32 = {K // 32}")
    T = tmb_tiles(W.shape[0], epilogue, half)
    if tiled.dtype != np.uint16 or tiled.shape != (T * 16, K) or not tiled.flags.c_contiguous:
        raise ValueError(f"{name}: tiled weights {tiled.dtype} {tiled.shape} are not tmb_tiled of this "
                         f"matrix ({T * 16}, {K})")
    return T


def _tiled_launch(kind: str, shape: tuple, ks: int, W, tiled, X, Y, M: int, K: int, ldx: int, ldy: int,
                  epilogue: str = "store", half: int = 0, fn=None):
    """(fn, grid, block, args, smem) of gemv_tmb (kind "tmb", shape (NW, KC, ST) or, over RG row
    groups a block, (NW, KC, ST, RG)) or gemv_tmr
    ("tmr", (T, P)) split ks ways. The engine's launchers pass its own choice (tmb_kernel,
    tmb_ksplit); the tests pass every compiled shape and K split to hold them to one set of bits,
    and dev/ passes kernels it compiled itself (fn)."""
    name = f"gemv_{kind}"
    T = _tiled_checks(name, W, tiled, X, K, ldx, epilogue, half, ks)
    compiled = TMB_SHAPES + TMBG_SHAPES if kind == "tmb" else TMR_SHAPES
    if fn is None and tuple(shape) not in compiled:
        raise ValueError(f"{name} shape {tuple(shape)} not compiled (one of {compiled})")
    epi = EPI[epilogue]
    rows = 8     # activation rows a block
    if kind == "tmb":
        nw, kc, st, rg = (*shape, 1) if len(shape) == 3 else shape
        fn = fn or L.kernel("linear", f"gemv_tmb_w{nw}_c{kc}_s{st}{f'_g{rg}' if rg > 1 else ''}_e{epi}")
        sm, per_block, block, rows = L.smem(fn, tmb_smem(nw, kc, st, rg), name), nw, 32 * nw * rg, 8 * rg
    else:
        t, p = shape
        fn = fn or L.kernel("linear", f"gemv_tmr_t{t}_p{p}_e{epi}")
        sm, per_block, block = 0, t, 32 * (t + 1)
    nout = half if epi == 2 else W.shape[0]
    part, count = tmb_scratch(ks * L.cdiv(M, 8) * T if ks > 1 else 0)
    args = (L.ptr(tiled), L.ptr(X), L.i32(ldx), L.ptr(Y), L.i32(ldy), L.i32(nout), L.i32(K), L.i32(M), L.i32(T),
            L.i32(ks), L.ptr(part), L.ptr(count))
    return fn, (L.cdiv(T, per_block) * L.cdiv(M, rows), 1, ks), (block,), args, sm     # block order: kernels/linear.cu


def tmr_shape(tiles: int, ks: int) -> tuple:
    """The engine's gemv_tmr shape: the most tiles a block (activations split once for more tiles)
    that still gives every multiprocessor a block, at P = 8. Bits do not depend on it."""
    return next(((t, 8) for t in (8, 4, 2) if L.cdiv(tiles, t) * ks >= _device()["sms"]), (1, 8))


def tmb_kernel(tiles: int, ks: int, epilogue: str = "store", M: int = 1) -> tuple:
    """The engine's kernel for an M-row launch on a tiled matrix of `tiles` tiles split ks ways.
    M > 8 (a batch): ("tmb", tmbg_shape(M, ks)), each block reading its tiles once for up to 64 rows.
    M <= 8: ("tmr", tmr_shape) where all of gemv_tmr's blocks fit on the GPU at once, else
    ("tmb", tmb_shape).
    gemv_tmr keeps P KB a warp in flight, so one wave streams at full rate, but a second, partial
    wave runs its few warps alone (the 27B gate|up is slower on it: results/cuda_notes.md); gemv_tmb,
    whose copies need few warps, streams many waves better. Bits do not depend on the choice."""
    if M > 8:
        return "tmb", tmbg_shape(M, ks)
    t, p = tmr_shape(tiles, ks)
    fn = L.kernel("linear", f"gemv_tmr_t{t}_p{p}_e{EPI[epilogue]}")
    slots = _device()["sms"] * L.blocks_per_sm(fn, 32 * (t + 1))
    return ("tmr", (t, p)) if L.cdiv(tiles, t) * ks <= slots else ("tmb", tmb_shape(tiles, ks))


def fma_shape(M: int) -> tuple:
    """(MT, RR, PF, UP) of the CUDA-core GEMV for an M-row launch (wider M: MT rows per grid.y)."""
    return next((v for m, v in sorted(GEMV_FMA.items()) if M <= m), GEMV_FMA[max(GEMV_FMA)])


def gemv_launch(W, X, Y, M: int, K: int, ldx: int, ldy: int, epilogue: str = "store", half: int = 0,
                gemv: str = "fma", tiled=None):
    """(fn, grid, block, args, smem) for Y (op)= X · Wᵀ over M rows.

    W [N, K] (uint16 bf16 bits or float32, C-contiguous rows), X [M, ldx], Y [M, ldy].
    epilogue: store, add (Y += X·Wᵀ, the residual) or swiglu over W = [gate; up] (half = gate rows).
    gemv: the engine's bf16 GEMV, "fma" or "tmb" (its backend's KernelOptions.gemv; the launcher's
    own default is "fma", the one kernel that needs no tiled copy).
    tiled: tmb_tiled(W, K, epilogue, half), which "tmb" needs (the caller keeps it alive)."""
    bf16 = W.dtype == np.uint16
    if gemv not in GEMVS:
        raise ValueError(f"gemv={gemv!r}: expected one of {GEMVS}")
    if bf16 and gemv == "tmb" and tmb_eligible(W, K, X, ldx):
        if tiled is None:
            raise ValueError("gemv='tmb' needs the tiled weights: tiled=tmb_tiled(W, K, epilogue, half)")
        tiles = tmb_tiles(W.shape[0], epilogue, half)
        ks = tmb_ksplit(K, tiles)
        kind, shape = tmb_kernel(tiles, ks, epilogue, M)
        return _tiled_launch(kind, shape, ks, W, tiled, X, Y, M, K, ldx, ldy, epilogue, half)
    return _fma_launch(fma_shape(M), W, X, Y, M, K, ldx, ldy, epilogue, half)


def _fma_launch(shape: tuple, W, X, Y, M: int, K: int, ldx: int, ldy: int, epilogue: str = "store", half: int = 0,
                fn=None, ks: int | None = None):
    """(fn, grid, block, args, smem) of the CUDA-core GEMV with shape (MT, RR, PF, UP) (the engine's:
    fma_shape(M)) and K split ks (the engine's: ksplit(K)); fn: a kernel of that shape that dev/
    compiled itself."""
    bf16 = W.dtype == np.uint16
    N, ldw = W.shape[0], W.strides[0] // W.itemsize
    v = 8 if bf16 else 4
    vec = v if (K % v == 0 and ldw % v == 0 and ldx % 4 == 0 and W.data.ptr % 16 == 0
                and X.data.ptr % 16 == 0) else 1
    if vec > 1:
        mt, rr, pf, up = shape
        name = f"gemv_{'bf16' if bf16 else 'f32'}_v{vec}_m{mt}_r{rr}_p{pf}_u{up}"
    else:
        mt = 1 if M == 1 else 8
        rr = 8 if mt == 8 else 4
        name = f"gemv_{'bf16' if bf16 else 'f32'}_v1_m{mt}"
    epi = EPI[epilogue]
    rl = rr // 2 if epi == 2 else rr
    ks = ks or ksplit(K)
    nout = half if epi == 2 else N
    grid = (L.cdiv(nout, rl * ((LINEAR_THREADS // 32) // ks)) * L.cdiv(M, mt),)     # block order: kernels/linear.cu
    fn = fn if (fn is not None and vec > 1) else L.kernel("linear", f"{name}_e{epi}")
    args = (L.ptr(W), L.i32(ldw), L.ptr(X), L.i32(ldx), L.ptr(Y), L.i32(ldy), L.i32(nout), L.i32(K), L.i32(M),
            L.i32(half), L.i32(ks))
    return fn, grid, (LINEAR_THREADS,), args, 0
