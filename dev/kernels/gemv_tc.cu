// dev/kernels/gemv_tc.cu: the first tensor-core GEMV, kept for development (not the engine's).
// Compiled after kernels/linear.cu (dev/gemv_variants.py pastes the two together): it uses that
// file's mma_bf16_16816, tc_ld16, split3 and tc_store. Measured slower than the CUDA-core GEMV at
// M = 1 (results/bench_projections.md; results/cuda_notes.md), so no engine option selects it.
//
// ==== gemv_tc_*: tensor cores, bf16 weights (every M costs what M = 8 costs) =====================
//
// Math     mma.sync m16n8k16 (bf16 × bf16 → fp32): A = 16 weight rows × 16 k, B = 16 k × 8 activation
//          rows. x is fp32, so each x[m, k] is split exactly into three bf16 terms by truncation:
//              hi = x with its low 16 bits cleared, mid = (x − hi) likewise, lo = x − hi − mid
//          (x has 24 significant bits, each term takes 8, so x = hi + mid + lo exactly, short of
//          underflow below 2^-100). Each bf16 × bf16 product is exact in fp32, so the three mma per
//          16-k step (D_hi, D_mid, D_lo) lose only the tensor core's fp32 summation: fp32 accuracy.
// Layout   one warp owns RT mma tiles of 16 weight rows; lane (g = lane/4, t = lane%4) loads rows
//          g and g+8 of each tile straight into registers with 16-byte streaming loads: 8 bf16 at
//          k = 32·kb + 8t, for the U k-blocks kb of a super-chunk (32·U k). Those 8 values feed two
//          mma steps s = 0, 1 without any shuffle: the fixed K permutation, a function of k alone,
//              mma slot 2t+j    <-> k = 32·kb + 8t + 4s + j        (j = 0, 1)
//              mma slot 2t+8+j  <-> k = 32·kb + 8t + 4s + 2 + j
//          is what the A fragment (rows g, g+8; slots 2t, 2t+1, 2t+8, 2t+9) and the B fragment (column
//          g = activation row g; the same slots) both want, so lane (g, t) reads x[g, 32·kb + 8t ..+7]
//          (two float4) and splits it. Rows past N and k past K load as zeros (from W's first row:
//          no branches). EPI 2: a tile's rows g are gate rows n0+g and its rows g+8 the up rows
//          half+n0+g, so lane (g, t) holds gate and up of the same outputs and applies SwiGLU in
//          registers.
// Launch   block = KS · TPB warps (TPB = 4 / KS warp groups for KS <= 4, 1 for KS = 8); the KS warps
//          of a group share the K range of the group's RT tiles: warp kw takes super-chunks kw,
//          kw + KS, kw + 2·KS, ... grid = (ceil(tiles / (RT · TPB)), ceil(M / 8)). Activation rows
//          are padded to the mma's 8 columns: rows past M are never read (their B column is zero)
//          and never written; a launch of M > 8 rows takes 8 rows per grid.y. A ring of ST register
//          stages keeps ST − 1 super-chunks of weights in flight (volatile loads and mma: issued in
//          that order); the first ST − 1 before griddep_wait() (PDL: weights are never written).
// Speed    measured on the H200 (results/bench_projections.md): flat in M, but 2.3–3.0 TB/s on
//          in_proj where the CUDA-core kernel streams 4.0 at M = 1. Each load instruction covers 8
//          rows × 64 bytes (half lines) and the register stages cap occupancy at 10–16 warps a
//          multiprocessor; the profile shows the warps waiting on those loads.
// Order    per output element: for each super-chunk of the warp, in increasing order, three chains
//          of 2·U mma (hi, mid, lo) start from zero, then acc = acc + (D_hi + (D_mid + D_lo)); then
//          the KS warps' acc in warp order (warp 0 + warp 1 + ...). Column m of an mma depends on
//          row m of B alone, the K permutation on K alone, KS on K alone (linear.tc_ksplit), the
//          tile's other rows and columns on nothing: row m of an M-row launch is bit-identical to
//          that row launched alone, for every M, and a row of a stacked matrix to that row in its
//          own matrix (the stacked projections of kestrel/program.py rely on it).
//

