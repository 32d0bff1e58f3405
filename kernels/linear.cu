// kernels/linear.cu: dense projection for a few rows, y = x · Wᵀ (NumPy twin and launcher: kestrel/ops/linear.py).
//
// Math     y[m, n] = Σ_k W[n, k] · x[m, k], fp32 accumulation; W is bf16 (raw bits) or fp32.
//          Epilogue EPI: 0 store y = s; 1 accumulate y = y + s (the residual add);
//          2 SwiGLU over a stacked [gate; up] matrix: y[m, n] = silu(s_gate[n]) · s_up[n], where
//          the up row of output n is physical row half + n.
// Layout   W [N, ldw] row-major (k contiguous); x [M, ldx]; y [M, ldy]; all fp32 but W.
// Launch   block = LINEAR_THREADS = 128 threads = NW = 4 warps. `ksplit` warps (1, 2 or 4, chosen
//          from K alone) share the K range of one group of RL output rows; a block holds
//          NW/ksplit such groups. grid = (ceil(N_out / (RL · NW/ksplit)), ceil(M / MT)). Each block reads its weight rows
//          once for all MT activation rows: one pass over W serves a whole verify batch, so
//          M = 4 costs about what M = 1 costs when the weights dominate.
//          VEC = elements per 16-byte weight load (8 bf16, 4 fp32), or 1 (scalar fallback for
//          K, ldw or pointers that are not 16-byte multiples).
//          M = 1: MT = 1, RR = 4 rows per warp group; M = 2..4: MT = 4, RR = 4; wider: MT = 8, RR = 8.
// PDL      the first weight chunk is loaded before griddep_wait(): under programmatic dependent
//          launch a projection starts streaming its weights while the previous kernel finishes.
// Order    lane l of warp w (of the ksplit) sums chunks c = 32w + l, 32w + l + 32·ksplit, ... in
//          increasing c, the VEC elements of a chunk in order, with fmaf, separately for each
//          row m; then a warp xor-butterfly; then the ksplit warps in index order. Nothing here
//          depends on M, MT or RR, so row m of a launch is bit-identical to that row launched
//          alone (batch invariance), given the same K (hence ksplit and VEC).
#include "common.cuh"

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

template <bool BF16, int VEC, int MT, int RR, int EPI>
__device__ __forceinline__ void gemv_body(const void* __restrict__ W, int ldw, const float* __restrict__ X, int ldx,
                                          float* __restrict__ Y, int ldy, int N, int K, int M, int half, int ksplit) {
    constexpr int RL = (EPI == 2) ? RR / 2 : RR;   // output rows per warp group
    constexpr int NW = LINEAR_THREADS / 32;
    __shared__ float red[NW][MT * RR];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ngroups = NW / ksplit, grp = warp / ksplit, wk = warp - grp * ksplit;
    const int nbase = (blockIdx.x * ngroups + grp) * RL;
    const int m0 = blockIdx.y * MT;
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
    int c = wk * 32 + lane;
    uint4 cur[RR], nxt[RR];
    if (c < nch) {   // weights only: safe before the dependency wait
#pragma unroll
        for (int r = 0; r < RR; ++r) cur[r] = rok[r] ? load_wchunk<BF16, VEC>(W, roff[r] + (i64)c * VEC) : make_uint4(0u, 0u, 0u, 0u);
    }
    griddep_launch();
    griddep_wait();
    for (; c < nch; c += stride) {
        const int cn = c + stride;
        if (cn < nch) {   // prefetch the next chunk's weights before using this one
#pragma unroll
            for (int r = 0; r < RR; ++r) nxt[r] = rok[r] ? load_wchunk<BF16, VEC>(W, roff[r] + (i64)cn * VEC) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m < mc) {
                float xv[VEC];
                load_x<VEC>(xb + (i64)m * ldx + (i64)c * VEC, xv);
#pragma unroll
                for (int r = 0; r < RR; ++r)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) acc[m][r] = fmaf(w_elem<BF16, VEC>(cur[r], e), xv[e], acc[m][r]);
            }
        }
#pragma unroll
        for (int r = 0; r < RR; ++r) cur[r] = nxt[r];
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
        const int l = (blockIdx.x * ngroups + g) * RL + r;
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

#define GEMV_KERNEL(NAME, BF16, VEC, MT, RR, EPI)                                                                        \
    extern "C" __global__ void __launch_bounds__(LINEAR_THREADS) NAME(const void* __restrict__ W, int ldw,                        \
                                                             const float* __restrict__ X, int ldx,                    \
                                                             float* __restrict__ Y, int ldy, int N, int K, int M,     \
                                                             int half, int ksplit) {                                      \
        gemv_body<BF16, VEC, MT, RR, EPI>(W, ldw, X, ldx, Y, ldy, N, K, M, half, ksplit);                                 \
    }

#define GEMV_KERNEL_EPIS(P, BF16, VEC, MT, RR) \
    GEMV_KERNEL(P##_e0, BF16, VEC, MT, RR, 0)  \
    GEMV_KERNEL(P##_e1, BF16, VEC, MT, RR, 1)  \
    GEMV_KERNEL(P##_e2, BF16, VEC, MT, RR, 2)

// vector paths: MT = 1 (one row: step), 4 (verify widths 2..4), 8 (wider batches, prefill chunks);
// RR = 4 weight rows per warp group except for MT = 8 (more blocks, better balance on N = 5120)
GEMV_KERNEL_EPIS(gemv_bf16_v8_m1, true, 8, 1, 4)
GEMV_KERNEL_EPIS(gemv_bf16_v8_m4, true, 8, 4, 4)
GEMV_KERNEL_EPIS(gemv_bf16_v8_m8, true, 8, 8, 8)
GEMV_KERNEL_EPIS(gemv_f32_v4_m1, false, 4, 1, 4)
GEMV_KERNEL_EPIS(gemv_f32_v4_m4, false, 4, 4, 4)
GEMV_KERNEL_EPIS(gemv_f32_v4_m8, false, 4, 8, 8)
// scalar fallback (unaligned K): MT = 1 or 8
GEMV_KERNEL_EPIS(gemv_bf16_v1_m1, true, 1, 1, 4)
GEMV_KERNEL_EPIS(gemv_bf16_v1_m8, true, 1, 8, 8)
GEMV_KERNEL_EPIS(gemv_f32_v1_m1, false, 1, 1, 4)
GEMV_KERNEL_EPIS(gemv_f32_v1_m8, false, 1, 8, 8)
