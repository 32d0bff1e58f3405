// kernels/linear.cu: dense projection for a few rows, y = x · Wᵀ (NumPy twin and launchers:
// kestrel/ops/linear.py). Three kernels compute it; kestrel/ops/linear.py says which one runs.
//
// Math (all)   y[m, n] = Σ_k W[n, k] · x[m, k] with fp32 accumulation; x, y fp32; W bf16 (raw bits)
//              or fp32. Epilogue EPI: 0 store y = s; 1 accumulate y = y + s (the residual add);
//              2 SwiGLU over a stacked [gate; up] matrix: y[m, n] = silu(s_gate[n]) · s_up[n], the up
//              row of output n being physical row half + n.
// Layout       W [N, ldw] row-major (k contiguous); x [M, ldx]; y [M, ldy].
//
// ==== tensor-core arithmetic (gemv_tmb, gemv_tmr) ===================================================
//
// Math     mma.sync m16n8k16 (bf16 × bf16 → fp32): A = 16 weight rows × 16 k, B = 16 k × 8 activation
//          rows. x is fp32, so each x[m, k] is split exactly into three bf16 terms by truncation:
//              hi = x with its low 16 bits cleared, mid = (x − hi) likewise, lo = x − hi − mid
//          (x has 24 significant bits, each term takes 8, so x = hi + mid + lo exactly, short of
//          underflow below 2^-100). Each bf16 × bf16 product is exact in fp32, so the three mma per
//          16-k step (D_hi, D_mid, D_lo) lose only the tensor core's fp32 summation: fp32 accuracy.
//          A row's K permutation (the slots of the mma each k takes) is written out under gemv_tmb.
// PDL      gemv_tmb and gemv_tmr let their dependents launch only after their own griddep_wait(),
//          whatever the module's PDL_WAIT_FIRST (the other kernels follow it: griddep_enter()). A
//          kernel that lets its dependents launch before its own wait lets early launches chain
//          ahead: the blocks of the next tiled GEMV (150-190 registers a thread) then wait on the
//          SMs while the GEMV before it still runs, taking its room. On an H100 the 0.8B step took
//          1.53 ms replayed with PDL against 1.42 without it (results/cuda_notes.md). Scheduling
//          only: no row's order changes.
//
// ==== gemv_{bf16,f32}_*: CUDA cores (fp32 weights, and bf16 unless the tensor-core path is chosen) =
//
// Launch   block = LINEAR_THREADS = 128 threads = NW = 4 warps. `ksplit` warps (1, 2 or 4, chosen
//          from K alone) share the K range of one group of RL output rows; a block holds
//          NW/ksplit such groups. grid = ceil(N_out / (RL · NW/ksplit)) · ceil(M / MT) (the block
//          order below). Each block reads its weight rows
//          once for all MT activation rows: one pass over W serves a whole verify batch.
//          VEC = elements per 16-byte weight load (8 bf16, 4 fp32), or 1 (scalar fallback for
//          K, ldw or pointers that are not 16-byte multiples).
//          (MT, RR, PF, UP) per M: GEMV_FMA in kestrel/ops/linear.py (MT = M up to 4, then 8).
//          PF register stages of RR 16-byte weight chunks each: PF − 1 chunks in flight per lane.
// PDL      the first PF − 1 weight chunks are loaded before griddep_wait(): under programmatic
//          dependent launch a projection starts streaming while the previous kernel finishes.
// Order    lane l of warp w (of the ksplit) sums chunks c = 32w + l, 32w + l + 32·ksplit, ... in
//          increasing c, the VEC elements of a chunk in order, with fmaf, separately for each
//          row m; then a warp xor-butterfly; then the ksplit warps in index order. Nothing here
//          depends on M, MT, RR or PF, so row m of a launch is bit-identical to that row launched
//          alone (batch invariance), given the same K (hence ksplit and VEC).
//          The arithmetic grows with M (MT · 8 fmaf per 16-byte load), which is why M = 4 streams
//          slower than M = 1 here: deeper stages made it slower still (registers, so occupancy),
//          so the limit is the instructions per weight byte, not the loads in flight.
//
// ==== block order (all) ===============================================================================
//
// M rows go in row groups of 8 (MT under gemv_{bf16,f32}_*) and a weight tile block reads its
// weights once per row group. The row groups of one tile block are adjacent in the grid
// (blockIdx.x = tile block · nrg + row group, nrg = ceil(M / 8)), so the blocks that read the
// same weights run together and all but the first find them in L2: one pass over the weights
// from memory however many rows share the launch (the batched engine's many sequences). The L2
// re-reads are not free: past 16 rows they bound the launch (dev/bench_rows.py: the 27B gate|up
// at M = 64 took 5.2x its M = 1 time on an H100, under either GEMV), which is what gemv_tmb over
// several row groups a block (RG > 1, below) is for. Which block computes a row changes with M; a
// row's arithmetic does not.
#include "common.cuh"

// (tile block, row group) of this block, row groups of `rows` (blockIdx.x: see "block order")
__device__ __forceinline__ int row_groups(int M, int rows) { return (M + rows - 1) / rows; }
__device__ __forceinline__ int tile_block(int M, int rows) { return blockIdx.x / row_groups(M, rows); }
__device__ __forceinline__ int row_group(int M, int rows) { return blockIdx.x % row_groups(M, rows); }

