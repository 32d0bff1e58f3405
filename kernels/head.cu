// kernels/head.cu: token embedding, argmax over the vocabulary, and the bf16 rounding used
// when random weights are drawn on the GPU (NumPy twins and launchers:
// kestrel/ops/head.py; the host bf16 rounding is f32_to_bf16 in kestrel/weights.py).
//
// embed_*      y[m, :] = table[tok[m], :] widened to fp32. table [V, H] (bf16 bits or fp32),
//              tok int32 [M] (in the ctrl block for graph replay), y [M, ldy].
//              grid = M, block = EMBED_THREADS.
// argmax_rows  out[r] = the smallest index of the largest value of x[r, :n] (NaN counts as
//              largest, like numpy.argmax). grid = rows, block T = ARGMAX_THREADS: thread t
//              scans t, t+T, ...; warps then block combine (max value, then smallest index).
// f32_to_bf16  y[i] = bf16_rne(x[i] · scale), grid-stride, block BF16_THREADS.
#include "common.cuh"

__device__ __forceinline__ float widen(bf16_t h) { return bf16_to_f32(h); }
__device__ __forceinline__ float widen(float x) { return x; }

template <class T>
__device__ __forceinline__ void embed_rows(const T* __restrict__ table, const int* __restrict__ tok,
                                           float* __restrict__ y, int ldy, int H) {
    griddep_enter();
    const T* row = table + (i64)tok[blockIdx.x] * H;
    float* yr = y + (i64)blockIdx.x * ldy;
    for (int i = threadIdx.x; i < H; i += blockDim.x) yr[i] = widen(row[i]);
}

extern "C" __global__ void __launch_bounds__(EMBED_THREADS) embed_bf16(const bf16_t* __restrict__ table,
                                                                       const int* __restrict__ tok,
                                                                       float* __restrict__ y, int ldy, int H) {
    embed_rows(table, tok, y, ldy, H);
}

extern "C" __global__ void __launch_bounds__(EMBED_THREADS) embed_f32(const float* __restrict__ table,
                                                                      const int* __restrict__ tok,
                                                                      float* __restrict__ y, int ldy, int H) {
    embed_rows(table, tok, y, ldy, H);
}

__device__ __forceinline__ bool am_better(float v, int i, float b, int bi) {
    const bool vn = v != v, bn = b != b;
    if (vn || bn) return (vn && bn) ? (i < bi) : vn;
    if (v > b) return true;
    if (v < b) return false;
    return i < bi;
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_rows(const float* __restrict__ x, int ldx, int n,
                                                               long long* __restrict__ out) {
    griddep_enter();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* xr = x + (i64)blockIdx.x * ldx;
    float best = neg_inf_f();
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i];
        if (am_better(v, i, best, bi)) { best = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, best, bi)) { best = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { sv[w] = best; si[w] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float b = sv[0];
        int ib = si[0];
        for (int k = 1; k < nw; ++k)
            if (am_better(sv[k], si[k], b, ib)) { b = sv[k]; ib = si[k]; }
        out[blockIdx.x] = (long long)ib;
    }
}

extern "C" __global__ void __launch_bounds__(BF16_THREADS) f32_to_bf16(const float* __restrict__ x, float scale,
                                                              bf16_t* __restrict__ y, i64 n) {
    griddep_enter();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        unsigned int u = __float_as_uint(x[i] * scale);
        u += 0x7FFFu + ((u >> 16) & 1u);
        y[i] = (bf16_t)(u >> 16);
    }
}
