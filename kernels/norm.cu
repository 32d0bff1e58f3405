// kernels/norm.cu: zero-centred RMSNorm (NumPy twin and launcher: kestrel/ops/norm.py).
//
// Math     y[r, i] = (x[r, i] · inv_r) · (1 + w[i]),  inv_r = 1 / sqrt(mean_i x[r, i]² + eps)   (fp32)
//          (the plain-w gated norm inside GDN lives in gdn.cu; q/k norms in attention.cu).
// Layout   x [rows, ldx], y [rows, ldy] (row strides let the MTP write both halves of its
//          [embedding | hidden] concatenation in place), w [n]. y may not alias x.
// Launch   grid = rows, block T = NORM_THREADS (a multiple of 32). Sum of squares: thread t
//          sums i = t, t+T, ... in order, then block_sum (fixed order): independent of rows.
//          Rows up to NORM_PER · T (8192) wide are loaded once into registers, all loads in flight
//          together (the row is latency-bound, not bandwidth-bound); wider rows loop.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(NORM_THREADS) rmsnorm_zc(const float* __restrict__ x, int ldx,
                                                             const float* __restrict__ w, float* __restrict__ y,
                                                             int ldy, int n, float eps) {
    constexpr int PER = NORM_PER;
    __shared__ float red[RED_FLOATS];
    griddep_enter();
    const float* xr = x + (i64)blockIdx.x * ldx;
    float* yr = y + (i64)blockIdx.x * ldy;
    const int t = threadIdx.x, nt = blockDim.x;
    float ss = 0.0f;
    if (n <= PER * nt) {
        float v[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int k = t + i * nt;
            v[i] = k < n ? xr[k] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < PER; ++i) ss += v[i] * v[i];
        const float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)n + eps);
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int k = t + i * nt;
            if (k < n) yr[k] = (v[i] * inv) * (1.0f + w[k]);
        }
    } else {
        for (int i = t; i < n; i += nt) {
            const float v = xr[i];
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)n + eps);
        for (int i = t; i < n; i += nt) yr[i] = (xr[i] * inv) * (1.0f + w[i]);
    }
}