// element e of a 16-byte chunk (e is a compile-time constant after unrolling)
template <bool BF16>
__device__ __forceinline__ float chunk_elem(const uint4& u, int e) {
    if constexpr (BF16) {
        const int q = e >> 1;
        const unsigned int w = q == 0 ? u.x : q == 1 ? u.y : q == 2 ? u.z : u.w;
        return (e & 1) ? bf16_hi(w) : bf16_lo(w);
    } else {
        const unsigned int w = e == 0 ? u.x : e == 1 ? u.y : e == 2 ? u.z : u.w;
        return __uint_as_float(w);
    }
}

template <bool BF16, int VEC>
__device__ __forceinline__ uint4 load_wchunk(const void* W, i64 off) {
    if constexpr (VEC == 1) {
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if constexpr (BF16) u.x = ((unsigned int)__ldg((const bf16_t*)W + off)) << 16;
        else u.x = __float_as_uint(__ldg((const float*)W + off));
        return u;
    } else {
        return ld_stream16(BF16 ? (const void*)((const bf16_t*)W + off) : (const void*)((const float*)W + off));
    }
}

template <bool BF16, int VEC>
__device__ __forceinline__ float w_elem(const uint4& u, int e) {
    if constexpr (VEC == 1) return __uint_as_float(u.x);   // already widened to fp32 bits
    else return chunk_elem<BF16>(u, e);
}

template <int VEC>
__device__ __forceinline__ void load_x(const float* __restrict__ x, float* xv) {
    if constexpr (VEC == 8) {
        const float4 a = __ldg((const float4*)x), b = __ldg((const float4*)x + 1);
        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
        xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
    } else if constexpr (VEC == 4) {
        const float4 a = __ldg((const float4*)x);
        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
    } else {
        xv[0] = __ldg(x);
    }
}

template <bool BF16, int VEC, int MT, int RR, int PF, int UP, int EPI>
__device__ __forceinline__ void gemv_body(const void* __restrict__ W, int ldw, const float* __restrict__ X, int ldx,
                                          float* __restrict__ Y, int ldy, int N, int K, int M, int half, int ksplit) {
    constexpr int RL = (EPI == 2) ? RR / 2 : RR;   // output rows per warp group
    constexpr int NW = LINEAR_THREADS / 32;
    __shared__ float red[NW][MT * RR];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ngroups = NW / ksplit, grp = warp / ksplit, wk = warp - grp * ksplit;
    const int bx = tile_block(M, MT);
    const int nbase = (bx * ngroups + grp) * RL;
    const int m0 = row_group(M, MT) * MT;
    const int mc = min(MT, M - m0);
    const int nch = K / VEC;
    const int stride = 32 * ksplit;

    i64 roff[RR];
    bool rok[RR];
#pragma unroll
    for (int r = 0; r < RR; ++r) {
        const int l = nbase + (r % RL);
        rok[r] = l < N;
        const int phys = (EPI == 2 && r >= RL) ? half + l : l;
        roff[r] = (i64)phys * ldw;
    }
    float acc[MT][RR];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < RR; ++r) acc[m][r] = 0.0f;

    const float* xb = X + (i64)m0 * ldx;
    const int c0 = wk * 32 + lane;
    uint4 w[PF][RR];   // chunk c0 + j·stride lives in stage j % PF: PF − 1 chunks in flight
#pragma unroll
    for (int j = 0; j < PF - 1; ++j) {   // weights only: safe before the dependency wait
        const int c = c0 + j * stride;
        if (c < nch) {
#pragma unroll
            for (int r = 0; r < RR; ++r) w[j][r] = rok[r] ? load_wchunk<BF16, VEC>(W, roff[r] + (i64)c * VEC) : make_uint4(0u, 0u, 0u, 0u);
        }
    }
    griddep_enter();
    for (int cs = c0; cs < nch; cs += PF * stride) {
#pragma unroll
        for (int j = 0; j < PF; ++j) {
            const int c = cs + j * stride;
            if (c >= nch) break;
            const int cn = c + (PF - 1) * stride;
            if (cn < nch) {   // refill the stage freed last: PF − 1 chunks ahead of this one
#pragma unroll
                for (int r = 0; r < RR; ++r)
                    w[(j + PF - 1) % PF][r] = rok[r] ? load_wchunk<BF16, VEC>(W, roff[r] + (i64)cn * VEC) : make_uint4(0u, 0u, 0u, 0u);
            }
            float wf[UP ? RR : 1][UP ? VEC : 1];   // UP: the weights widened once for all MT rows
            if constexpr (UP) {
#pragma unroll
                for (int r = 0; r < RR; ++r)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) wf[r][e] = w_elem<BF16, VEC>(w[j][r], e);
            }
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (m < mc) {
                    float xv[VEC];
                    load_x<VEC>(xb + (i64)m * ldx + (i64)c * VEC, xv);
#pragma unroll
                    for (int r = 0; r < RR; ++r)
#pragma unroll
                        for (int e = 0; e < VEC; ++e)
                            acc[m][r] = fmaf(UP ? wf[UP ? r : 0][UP ? e : 0] : w_elem<BF16, VEC>(w[j][r], e), xv[e], acc[m][r]);
                }
            }
        }
    }

