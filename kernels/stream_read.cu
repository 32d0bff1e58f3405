// kernels/stream_read.cu: the streaming-read floor (launcher and NumPy twin: kestrel/ops/stream_read.py).
// Not a model op: the kernel the benchmarks and kestrel.spec.sweep time to learn how fast this
// device reads memory once, the honest floor a decode step's weight reads are measured against.
//
// Math     out[b] = XOR of every 32-bit word that block b read. The host can recompute the XOR
//          of the whole buffer (the twin), so the loads cannot be optimised away and a test can
//          check that every word was read exactly once.
// Layout   p: n 16-byte words (16-byte aligned); out: gridDim.x 32-bit words.
// Launch   grid (G,), block (T,) (T a multiple of 32): grid-stride, thread i reads words i,
//          i + G·T, ... with UNROLL 16-byte loads in flight; loads skip L1 (ld_stream16: read once).
#include "common.cuh"

template <int UNROLL>
__device__ __forceinline__ void stream_read_body(const uint4* __restrict__ p, long long n, unsigned* __restrict__ out) {
    __shared__ unsigned red[32];
    unsigned acc = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = ld_stream16(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = ld_stream16(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) red[w] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned t = 0;
        for (int j = 0; j < (int)(blockDim.x >> 5); ++j) t ^= red[j];
        out[blockIdx.x] = t;
    }
}

extern "C" __global__ void stream_read_u4(const uint4* p, long long n, unsigned* out) { stream_read_body<4>(p, n, out); }
extern "C" __global__ void stream_read_u8(const uint4* p, long long n, unsigned* out) { stream_read_body<8>(p, n, out); }