__device__ __forceinline__ unsigned u4_word(const uint4& u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; }

// The weights of one super-chunk (k from kbase): for each tile r and k-block u, lane (g, t)'s 8
// values of rows g (wa) and g+8 (wb) at k = kbase + 32u + 8t. No branches: an element past N or
// K is loaded from W's first row (always there) and replaced by zero.
template <int RT, int U>
__device__ __forceinline__ void tc_load(uint4 (&wa)[RT][U], uint4 (&wb)[RT][U], const bf16_t* __restrict__ W,
                                        const bf16_t* const (&pa)[RT], const bf16_t* const (&pb)[RT],
                                        const bool (&oka)[RT], const bool (&okb)[RT], int kbase, int kt, int K) {
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int k = kbase + 32 * u;
        const bool ok = k + kt < K;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const bool va = ok && oka[r], vb = ok && okb[r];
            const uint4 a = tc_ld16(va ? (const void*)(pa[r] + k) : (const void*)W);
            const uint4 b = tc_ld16(vb ? (const void*)(pb[r] + k) : (const void*)W);
            wa[r][u] = va ? a : zero;
            wb[r][u] = vb ? b : zero;
        }
    }
}


// One super-chunk: x split into hi/mid/lo, three mma chains per tile from zero, then into acc.
// x: lane (g, t) reads x[g, k + 8t .. + 7] (float4 pairs; X 16-byte aligned, ldx % 4 == 0).
template <int RT, int U>
__device__ __forceinline__ void tc_chunk(const uint4 (&wa)[RT][U], const uint4 (&wb)[RT][U], const float* __restrict__ X,
                                         const float* __restrict__ xr, bool xok, int kbase, int kt, int K,
                                         float (&acc)[RT][4]) {
    float dh[RT][4], dm[RT][4], dl[RT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) dh[r][i] = dm[r][i] = dl[r][i] = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int k = kbase + 32 * u;
        const bool ok = xok && k + kt < K;
        const float4* xp = (const float4*)(ok ? xr + k : X);
        float4 p = __ldg(xp), q = __ldg(xp + 1);
        if (!ok) p = q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float xv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            unsigned h0, m0, l0, h1, m1, l1;
            split3(xv[4 * s], xv[4 * s + 1], h0, m0, l0);       // slots 2t, 2t+1
            split3(xv[4 * s + 2], xv[4 * s + 3], h1, m1, l1);   // slots 2t+8, 2t+9
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const unsigned a0 = u4_word(wa[r][u], 2 * s), a1 = u4_word(wb[r][u], 2 * s);
                const unsigned a2 = u4_word(wa[r][u], 2 * s + 1), a3 = u4_word(wb[r][u], 2 * s + 1);
                mma_bf16_16816(dh[r], a0, a1, a2, a3, h0, h1);
                mma_bf16_16816(dm[r], a0, a1, a2, a3, m0, m1);
                mma_bf16_16816(dl[r], a0, a1, a2, a3, l0, l1);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][i] = acc[r][i] + (dh[r][i] + (dm[r][i] + dl[r][i]));
}