#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < RR; ++r) {
            const float v = warp_sum(acc[m][r]);
            if (lane == 0) red[warp][m * RR + r] = v;
        }
    __syncthreads();

    const int nout = ngroups * MT * RL;
    for (int t = threadIdx.x; t < nout; t += blockDim.x) {
        const int g = t / (MT * RL), rem = t - g * (MT * RL), m = rem / RL, r = rem - m * RL;
        const int l = (bx * ngroups + g) * RL + r;
        if (m >= mc || l >= N) continue;
        float s = red[g * ksplit][m * RR + r];
        for (int q = 1; q < ksplit; ++q) s += red[g * ksplit + q][m * RR + r];
        float* yp = Y + (i64)(m0 + m) * ldy + l;
        if constexpr (EPI == 0) {
            *yp = s;
        } else if constexpr (EPI == 1) {
            *yp = *yp + s;
        } else {
            float u = red[g * ksplit][m * RR + RL + r];
            for (int q = 1; q < ksplit; ++q) u += red[g * ksplit + q][m * RR + RL + r];
            *yp = silu_f(s) * u;
        }
    }
}

#define GEMV_KERNEL(NAME, BF16, VEC, MT, RR, PF, UP, EPI)                                                                        \
    extern "C" __global__ void __launch_bounds__(LINEAR_THREADS) NAME(const void* __restrict__ W, int ldw,                        \
                                                             const float* __restrict__ X, int ldx,                    \
                                                             float* __restrict__ Y, int ldy, int N, int K, int M,     \
                                                             int half, int ksplit) {                                      \
        gemv_body<BF16, VEC, MT, RR, PF, UP, EPI>(W, ldw, X, ldx, Y, ldy, N, K, M, half, ksplit);                                 \
    }

