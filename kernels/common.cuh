// kernels/common.cuh: device helpers shared by every kestrel kernel (included by the .cu files;
// kestrel/cuda/launch.py pastes it in front of each source before NVRTC compiles it).
//
// Constants that Python must agree with (block sizes, the ctrl block's layout, epsilons) are
// not written here: launch.py passes them as -D macros from the Python constants that the
// launchers in kestrel/ops use, so each is written once.
//
// Conventions
//   * Activations, norms, gates and all state are fp32, row-major. bf16 weights are raw uint16
//     bits (value = bits << 16 read as fp32), rounded to nearest-even on the host.
//   * Every reduction has one fixed order: per-thread partial sums over a strided index set,
//     then a warp xor-butterfly, then the warps' partials added in warp order. A result never
//     depends on how many rows a launch carries (batch invariance: row j of an M-row call is
//     bit-identical to the same row alone).
//   * kestrel/cuda/launch.py compiles with --fmad=false, so a*b+c is a multiply then an add, exactly
//     as NumPy computes it; where a fused multiply-add is wanted, the code says fmaf.
//   * ctrl: an int32 block in device memory that the host writes before each launch or CUDA
//     graph replay, so one captured graph serves every position:
//       ctrl[CTRL_POS] = position of row 0, ctrl[CTRL_SLOT] = live GDN state slot,
//       ctrl[CTRL_TOK + j] = token of row j.
//   * seg: the kernels with state (GDN, attention) take a segment table, null for one sequence.
//     Not null, one launch covers several sequences (the batched engine): a grid dimension picks
//     the segment, and its SEG_WORDS int64 words replace the launch's per-sequence arguments:
//       seg[SEG_LO] = the sequence's first row in the pass's activation buffers, seg[SEG_M] = its
//       rows, seg[SEG_P0], seg[SEG_P1] = its state (a GDN ring; K and V caches), seg[SEG_CTRL] =
//       its own ctrl block (position, live slot), seg[SEG_NSLOTS], seg[SEG_MODE].
//     A segment's blocks then run exactly the code, on exactly the values, of a launch made for
//     that sequence alone: its rows are bit-identical whatever else shares the launch.
//     A plan is made for bounds (kestrel/cuda/segments.py): segments past the pass's have
//     seg[SEG_M] = 0 and null pointers, and every kernel returns for them before reading any.
#pragma once

typedef unsigned short bf16_t;
typedef long long i64;

__device__ __forceinline__ float bf16_lo(unsigned int u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_f32(bf16_t h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ float neg_inf_f() { return __int_as_float(0xff800000); }

// NumPy twins: kestrel/ops/norm.py (silu, sigmoid), kestrel/ops/gdn.py (softplus).
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(fminf(x, 20.0f))); }

struct SumOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Segment s of a segment table (see the conventions above).
struct Seg {
    i64 lo;
    int M, nslots, mode;
    void* p0;
    void* p1;
    const int* ctrl;
};
__device__ __forceinline__ Seg seg_at(const i64* __restrict__ seg, int s) {
    const i64* e = seg + (i64)s * SEG_WORDS;
    Seg r;
    r.lo = e[SEG_LO];
    r.M = (int)e[SEG_M];
    r.nslots = (int)e[SEG_NSLOTS];
    r.mode = (int)e[SEG_MODE];
    r.p0 = (void*)e[SEG_P0];
    r.p1 = (void*)e[SEG_P1];
    r.ctrl = (const int*)e[SEG_CTRL];
    return r;
}

// Warp-wide reduction by xor-butterfly: the same value in every lane, a fixed order.
template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp()); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce(v, MaxOp()); }

// Block-wide reduction (blockDim.x a multiple of 32), same value in every thread, fixed order:
// each warp's butterfly, then the warps' partials in warp order.
// red: RED_FLOATS (>= 32) floats of shared memory; safe to call back to back.
template <class Op>
__device__ __forceinline__ float block_reduce(float v, float* red, Op op) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = red[0];
    for (int i = 1; i < nw; ++i) t = op(t, red[i]);
    return t;
}

__device__ __forceinline__ float block_sum(float v, float* red) { return block_reduce(v, red, SumOp()); }
__device__ __forceinline__ float block_max(float v, float* red) { return block_reduce(v, red, MaxOp()); }

// Programmatic dependent launch (sm_90). Inside a captured decode graph, kestrel launches each
// kernel with the programmatic-stream-serialization attribute, so it may start while its
// predecessor is still running: griddep_launch() lets the successor start; griddep_wait()
// blocks until the predecessor grid has completed and its writes are visible (it completed
// only after its own wait, so every earlier kernel has too). Every kernel calls griddep_wait()
// before it reads or writes any activation or state; only weights (never written) are read
// before it. Launched without the attribute (eager calls), both are no-ops.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A kernel's start under PDL, in one of two orders (the -D macro PDL_WAIT_FIRST; the engine
// compiles a module for each order and captures its graphs with the one its KernelOptions.pdl_order
// names). Launch first (0): the successor may be scheduled while this kernel still waits, which
// hides the most launch latency, but early launches can chain two or three kernels ahead and their
// resident blocks take room from the kernel that is running. Wait first (1): a kernel lets its
// successor launch only once it runs itself, so at most one kernel is ahead. Which is faster
// depends on the engine's GEMV (results/cuda_notes.md, "PDL order"); the bits never do.
#ifndef PDL_WAIT_FIRST
#define PDL_WAIT_FIRST 0
#endif
__device__ __forceinline__ void griddep_enter() {
#if PDL_WAIT_FIRST
    griddep_wait();
    griddep_launch();
#else
    griddep_launch();
    griddep_wait();
#endif
}

// 16-byte streaming load of read-only data that is used once (weights): no L1 allocation, so
// the activations that every block re-reads stay in L1.
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}