template <int KS, int RT, int U, int ST, int EPI>
__device__ __forceinline__ void gemv_tc_body(const bf16_t* __restrict__ W, int ldw, const float* __restrict__ X, int ldx,
                                             float* __restrict__ Y, int ldy, int N, int K, int M, int half) {
    constexpr int TPB = KS >= 4 ? 1 : 4 / KS;        // warp groups a block
    constexpr int NWARPS = KS * TPB;
    constexpr int OUT = EPI == 2 ? 8 : 16;            // outputs of one mma tile
    __shared__ float4 red[KS > 1 ? NWARPS : 1][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3, kt = 8 * t;
    const int grp = warp / KS, kw = warp - grp * KS;
    const int tile0 = (blockIdx.x * TPB + grp) * RT;
    const int m0 = blockIdx.y * 8;
    const int mc = min(8, M - m0);

    const bf16_t* pa[RT];
    const bf16_t* pb[RT];
    bool oka[RT], okb[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const int ra = (tile0 + r) * OUT + g;
        const int rb = EPI == 2 ? half + ra : ra + 8;
        oka[r] = ra < N;
        okb[r] = EPI == 2 ? ra < N : rb < N;
        pa[r] = W + (i64)(oka[r] ? ra : 0) * ldw + kt;
        pb[r] = W + (i64)(okb[r] ? rb : 0) * ldw + kt;
    }
    float acc[RT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;

    const bool xok = g < mc;
    const float* xr = X + (i64)(m0 + (xok ? g : 0)) * ldx + kt;
    constexpr int SC = 32 * U;                        // k of one super-chunk
    const int nsc = (K + SC - 1) / SC;
    uint4 wa[ST][RT][U], wb[ST][RT][U];               // super-chunk kw + j·KS lives in stage j % ST
#pragma unroll
    for (int j = 0; j < ST - 1; ++j)                  // weights only: before the wait
        if (kw + j * KS < nsc) tc_load<RT, U>(wa[j], wb[j], W, pa, pb, oka, okb, (kw + j * KS) * SC, kt, K);
    griddep_enter();
    for (int sc = kw; sc < nsc; sc += ST * KS) {
#pragma unroll
        for (int j = 0; j < ST; ++j) {
            const int cur = sc + j * KS, nx = cur + (ST - 1) * KS;
            if (cur >= nsc) break;
            if (nx < nsc) tc_load<RT, U>(wa[(j + ST - 1) % ST], wb[(j + ST - 1) % ST], W, pa, pb, oka, okb, nx * SC, kt, K);
            tc_chunk<RT, U>(wa[j], wb[j], X, xr, xok, cur * SC, kt, K, acc);
        }
    }

#pragma unroll
    for (int r = 0; r < RT; ++r) {
        if constexpr (KS > 1) {                       // the KS warps of the group, in warp order
            __syncthreads();
            red[warp][lane] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
            __syncthreads();
            if (kw == 0) {
#pragma unroll
                for (int q = 1; q < KS; ++q) {
                    const float4 v = red[warp + q][lane];
                    acc[r][0] = acc[r][0] + v.x; acc[r][1] = acc[r][1] + v.y;
                    acc[r][2] = acc[r][2] + v.z; acc[r][3] = acc[r][3] + v.w;
                }
            }
        }
        if (kw != 0) continue;
        tc_store<EPI>(Y, ldy, N, (tile0 + r) * OUT + g, m0, mc, t, acc[r]);
    }
}

#define GEMV_TC_KERNEL(KS, RT, U, ST, EPI)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * (KS >= 4 ? KS : 4))                                           \
        gemv_tc_k##KS##_r##RT##_u##U##_s##ST##_e##EPI(const bf16_t* __restrict__ W, int ldw,                        \
                                                      const float* __restrict__ X, int ldx, float* __restrict__ Y,  \
                                                      int ldy, int N, int K, int M, int half) {                     \
        gemv_tc_body<KS, RT, U, ST, EPI>(W, ldw, X, ldx, Y, ldy, N, K, M, half);                                    \
    }
#define GEMV_TC_EPIS(KS, RT, U, ST) \
    GEMV_TC_KERNEL(KS, RT, U, ST, 0) GEMV_TC_KERNEL(KS, RT, U, ST, 1) GEMV_TC_KERNEL(KS, RT, U, ST, 2)
#define GEMV_TC_KSS(RT, U, ST) GEMV_TC_EPIS(2, RT, U, ST) GEMV_TC_EPIS(4, RT, U, ST) GEMV_TC_EPIS(8, RT, U, ST)

// (RT tiles of 16 rows a warp, U k-blocks of 32 a super-chunk, ST register stages): kestrel/ops/
// linear.py TC_VARIANTS lists the same four, TC_VARIANT is the engine's.
GEMV_TC_KSS(1, 4, 2)
GEMV_TC_KSS(1, 4, 3)
GEMV_TC_KSS(1, 2, 4)
GEMV_TC_KSS(2, 2, 2)