#define GEMV_KERNEL_EPIS(P, BF16, VEC, MT, RR, PF, UP) \
    GEMV_KERNEL(P##_e0, BF16, VEC, MT, RR, PF, UP, 0)  \
    GEMV_KERNEL(P##_e1, BF16, VEC, MT, RR, PF, UP, 1)  \
    GEMV_KERNEL(P##_e2, BF16, VEC, MT, RR, PF, UP, 2)

// vector paths (MT activation rows a block, RR weight rows a warp group, PF register stages,
// UP: widen the weights to fp32 once per chunk, before the MT rows use them):
// the engine's choice per M is GEMV_FMA in kestrel/ops/linear.py; GEMV_FMA_SWEEP (benchmarks) adds
// the rest. Every instantiation sums in the same order (see Order above): they agree bit for bit.
#define GEMV_BF16(MT, RR, PF, UP) GEMV_KERNEL_EPIS(gemv_bf16_v8_m##MT##_r##RR##_p##PF##_u##UP, true, 8, MT, RR, PF, UP)
#define GEMV_F32(MT, RR, PF, UP) GEMV_KERNEL_EPIS(gemv_f32_v4_m##MT##_r##RR##_p##PF##_u##UP, false, 4, MT, RR, PF, UP)
GEMV_VARIANTS_BF16
GEMV_VARIANTS_F32
// scalar fallback (unaligned K): MT = 1 or 8
GEMV_KERNEL_EPIS(gemv_bf16_v1_m1, true, 1, 1, 4, 2, 0)
GEMV_KERNEL_EPIS(gemv_bf16_v1_m8, true, 1, 8, 8, 2, 0)
GEMV_KERNEL_EPIS(gemv_f32_v1_m1, false, 1, 1, 4, 2, 0)
GEMV_KERNEL_EPIS(gemv_f32_v1_m8, false, 1, 8, 8, 2, 0)

// ================================ tensor-core path (bf16 weights) ================================

// D += A · B, m16n8k16, bf16 operands, fp32 accumulators (A: 4 regs of bf16x2, B: 2). volatile,
// like tc_ld16: the compiler keeps the weight loads of later super-chunks ahead of this one's mma.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ld_stream16 that stays where it is written (issued before the mma of earlier super-chunks).
__device__ __forceinline__ uint4 tc_ld16(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// x0, x1 (slots j = 0, 1 of one bf16x2 register) -> three bf16x2 registers hi, mid, lo with
// x = hi + mid + lo exactly (truncation: each residual keeps the bits the term dropped).
__device__ __forceinline__ void split3(float x0, float x1, unsigned& hi, unsigned& mid, unsigned& lo) {
    unsigned u0 = __float_as_uint(x0), u1 = __float_as_uint(x1);
    hi = __byte_perm(u0, u1, 0x7632);   // the high halves: x0's in the low 16 bits, x1's in the high
    float r0 = x0 - __uint_as_float(u0 & 0xffff0000u), r1 = x1 - __uint_as_float(u1 & 0xffff0000u);
    u0 = __float_as_uint(r0);
    u1 = __float_as_uint(r1);
    mid = __byte_perm(u0, u1, 0x7632);
    r0 = r0 - __uint_as_float(u0 & 0xffff0000u);
    r1 = r1 - __uint_as_float(u1 & 0xffff0000u);
    lo = __byte_perm(__float_as_uint(r0), __float_as_uint(r1), 0x7632);
}

// The outputs of one tile from its D fragment acc: d0, d1 = tile row g (output ra = tile·OUT + g),
// columns 2t, 2t + 1 (activation rows m0 + 2t, + 1); d2, d3 = tile row g + 8. EPI 0 store, 1 add,
// 2 SwiGLU of gate row g with its up row g + 8.
template <int EPI>
__device__ __forceinline__ void tc_store(float* __restrict__ Y, int ldy, int N, int ra, int m0, int mc, int t,
                                         const float (&acc)[4]) {
    float* y0 = Y + (i64)(m0 + 2 * t) * ldy;
    float* y1 = y0 + ldy;
    const bool c0 = 2 * t < mc, c1 = 2 * t + 1 < mc;
    if constexpr (EPI == 2) {
        if (ra < N) {
            if (c0) y0[ra] = silu_f(acc[0]) * acc[2];
            if (c1) y1[ra] = silu_f(acc[1]) * acc[3];
        }
    } else {
        const int rb = ra + 8;
        if (ra < N) {
            if (c0) y0[ra] = EPI == 1 ? y0[ra] + acc[0] : acc[0];
            if (c1) y1[ra] = EPI == 1 ? y1[ra] + acc[1] : acc[1];
        }
        if (rb < N) {
            if (c0) y0[rb] = EPI == 1 ? y0[rb] + acc[2] : acc[2];
            if (c1) y1[rb] = EPI == 1 ? y1[rb] + acc[3] : acc[3];
        }
    }
}


// ==== gemv_tmb_*: tensor cores fed by bulk copies from tiled weights (every M costs about what M = 1 costs) ==
//
// Math     the tensor-core arithmetic above: x split exactly into three bf16 terms, three mma chains (hi, mid, lo), here
//          restarted at each chain group of TMB_CG k (a whole number of stages; the last may be
//          short): acc = acc + (D_hi + (D_mid + D_lo)).
// Layout   W tiled (linear.tmb_tiled): per tile of 16 rows (EPI 2: 8 gate rows, then their 8 up rows),
//          per 32-k block kb, 1 KB = [s = 0, 1][lane = 4g + t] uint4 = lane (g, t)'s A fragment for mma
//          step s, in the order the mma reads its four registers: words (q, h) = (0, 0), (0, 1), (1, 0),
//          (1, 1), word (q, h) the 2 bf16 of tile row g + 8h at k = 32kb + 8t + 4s + 2q + (0, 1) (the K
//          permutation: mma slot 2t+j <-> k = 32kb + 8t + 4s + j, slot 2t+8+j <-> k = 32kb + 8t + 4s + 2 + j). Tile T's k range [k0, k1) is the byte range [32(TK + k0), 32(TK + k1)).
//          x [M, ldx] fp32 as the model writes it.
// Launch   block = NW·RG warps, warp w computing tile NW·blockIdx.x + w % NW for row group w / NW,
//          × one K part (blockIdx.z of ks, 32-k blocks [z·nkb/ks, (z+1)·nkb/ks)) × 8·RG activation rows
//          (the block order above, with row groups of 8·RG rows). RG = 1 for M <= 8; RG > 1 (the _g
//          kernels, for the many rows of a batch) lets RG warps share each tile's weights in shared
//          memory, so a block reads its tiles once for up to 8·RG rows instead of once per 8 (see
//          "block order"), and each warp still does exactly one (tile, row group)'s work, as at
//          RG = 1 (more warps a block, not more registers a warp: a warp's work and registers do
//          not depend on RG). Each stage of KC k
//          is one cp.async.bulk copy per tile (32·KC bytes) and one per activation row (4·KC bytes,
//          shared by the block's NW tiles, so x costs M/(8·NW) of the weight bytes), into a ring of
//          ST shared-memory slots signalled by mbarriers (wfull, xfull). Warp 0 issues the copies,
//          one lane each; the weights of the first ST − 1 stages before griddep_wait(). Once a
//          stage has landed, the block splits its activations into the three bf16 terms once (not
//          once a warp) into xsplit: per 32-k block 3 × 32 uint4 = 1536 bytes, [j][lane], lane
//          (g, t)'s B fragments for both mma steps of the block (k 0-15, 16-31) and the three terms,
//          for each of the RG row groups. Dynamic shared memory
//          ST · (NW·32·KC + 8·RG·(4·KC + 16)) + RG · KC/32 · 1536 bytes (linear.tmb_smem); x rows are
//          padded to 4·KC + 16 bytes so lane (g, t)'s float4 reads hit every bank once.
// Split K  ks > 1: each (tile, part) writes its D fragment to part[z][y][tile][lane] (linear.tmb_scratch);
//          the last of a tile's ks blocks to arrive at count[y·T + tile] adds part 0 + part 1 + ... in
//          that order, applies the epilogue and sets the count back to 0 for the next launch.
// Order    per output element: for each part, for each of its chain groups in increasing k, the
//          three chains over the group's kb, into acc as above; then the parts in index order. Fixed
//          by K, TMB_CG and ks alone (linear.tmb_ksplit): NW, KC, ST, RG, N and M change nothing (a row
//          group's chains see the same mma in the same order whichever block holds it), so row
//          m of an M-row launch is bit-identical to that row alone, and a row of a stacked matrix to
//          that row in its own matrix.
// The pieces gemv_tmb and gemv_tmr share, so that both compute a row in one order.
// One split unit: lane l = (g, t)'s two float4 of activation row g at k = 32kb + 8t .. +7 -> its B
// fragments for both mma steps of 32-k block kb and the three terms, [j][l] uint4 for j = 0, 1, 2.
__device__ __forceinline__ void tmb_split_regs(const float4& u, const float4& v, unsigned (&w)[12]) {
    split3(u.x, u.y, w[0], w[2], w[4]);    // mma step 0: slots 2t, 2t+1 (hi, mid, lo)
    split3(u.z, u.w, w[1], w[3], w[5]);    //      slots 2t+8, 2t+9
    split3(v.x, v.y, w[6], w[8], w[10]);   // mma step 1
    split3(v.z, v.w, w[7], w[9], w[11]);
}
__device__ __forceinline__ void tmb_split_unit(const float4& u, const float4& v, uint4* __restrict__ dst) {
    unsigned w[12];
    tmb_split_regs(u, v, w);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[32] = make_uint4(w[4], w[5], w[6], w[7]);
    dst[64] = make_uint4(w[8], w[9], w[10], w[11]);
}

// One 32-k block of one tile: f0, f1 = the lane's A fragments for mma steps 0 and 1 (tmb_tiled's
// two uint4), w = its split activations (tmb_split_regs); the three chains, step 0 then 1.
__device__ __forceinline__ void tmb_kblock_regs(float (&dh)[4], float (&dm)[4], float (&dl)[4], const uint4& f0,
                                                const uint4& f1, const unsigned (&w)[12]) {
    mma_bf16_16816(dh, f0.x, f0.y, f0.z, f0.w, w[0], w[1]);
    mma_bf16_16816(dm, f0.x, f0.y, f0.z, f0.w, w[2], w[3]);
    mma_bf16_16816(dl, f0.x, f0.y, f0.z, f0.w, w[4], w[5]);
    mma_bf16_16816(dh, f1.x, f1.y, f1.z, f1.w, w[6], w[7]);
    mma_bf16_16816(dm, f1.x, f1.y, f1.z, f1.w, w[8], w[9]);
    mma_bf16_16816(dl, f1.x, f1.y, f1.z, f1.w, w[10], w[11]);
}
// The same, the split activations read from tmb_split_unit's dst (bs).
__device__ __forceinline__ void tmb_kblock(float (&dh)[4], float (&dm)[4], float (&dl)[4], const uint4& f0,
                                           const uint4& f1, const uint4* __restrict__ bs) {
    const uint4 x0 = bs[0], x1 = bs[32], x2 = bs[64];
    const unsigned w[12] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w, x2.x, x2.y, x2.z, x2.w};
    tmb_kblock_regs(dh, dm, dl, f0, f1, w);
}

// A chain group ends: fold its three chains into the sum and restart them.
__device__ __forceinline__ void tmb_fold(float (&acc)[4], float (&dh)[4], float (&dm)[4], float (&dl)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        acc[i] = acc[i] + (dh[i] + (dm[i] + dl[i]));
        dh[i] = dm[i] = dl[i] = 0.0f;
    }
}

// A tile's K part is summed (acc): with ks > 1 write it to the scratch, and the last of the tile's
// ks parts to arrive adds them in index order; then the epilogue. Called by whole warps.
template <int EPI>
__device__ __forceinline__ void tmb_finish(float (&acc)[4], float* __restrict__ Y, int ldy, int N, int ntiles,
                                           int ks, int tile, int m0, int mc, int nrg, float4* __restrict__ part,
                                           int* __restrict__ count) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (ks > 1) {
        const int slot = (m0 / 8) * ntiles + tile;
        const i64 stride = (i64)nrg * ntiles * 32;   // one part
        part[blockIdx.z * stride + (i64)slot * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        __threadfence();   // each lane's part is visible device-wide before the tile's count moves
        __syncwarp();
        int prev = 0;
        if (lane == 0) {
            prev = atomicAdd(count + slot, 1);
            __threadfence();
        }
        __syncwarp();
        prev = __shfl_sync(0xffffffffu, prev, 0);
        if (prev != ks - 1) return;   // not the last part of this tile to finish
        float4 v = __ldcg(part + (i64)slot * 32 + lane);
        for (int q = 1; q < ks; ++q) {
            const float4 u = __ldcg(part + q * stride + (i64)slot * 32 + lane);
            v.x = v.x + u.x; v.y = v.y + u.y; v.z = v.z + u.z; v.w = v.w + u.w;
        }
        acc[0] = v.x; acc[1] = v.y; acc[2] = v.z; acc[3] = v.w;
        if (lane == 0) count[slot] = 0;   // ready for the next launch
    }
    tc_store<EPI>(Y, ldy, N, tile * (EPI == 2 ? 8 : 16) + g, m0, mc, t, acc);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
// Bulk copies and transaction mbarriers need sm_90: older GPUs get a stub (linear.tmb_eligible never
// picks gemv_tmb there), so the rest of this file still compiles for them.
template <int NW, int KC, int ST, int RG, int EPI>
__device__ __forceinline__ void gemv_tmb_body(const bf16_t* __restrict__, const float* __restrict__, int,
                                              float* __restrict__, int, int, int, int, int, int,
                                              float4* __restrict__, int* __restrict__) {
    __trap();
}
#else
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile(
        "{\n\t.reg .pred P1;\n"
        "TMB_WAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
        "@P1 bra TMB_DONE;\n\t"
        "bra TMB_WAIT;\n"
        "TMB_DONE:\n\t}" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

template <int NW, int KC, int ST, int RG, int EPI>
__device__ __forceinline__ void gemv_tmb_body(const bf16_t* __restrict__ W, const float* __restrict__ X, int ldx,
                                              float* __restrict__ Y, int ldy, int N, int K, int M, int ntiles,
                                              int ks, float4* __restrict__ part, int* __restrict__ count) {
    static_assert(KC % 32 == 0 && TMB_CG % KC == 0, "a stage is whole 32-k blocks inside one chain group");
    constexpr int XP = 4 * KC + 16;    // x row pitch in shared memory (≡ 16 mod 128: no bank conflicts)
    constexpr int TB = 32 * KC;        // one tile's stage
    constexpr int XR = 8 * RG;         // activation rows a block
    constexpr int WB = NW * TB, SB = WB + XR * XP;
    extern __shared__ __align__(128) unsigned char ring[];
    unsigned char* const xsplit = ring + ST * SB;   // RG · KC/32 · 1536 bytes after the ring
    __shared__ unsigned long long wfull[ST], xfull[ST];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tw = RG == 1 ? warp : warp % NW;      // this warp's tile in the block
    const int r = RG == 1 ? 0 : warp / NW;          // and its row group
    const int tile0 = tile_block(M, XR) * NW, tile = tile0 + tw;
    const int nt = min(NW, ntiles - tile0);
    const int mb = row_group(M, XR) * XR, mc = min(XR, M - mb);   // the block's first row, its rows
    const int rgn = (mc + 7) / 8;                                  // its row groups
    const bool live = tw < nt && r < rgn;
    const int nkb = K / 32, z = blockIdx.z;
    const int klo = 32 * (int)((i64)z * nkb / ks), khi = 32 * (int)((i64)(z + 1) * nkb / ks);
    const int nst = (khi - klo + KC - 1) / KC;

    auto issue = [&](int s, bool weights, bool acts) {   // warp 0: stage s into slot s % ST
        unsigned char* dst = ring + (s % ST) * SB;
        const int k0 = klo + s * KC, kn = min(KC, khi - k0);
        if (weights) {
            if (lane == 0) mbar_expect(&wfull[s % ST], (unsigned)(nt * kn * 32));
            if (lane < nt)
                bulk_copy(dst + lane * TB, (const unsigned char*)W + ((i64)(tile0 + lane) * K + k0) * 32,
                          (unsigned)(kn * 32), &wfull[s % ST]);
        }
        if (acts) {
            if (lane == 0) mbar_expect(&xfull[s % ST], (unsigned)(mc * kn * 4));
            for (int m = (lane + 16) & 31; m < mc; m += 32)   // rows 0-15 from lanes 16-31
                bulk_copy(dst + WB + m * XP, X + (i64)(mb + m) * ldx + k0, (unsigned)(kn * 4), &xfull[s % ST]);
        }
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; ++s) {
            mbar_init(&wfull[s], 1);
            mbar_init(&xfull[s], 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    if (warp == 0)
        for (int s = 0; s < ST - 1 && s < nst; ++s) issue(s, true, false);   // weights: before the wait
    __syncthreads();
    griddep_wait();
    griddep_launch();   // after the wait: see "PDL" in the tiled kernels' header
    if (warp == 0)
        for (int s = 0; s < ST - 1 && s < nst; ++s) issue(s, false, true);

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dh[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dm[4] = {0.0f, 0.0f, 0.0f, 0.0f},
          dl[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // the sum, and the current chain group's three chains
    for (int s = 0; s < nst; ++s) {
        if (warp == 0 && s + ST - 1 < nst) issue(s + ST - 1, true, true);   // the slot read last round
        const unsigned par = (unsigned)((s / ST) & 1);
        mbar_wait(&wfull[s % ST], par);
        mbar_wait(&xfull[s % ST], par);
        const unsigned char* ws = ring + (s % ST) * SB + tw * TB;
        const int nkbs = min(KC, khi - klo - s * KC) / 32;
        // The stage's activations split once for the block (not once a warp): lane l's B fragments
        // of 32-k block kb of row group q, [q][kb][j][l] uint4 for j = 0, 1, 2 = words (h, term, r).
        for (int p = threadIdx.x; p < rgn * nkbs * 32; p += NW * RG * 32) {
            const int q = p / (nkbs * 32), e = p - q * nkbs * 32;
            const int kb = e >> 5, l = e & 31, row = 8 * q + (l >> 2), tt = l & 3;
            float4 u = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v = u;
            if (row < mc) {
                const unsigned char* xr = ring + (s % ST) * SB + WB + row * XP + 32 * tt + 128 * kb;
                u = *(const float4*)xr;
                v = *(const float4*)(xr + 16);
            }
            tmb_split_unit(u, v, (uint4*)(xsplit + 1536 * (q * (KC / 32) + kb)) + l);
        }
        __syncthreads();
        const uint4* xs = (const uint4*)(xsplit + 1536 * (r * (KC / 32))) + lane;   // this warp's row group
        auto kblock = [&](int kb) {
            const uint4 f0 = *(const uint4*)(ws + 1024 * kb + 16 * lane);         // mma step 0
            const uint4 f1 = *(const uint4*)(ws + 1024 * kb + 512 + 16 * lane);   // mma step 1
            tmb_kblock(dh, dm, dl, f0, f1, xs + 96 * kb);
        };
        if (live) {
            if (nkbs == KC / 32) {
#pragma unroll
                for (int kb = 0; kb < KC / 32; ++kb) kblock(kb);
            } else {
                for (int kb = 0; kb < nkbs; ++kb) kblock(kb);
            }
        }
        if (((s + 1) * KC) % TMB_CG == 0 || s == nst - 1) tmb_fold(acc, dh, dm, dl);   // a chain group ends
        __syncthreads();   // every warp is done with slot s % ST and xsplit before they are refilled
    }
    if (!live) return;
    tmb_finish<EPI>(acc, Y, ldy, N, ntiles, ks, tile, mb + 8 * r, min(8, mc - 8 * r), row_groups(M, 8), part, count);
}
#endif

#define GEMV_TMB_KERNEL(NW, KC, ST, EPI)                                                                              \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                             \
        gemv_tmb_w##NW##_c##KC##_s##ST##_e##EPI(const bf16_t* __restrict__ W, const float* __restrict__ X, int ldx,   \
                                                float* __restrict__ Y, int ldy, int N, int K, int M, int ntiles,      \
                                                int ks, float4* __restrict__ part, int* __restrict__ count) {         \
        gemv_tmb_body<NW, KC, ST, 1, EPI>(W, X, ldx, Y, ldy, N, K, M, ntiles, ks, part, count);                      \
    }
#define GEMV_TMB(NW, KC, ST) GEMV_TMB_KERNEL(NW, KC, ST, 0) GEMV_TMB_KERNEL(NW, KC, ST, 1) GEMV_TMB_KERNEL(NW, KC, ST, 2)
GEMV_TMB_VARIANTS

// gemv_tmb over RG row groups a block (M > 8: a batch's rows), the same order as above
#define GEMV_TMBG_KERNEL(NW, KC, ST, RG, EPI)                                                                         \
    extern "C" __global__ void __launch_bounds__(NW * RG * 32)                                                             \
        gemv_tmb_w##NW##_c##KC##_s##ST##_g##RG##_e##EPI(const bf16_t* __restrict__ W, const float* __restrict__ X,     \
                                                        int ldx, float* __restrict__ Y, int ldy, int N, int K, int M,  \
                                                        int ntiles, int ks, float4* __restrict__ part,                 \
                                                        int* __restrict__ count) {                                     \
        gemv_tmb_body<NW, KC, ST, RG, EPI>(W, X, ldx, Y, ldy, N, K, M, ntiles, ks, part, count);                     \
    }
#define GEMV_TMBG(NW, KC, ST, RG) \
    GEMV_TMBG_KERNEL(NW, KC, ST, RG, 0) GEMV_TMBG_KERNEL(NW, KC, ST, RG, 1) GEMV_TMBG_KERNEL(NW, KC, ST, RG, 2)
GEMV_TMBG_VARIANTS

// ==== gemv_tmr_*: tensor cores fed straight from tiled weights into registers (no copies, no ring) ==
//
// Math     and Order: gemv_tmb's, through the same helpers (tmb_split_unit, tmb_kblock, tmb_fold,
//          tmb_finish): chain groups of TMB_CG k from each K part's start, parts by tmb_ksplit,
//          so for the same tiled weights a row is bit-identical to gemv_tmb's (a GPU test checks).
// Layout   tmb_tiled's: lane (g, t)'s A fragments of 32-k block kb are the uint4 at 1024kb + 16·lane
//          (mma step 0) and + 512 (step 1) of its tile, so one warp load reads 512 contiguous
//          bytes and lands in the four registers the mma reads.
// Launch   block = T + 1 warps × one K part (blockIdx.z) × 8 activation rows (block order). Warps
//          0..T−1 take tiles T·blockIdx.x + w and only load weights and multiply; warp T splits the
//          activations. A compute warp walks its K part in stages of P 32-k blocks through two
//          register buffers: the first mma of stage s waits for its loads (in the code the compiler
//          generates, that wait covers every global load the warp has outstanding), and only then
//          are stage s + 1's loads issued into the other buffer, so the warp always has P KB in
//          flight and never waits for a load it has just issued. The splitting warp keeps its own loads (activations, one chain group
//          ahead) apart for the same reason. Per chain group (TMB_CG k) it splits group j + 1 into
//          one half of a double buffer in shared memory (2 × TMB_CG/32 × 1536 bytes; only the M
//          real rows are written, the rest zeroed once) while the others multiply group j from the
//          other half; one barrier a group. Stage 0's weights are loaded before griddep_wait().
template <int T, int P, int EPI>
__device__ __forceinline__ void gemv_tmr_body(const bf16_t* __restrict__ W, const float* __restrict__ X, int ldx,
                                              float* __restrict__ Y, int ldy, int N, int K, int M, int ntiles,
                                              int ks, float4* __restrict__ part, int* __restrict__ count) {
    constexpr int G = TMB_CG / 32;                   // 32-k blocks a chain group
    constexpr int SPG = G / P;                       // stages a chain group
    static_assert(G % P == 0, "a chain group is a whole number of stages");
    __shared__ __align__(16) uint4 xs[2][G][96];     // [buffer][kb][j·32 + lane]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool splitter = warp == T;
    const int tile = tile_block(M, 8) * T + warp;
    const bool live = !splitter && tile < ntiles;
    const int m0 = row_group(M, 8) * 8, mc = min(8, M - m0);
    const int nkb = K / 32, z = blockIdx.z;
    const int kb0 = (int)((i64)z * nkb / ks), nkbp = (int)((i64)(z + 1) * nkb / ks) - kb0;
    const int ngr = (nkbp + G - 1) / G;
    const uint4* wp = (const uint4*)W + ((i64)(live ? tile : 0) * nkb + kb0) * 64 + lane;

    uint4 wa[P][2], wb[P][2];                        // stage s lives in wa if s is even, else wb
    auto load_stage = [&](int s, uint4 (&w)[P][2]) {
#pragma unroll
        for (int v = 0; v < P; ++v)
            if (s * P + v < nkbp) {
                w[v][0] = tc_ld16(wp + 64 * (s * P + v));
                w[v][1] = tc_ld16(wp + 64 * (s * P + v) + 32);
            }
    };
    if (live) load_stage(0, wa);
    for (int i = threadIdx.x; i < 2 * G * 96; i += 32 * (T + 1)) (&xs[0][0][0])[i] = make_uint4(0u, 0u, 0u, 0u);
    griddep_wait();
    griddep_launch();   // after the wait: see "PDL" in the tiled kernels' header

    // The splitting warp's units of a group: unit p = lane + 32q is (32-k block p / (4 mc), lane p % (4 mc)).
    const int nunits = G * 4 * mc;
    float4 xu[G], xv[G];
    auto load_x = [&](int j) {
#pragma unroll
        for (int q = 0; q < G; ++q) {
            const int p = lane + 32 * q, kb = p / (4 * mc), l = p - kb * 4 * mc;
            if (p < nunits && G * j + kb < nkbp) {
                const float* xr = X + (i64)(m0 + (l >> 2)) * ldx + 32 * (kb0 + G * j + kb) + 8 * (l & 3);
                xu[q] = __ldg((const float4*)xr);
                xv[q] = __ldg((const float4*)xr + 1);
            }
        }
    };
    auto split_x = [&](int j) {
#pragma unroll
        for (int q = 0; q < G; ++q) {
            const int p = lane + 32 * q, kb = p / (4 * mc), l = p - kb * 4 * mc;
            if (p < nunits && G * j + kb < nkbp) tmb_split_unit(xu[q], xv[q], &xs[j & 1][kb][l]);
        }
    };
    __syncthreads();                                 // the zeros are in before any unit lands
    if (splitter) {
        load_x(0);
        split_x(0);
        if (ngr > 1) load_x(1);
    }
    __syncthreads();

    if (!live) {                                     // the same number of barriers as below
        for (int j = 0; j < ngr; ++j) {
            if (splitter && j + 1 < ngr) {
                split_x(j + 1);                      // loaded a group ago
                if (j + 2 < ngr) load_x(j + 2);
            }
            __syncthreads();                         // group j read and group j + 1 written by all
        }
        return;
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float dh[4] = {}, dm[4] = {}, dl[4] = {};
    auto stage = [&](int s, uint4 (&cur)[P][2], uint4 (&nxt)[P][2], const uint4* xsb) {
#pragma unroll
        for (int u = 0; u < P; ++u) {
            if (s * P + u < nkbp) tmb_kblock(dh, dm, dl, cur[u][0], cur[u][1], xsb + 96 * u + lane);
            if (u == 0) load_stage(s + 1, nxt);      // after the first mma, which waited for cur
        }
    };
    for (int j = 0; j < ngr; ++j) {
#pragma unroll
        for (int q = 0; q < SPG; ++q) {
            const int s = j * SPG + q;
            if (s * P < nkbp) {
                if (s & 1) stage(s, wb, wa, &xs[j & 1][q * P][0]);
                else stage(s, wa, wb, &xs[j & 1][q * P][0]);
            }
        }
        tmb_fold(acc, dh, dm, dl);
        __syncthreads();
    }
    tmb_finish<EPI>(acc, Y, ldy, N, ntiles, ks, tile, m0, mc, row_groups(M, 8), part, count);
}

#define GEMV_TMR_KERNEL(T, P, EPI)                                                                                    \
    extern "C" __global__ void __launch_bounds__((T + 1) * 32)                                                        \
        gemv_tmr_t##T##_p##P##_e##EPI(const bf16_t* __restrict__ W, const float* __restrict__ X, int ldx,             \
                                      float* __restrict__ Y, int ldy, int N, int K, int M, int ntiles, int ks,        \
                                      float4* __restrict__ part, int* __restrict__ count) {                           \
        gemv_tmr_body<T, P, EPI>(W, X, ldx, Y, ldy, N, K, M, ntiles, ks, part, count);                               \
    }
#define GEMV_TMR(T, P) GEMV_TMR_KERNEL(T, P, 0) GEMV_TMR_KERNEL(T, P, 1) GEMV_TMR_KERNEL(T, P, 2)
GEMV_TMR_VARIANTS
