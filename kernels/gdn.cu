// kernels/gdn.cu: Gated DeltaNet token steps for M rows in two launches (NumPy twin and
// launchers: kestrel/ops/gdn.py). State lives in a ring of slots: slot s of layer g starts at
// ring + s·slot_stride; the live slot is ctrl[CTRL_SLOT] (mod nslots). `mode` (GDN_MODES in
// kestrel/program.py): GDN_IN_PLACE: the live state is updated in place. GDN_CHECKPOINT: the
// state (and conv window) after row j goes to slot (live + 1 + j) mod nslots, row j+1 starts
// from it, and the live slot is only read: the engine's per-row checkpoints (policy
// "checkpoint"). GDN_CACHE: the rows run on the block's private copy and nothing is written
// back (policy "input-cache": the inputs are kept and folded in later, in place).
//
// gdn_conv    causal depthwise conv + SiLU, one thread per channel c of C = 2·nk·dk + nv·dv:
//               window = [hist[c, 0..K-2] | qkv[j, c]];  x[j, c] = silu(Σ_i window[i] · w[c, i])
//               (summed i = 0..K-1 in order, multiply then add, as NumPy does); hist <- window[1:].
//             Layout: qkv [M, ldq] (columns 0..C-1), w [C, K], x [M, ldx], hist [C, K-1] per slot.
//             Launch: grid ceil(C / GDN_CONV_THREADS), block GDN_CONV_THREADS; K <= GDN_CONV_KMAX.
//             Batched (a segment table, kernels/common.cuh): grid.y = the segments.
// gdn_recur   one block per value head h (key head h / (nv/nk)), state S_h [dk, dv] fp32 held in
//             shared memory across the M rows:
//               q = l2norm(x_q) · dk^-1/2, k = l2norm(x_k), v = x_v   (l2norm: x · 1/sqrt(Σx² + GDN_L2_EPS))
//               beta = sigmoid(b), g = -exp(A_log) · softplus(a + dt_bias)
//               S *= exp(g);  delta = beta · (v - Sᵀk);  S += k ⊗ delta;  o = Sᵀq
//               y = norm_w · (o · 1/sqrt(mean(o²) + eps)) · silu(z)        (plain-w gated norm)
//             Layout: x [M, ldx] = conv output (q | k | v), z [M, ldz], b [M, ldb], a [M, lda],
//             y [M, ldy], S [nv, dk, dv] per slot.
//             Launch: grid nv, block T = GDN_RECUR_THREADS, smem (dk·dv + 2dk + dv + T + RED_FLOATS)
//             floats (gdn_recur_smem in kestrel/ops/gdn.py); thread t owns column t mod dv and the
//             k-slice t / dv (k = slice, slice + nslice, ...; nslice = T / dv); column sums add the
//             nslice slices in order. dk, dv <= 512. Rows run in order inside
//             the block, so row j's arithmetic is the same whatever M is.
//             gdn_recur_regs: the same with each thread's elements of S in registers (no dk·dv
//             floats of shared memory, no shared-memory round trip per pass), compiled for
//             dk = GDN_RECUR_REGS_DK, dv = GDN_RECUR_REGS_DV (every Qwen3.5 size: 128, 128).
//             gdn_recur_cluster: the same arithmetic with each head's columns split over a cluster
//             of GDN_CLUSTER blocks (its own section below); the default for those dims on sm_90
//             and later (thread-block clusters), gdn_recur_regs before.
//             Batched (a segment table, kernels/common.cuh): grid.y = the segments, each block
//             running its segment's rows on its segment's state.
#include "common.cuh"

// A segment's own state (the GDN kernels' part of a segment, common.cuh): its rows, the state
// ring (S or the conv history: the segment's first pointer), ctrl block, ring slots and mode.
__device__ __forceinline__ void seg_state(const Seg& sg, int& M, float* __restrict__& ring,
                                          const int* __restrict__& ctrl, int& nslots, int& mode) {
    M = sg.M;
    ring = (float*)sg.p0;
    ctrl = sg.ctrl;
    nslots = sg.nslots;
    mode = sg.mode;
}

extern "C" __global__ void __launch_bounds__(GDN_CONV_THREADS) gdn_conv(
    const float* __restrict__ qkv, int ldq, const float* __restrict__ w, float* __restrict__ xo, int ldx,
    float* __restrict__ hist_ring, i64 slot_stride, int nslots, int mode, const int* __restrict__ ctrl, int M,
    int C, int K, const i64* __restrict__ seg) {
    griddep_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    if (seg) {                     // segment blockIdx.y of a batched launch (common.cuh)
        const Seg sg = seg_at(seg, blockIdx.y);
        if (sg.M == 0) return;     // a segment past the pass's (kestrel/cuda/segments.py): null state
        qkv += sg.lo * ldq;
        xo += sg.lo * ldx;
        seg_state(sg, M, hist_ring, ctrl, nslots, mode);
    }
    const int slot = ctrl[CTRL_SLOT];
    float* hin = hist_ring + (i64)(slot % nslots) * slot_stride + (i64)c * (K - 1);
    float win[GDN_CONV_KMAX], wc[GDN_CONV_KMAX];
#pragma unroll
    for (int i = 0; i < GDN_CONV_KMAX; ++i) {
        win[i] = (i < K - 1) ? hin[i] : 0.0f;
        wc[i] = (i < K) ? w[(i64)c * K + i] : 0.0f;
    }
    for (int j = 0; j < M; ++j) {
        const float xin = qkv[(i64)j * ldq + c];
        float acc = ((K - 1 > 0) ? win[0] : xin) * wc[0];
#pragma unroll
        for (int i = 1; i < GDN_CONV_KMAX; ++i)
            if (i < K) acc = acc + ((i < K - 1) ? win[i] : xin) * wc[i];
        xo[(i64)j * ldx + c] = silu_f(acc);
#pragma unroll
        for (int i = 0; i < GDN_CONV_KMAX - 1; ++i)
            if (i < K - 1) win[i] = (i + 1 < K - 1) ? win[i + 1] : xin;
        if (mode == GDN_CHECKPOINT) {
            float* hd = hist_ring + (i64)((slot + 1 + j) % nslots) * slot_stride + (i64)c * (K - 1);
#pragma unroll
            for (int i = 0; i < GDN_CONV_KMAX - 1; ++i)
                if (i < K - 1) hd[i] = win[i];
        }
    }
    if (mode == GDN_IN_PLACE) {
#pragma unroll
        for (int i = 0; i < GDN_CONV_KMAX - 1; ++i)
            if (i < K - 1) hin[i] = win[i];
    }
}

// gdn_move_inputs: in a batched pass (segment table, common.cuh) the GDN layers read and the
// in-projection writes the pass's rows, not each sequence's input cache (seg[SEG_P0]: that
// layer's cache, rows of ldc floats). to_cache = 1 copies a cached verify's rows into its cache,
// so the fold reads what a single-sequence cached verify would have left there; to_cache = 0
// gathers each sequence's cached rows into the pass, for a batched fold.
// Launch: grid (ceil(n / GDN_CONV_THREADS), the most rows of a segment, segments).
extern "C" __global__ void __launch_bounds__(GDN_CONV_THREADS) gdn_move_inputs(
    float* __restrict__ rows, int ldr, int ldc, int n, int to_cache, const i64* __restrict__ seg) {
    griddep_enter();
    const Seg sg = seg_at(seg, blockIdx.z);
    const int j = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= sg.M || c >= n) return;
    float* cache = (float*)sg.p0 + (i64)j * ldc + c;
    float* row = rows + (sg.lo + j) * ldr + c;
    if (to_cache) *cache = *row;
    else *row = *cache;
}

// dst[0..n) = src[0..n) by the whole block; 16-byte accesses, eight in flight per thread.
__device__ __forceinline__ void copy_state(float* __restrict__ dst, const float* __restrict__ src, int n) {
    const int nt = blockDim.x;
    if ((n & 3) == 0) {
        const int n4 = n >> 2;
        const float4* s4 = reinterpret_cast<const float4*>(src);
        float4* d4 = reinterpret_cast<float4*>(dst);
        int i = threadIdx.x;
        for (; i + 7 * nt < n4; i += 8 * nt) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = s4[i + u * nt];
#pragma unroll
            for (int u = 0; u < 8; ++u) d4[i + u * nt] = v[u];
        }
        for (; i < n4; i += nt) d4[i] = s4[i];
    } else {
        for (int i = threadIdx.x; i < n; i += nt) dst[i] = src[i];
    }
}

// A batched launch (seg != null): point the recurrence at segment blockIdx.y's rows, state ring,
// ctrl block, ring slots and mode (common.cuh), so its blocks run the single-sequence code on
// that sequence alone. false: the segment is past the pass's (M = 0); the caller returns.
__device__ __forceinline__ bool recur_segment(const i64* __restrict__ seg, const float* __restrict__& xc, int ldx,
                                              const float* __restrict__& z, int ldz, const float* __restrict__& b,
                                              int ldb, const float* __restrict__& a, int lda, float* __restrict__& y,
                                              int ldy, int& M, float* __restrict__& S_ring,
                                              const int* __restrict__& ctrl, int& nslots, int& mode) {
    if (!seg) return true;
    const Seg sg = seg_at(seg, blockIdx.y);
    if (sg.M == 0) return false;
    xc += sg.lo * ldx;
    z += sg.lo * ldz;
    b += sg.lo * ldb;
    a += sg.lo * lda;
    y += sg.lo * ldy;
    seg_state(sg, M, S_ring, ctrl, nslots, mode);
    return true;
}

// One pass of a thread over its elements of S (column col, k = kslice, kslice + nslice, ...) in
// increasing k: s <- upd(s, k), returning the partial sum of s · vec[k]. The recurrence's pass A
// and pass B differ only in upd and vec. REGS: S's elements are the thread's Sr (see below).
template <bool REGS, int NPER, class F>
__device__ __forceinline__ float column_pass(F upd, float* __restrict__ S, float (&Sr)[NPER],
                                             const float* __restrict__ vec, bool act, int kslice, int nslice, int dk,
                                             int dv, int col) {
    float acc = 0.0f;
    if (act) {
        if constexpr (!REGS) {
#pragma unroll 4
            for (int kk = kslice; kk < dk; kk += nslice) {
                const float s = upd(S[kk * dv + col], kk);
                S[kk * dv + col] = s;
                acc += s * vec[kk];
            }
        } else {
#pragma unroll
            for (int i = 0; i < NPER; ++i) {
                const int kk = kslice + i * nslice;
                if (kk < dk) {
                    const float s = upd(Sr[i], kk);
                    Sr[i] = s;
                    acc += s * vec[kk];
                }
            }
        }
    }
    return acc;
}

// REGS = false: S in shared memory, any dk, dv the launcher accepts. REGS = true: dk = DK and
// dv = DV fixed at compile time, each thread keeping its NPER = DK / nslice elements of S (column
// col, k = kslice + i·nslice) in registers; compile-time dims turn every address into a base plus
// a constant, so the elements stay in registers. The same operations on the same elements in the
// same order: the two agree bit for bit (kestrel/ops/gdn.py picks by shape alone).
template <bool REGS, int DK, int DV>
__device__ __forceinline__ void gdn_recur_body(
    const float* __restrict__ xc, int ldx, const float* __restrict__ z, int ldz, const float* __restrict__ b, int ldb,
    const float* __restrict__ a, int lda, const float* __restrict__ A_log, const float* __restrict__ dt_bias,
    const float* __restrict__ norm_w, float* __restrict__ y, int ldy, float* __restrict__ S_ring, i64 slot_stride,
    int nslots, int mode, const int* __restrict__ ctrl, int M, int nk, int nv, int dk_arg, int dv_arg, float qscale,
    float eps, const i64* __restrict__ seg) {
    extern __shared__ float4 sm4[];   // float4: 16-byte aligned for the vector state copies
    float* sm = reinterpret_cast<float*>(sm4);
    griddep_enter();
    // a segment past the pass's returns, the whole block (cluster) before any barrier
    if (!recur_segment(seg, xc, ldx, z, ldz, b, ldb, a, lda, y, ldy, M, S_ring, ctrl, nslots, mode)) return;
    const int dk = REGS ? DK : dk_arg, dv = REGS ? DV : dv_arg;
    constexpr int NSLICE = REGS ? (GDN_RECUR_THREADS / DV < DK ? GDN_RECUR_THREADS / DV : DK) : 1;
    constexpr int NPER = REGS ? (DK + NSLICE - 1) / NSLICE : 1;
    const int n = dk * dv;
    const int h = blockIdx.x, kh = h / (nv / nk), tid = threadIdx.x, nt = blockDim.x;
    float* S = sm;                          // REGS = false only
    float* q_sh = REGS ? sm : S + n;
    float* k_sh = q_sh + dk;
    float* vd = k_sh + dk;      // v, then delta
    float* part = vd + dv;    // blockDim.x partial column sums
    float* red = part + nt;   // RED_FLOATS
    const int slot = ctrl[CTRL_SLOT];
    const i64 hoff = (i64)h * n;
    float* Sg = S_ring + (i64)(slot % nslots) * slot_stride + hoff;
    const float decay = -expf(A_log[h]);
    const float dtb = dt_bias[h];
    int nslice = nt / dv;
    if (nslice > dk) nslice = dk;
    if (nslice < 1) nslice = 1;
    if constexpr (REGS) nslice = NSLICE;   // blockDim.x is GDN_RECUR_THREADS (kestrel/ops/gdn.py's launch)
    const int col = tid % dv, kslice = tid / dv;
    const bool act = kslice < nslice;
    float Sr[NPER];
    auto store_state = [&](float* __restrict__ dst) {   // dst <- S: a checkpoint slot, or back in place
        if constexpr (!REGS) {
            copy_state(dst, S, n);
        } else if (act) {
#pragma unroll
            for (int i = 0; i < NPER; ++i) {
                const int kk = kslice + i * nslice;
                if (kk < dk) dst[kk * dv + col] = Sr[i];
            }
        }
    };
    if constexpr (!REGS) {
        copy_state(S, Sg, n);
    } else {
#pragma unroll
        for (int i = 0; i < NPER; ++i) {
            const int kk = kslice + i * nslice;
            Sr[i] = (act && kk < dk) ? Sg[kk * dv + col] : 0.0f;
        }
    }
    __syncthreads();
    for (int j = 0; j < M; ++j) {
        const float* xr = xc + (i64)j * ldx;
        float sq = 0.0f, sk = 0.0f;
        for (int t = tid; t < dk; t += nt) {
            const float qv = xr[kh * dk + t], kv = xr[nk * dk + kh * dk + t];
            q_sh[t] = qv;
            k_sh[t] = kv;
            sq += qv * qv;
            sk += kv * kv;
        }
        for (int t = tid; t < dv; t += nt) vd[t] = xr[2 * nk * dk + h * dv + t];
        const float iq = 1.0f / sqrtf(block_sum(sq, red) + GDN_L2_EPS);
        const float ik = 1.0f / sqrtf(block_sum(sk, red) + GDN_L2_EPS);
        for (int t = tid; t < dk; t += nt) {
            q_sh[t] = (q_sh[t] * iq) * qscale;
            k_sh[t] = k_sh[t] * ik;
        }
        const float beta = sigmoid_f(b[(i64)j * ldb + h]);
        const float eg = expf(decay * softplus_f(a[(i64)j * lda + h] + dtb));
        __syncthreads();
        // pass A: decay, partial (Sᵀk)[col]
        part[tid] = column_pass<REGS>([&](float s, int) { return s * eg; }, S, Sr, k_sh, act, kslice, nslice, dk, dv, col);
        __syncthreads();
        if (tid < dv) {
            float km = part[tid];
            for (int q2 = 1; q2 < nslice; ++q2) km += part[q2 * dv + tid];
            vd[tid] = beta * (vd[tid] - km);
        }
        __syncthreads();
        // pass B: S += k ⊗ delta, partial (Sᵀq)[col]
        const float dl = vd[col];
        part[tid] = column_pass<REGS>([&](float s, int kk) { return s + k_sh[kk] * dl; }, S, Sr, q_sh, act, kslice,
                                      nslice, dk, dv, col);
        __syncthreads();
        float o = 0.0f;
        if (tid < dv) {
            o = part[tid];
            for (int q2 = 1; q2 < nslice; ++q2) o += part[q2 * dv + tid];
        }
        const float so = block_sum(tid < dv ? o * o : 0.0f, red);   // barriers also publish S
        if (tid < dv) {
            const float inv = 1.0f / sqrtf(so / (float)dv + eps);
            const float zz = z[(i64)j * ldz + (i64)h * dv + tid];
            y[(i64)j * ldy + (i64)h * dv + tid] = (norm_w[tid] * (o * inv)) * silu_f(zz);
        }
        if (mode == GDN_CHECKPOINT) store_state(S_ring + (i64)((slot + 1 + j) % nslots) * slot_stride + hoff);
        __syncthreads();
    }
    if (mode == GDN_IN_PLACE) store_state(Sg);
}

#define GDN_RECUR_KERNEL(NAME, REGS, DK, DV)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GDN_RECUR_THREADS, 1) NAME(                                          \
        const float* __restrict__ xc, int ldx, const float* __restrict__ z, int ldz, const float* __restrict__ b,     \
        int ldb, const float* __restrict__ a, int lda, const float* __restrict__ A_log,                               \
        const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float* __restrict__ y, int ldy,          \
        float* __restrict__ S_ring, i64 slot_stride, int nslots, int mode, const int* __restrict__ ctrl, int M,       \
        int nk, int nv, int dk, int dv, float qscale, float eps, const i64* __restrict__ seg) {                       \
        gdn_recur_body<REGS, DK, DV>(xc, ldx, z, ldz, b, ldb, a, lda, A_log, dt_bias, norm_w, y, ldy, S_ring, slot_stride,    \
                             nslots, mode, ctrl, M, nk, nv, dk, dv, qscale, eps, seg);                                \
    }
GDN_RECUR_KERNEL(gdn_recur, false, 0, 0)
GDN_RECUR_KERNEL(gdn_recur_regs, true, GDN_RECUR_REGS_DK, GDN_RECUR_REGS_DV)

// ---- gdn_recur_cluster: one value head over a cluster of GDN_CLUSTER blocks ----------------------
// gdn_recur_regs puts a whole head on one block: nv blocks (48 at the 27B shape) on a GPU of 132
// multiprocessors, each pulling its 64 KiB of state (and writing a 64 KiB checkpoint per row)
// through one multiprocessor, and every row paying a chain of global-load latencies. Here the dv
// columns of S_h are split over a thread-block cluster of GDN_CLUSTER = 4 blocks (sm_90): block r
// owns columns 32r..32r+31, lane = column, warp w = k-slice (k = w + 4i, i = 0..31), 32 elements of
// S per thread in registers. Rows go in chunks of GDN_RECUR_ROWS: each chunk's inputs are loaded
// once (q, k normalized by one warp per row), then each row is two register passes and two
// barriers. The only coupling between the blocks of a head is the gated norm's Σo² over dv: each
// block's warp butterfly goes to every block's shared memory (distributed shared memory) and one
// cluster barrier a chunk publishes them.
//
// The arithmetic is gdn_recur_regs' element for element: thread (col, slice) owns the same
// elements in the same order; column sums fold the four slices in order; every norm is the same
// warp butterflies added in warp order (block_reduce's zeros from idle warps change nothing:
// x + 0 = x for x >= +0). So the two agree bit for bit (tests/ops/test_gdn.py), and row j's
// arithmetic does not depend on M.
// Launch: grid nv·GDN_CLUSTER (cluster dims fixed at compile time), block GDN_CLUSTER_THREADS = 128,
// no dynamic shared memory. dk = dv = 128.
#define CL_DK GDN_RECUR_REGS_DK
#define CL_DV GDN_RECUR_REGS_DV
#define CL_COLS (CL_DV / GDN_CLUSTER)                  // 32: one warp's lanes
#define CL_NSLICE (GDN_CLUSTER_THREADS / 32)           // 4: the regs kernel's k-slices
#define CL_NPER (CL_DK / CL_NSLICE)                    // 32 elements of S per thread
static_assert(CL_COLS == 32, "gdn_recur_cluster: one warp's lanes are the block's columns");
static_assert(CL_NSLICE == GDN_RECUR_THREADS / CL_DV, "gdn_recur_cluster: the regs kernel's k-slices");
static_assert(CL_DK % 32 == 0 && CL_DK % CL_NSLICE == 0, "gdn_recur_cluster: head dims");

// the kernel's parameters (gdn_recur's), shared by the kernel and its pre-sm_90 stub
#define GDN_RECUR_CLUSTER_PARAMS                                                                          \
    const float* __restrict__ xc, int ldx, const float* __restrict__ z, int ldz, const float* __restrict__ b, \
        int ldb, const float* __restrict__ a, int lda, const float* __restrict__ A_log,                     \
        const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float* __restrict__ y, int ldy,\
        float* __restrict__ S_ring, i64 slot_stride, int nslots, int mode, const int* __restrict__ ctrl,    \
        int M, int nk, int nv, int dk_arg, int dv_arg, float qscale, float eps, const i64* __restrict__ seg

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
// Clusters and distributed shared memory need sm_90: older GPUs get a stub (gdn_recur_variant never
// picks this kernel there), so the rest of this file still compiles for them.
extern "C" __global__ void __launch_bounds__(GDN_CLUSTER_THREADS)
gdn_recur_cluster(GDN_RECUR_CLUSTER_PARAMS) {
    __trap();
}
#else
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned cluster_id_x() {
    unsigned r;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
    return r;
}
// v -> the float at `p` (this block's shared memory) in cluster block `rank`'s shared memory.
__device__ __forceinline__ void st_cluster(float* p, unsigned rank, float v) {
    unsigned long long local;
    unsigned remote;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(local) : "l"(p));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((unsigned)local), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

extern "C" __global__ void __cluster_dims__(GDN_CLUSTER, 1, 1) __launch_bounds__(GDN_CLUSTER_THREADS)
gdn_recur_cluster(GDN_RECUR_CLUSTER_PARAMS) {
    constexpr int R = GDN_RECUR_ROWS;
    __shared__ float qn[R][CL_DK], kn[R][CL_DK];        // normalized q, k of each row of the chunk
    __shared__ float vx[R][CL_COLS], zx[R][CL_COLS];    // this block's v and z columns
    __shared__ float gate[R][2];                        // beta, exp(g)
    __shared__ float part[CL_NSLICE][CL_COLS];          // pass A's partial column sums
    __shared__ float dl_sh[CL_COLS];                    // delta of the row
    __shared__ float opart[R][CL_NSLICE][CL_COLS];      // pass B's partial column sums, per row
    __shared__ float osq[2][R][GDN_CLUSTER];            // Σo² of each block's columns (written by every block)
    griddep_enter();
    // a segment past the pass's returns, the whole block (cluster) before any barrier
    if (!recur_segment(seg, xc, ldx, z, ldz, b, ldb, a, lda, y, ldy, M, S_ring, ctrl, nslots, mode)) return;
    cluster_arrive_relaxed();                 // every block of the cluster has started: paired below
    const unsigned rank = cluster_rank();
    const int h = (int)cluster_id_x(), kh = h / (nv / nk);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, col = (int)rank * CL_COLS + lane;
    const int slot = ctrl[CTRL_SLOT];
    const i64 hoff = (i64)h * (CL_DK * CL_DV);
    float* Sg = S_ring + (i64)(slot % nslots) * slot_stride + hoff;
    const float decay = -expf(A_log[h]);
    const float dtb = dt_bias[h];
    const float nw = norm_w[col];
    float Sr[CL_NPER];
#pragma unroll
    for (int i = 0; i < CL_NPER; ++i) Sr[i] = Sg[(w + i * CL_NSLICE) * CL_DV + col];
    bool waited = false;
    for (int j0 = 0, chunk = 0; j0 < M; j0 += R, ++chunk) {
        const int nr = M - j0 < R ? M - j0 : R;
        // the chunk's inputs: warp w normalizes rows w, w + NSLICE, ... (the regs kernel's block
        // sums); every load of the chunk is issued before the first is used, so the chunk pays one
        // memory latency, not one a row
        constexpr int RW = (R + CL_NSLICE - 1) / CL_NSLICE, NS = CL_DK / 32;
        float qv[RW][NS], kv[RW][NS], bv[RW], av[RW], vv[RW], zv[RW];
#pragma unroll
        for (int u = 0; u < RW; ++u) {
            const int r = w + u * CL_NSLICE;
            if (r < nr) {
                const float* xr = xc + (i64)(j0 + r) * ldx;
#pragma unroll
                for (int s = 0; s < NS; ++s) {
                    qv[u][s] = xr[kh * CL_DK + 32 * s + lane];
                    kv[u][s] = xr[nk * CL_DK + kh * CL_DK + 32 * s + lane];
                }
                vv[u] = xr[2 * nk * CL_DK + h * CL_DV + col];
                zv[u] = z[(i64)(j0 + r) * ldz + (i64)h * CL_DV + col];
                bv[u] = b[(i64)(j0 + r) * ldb + h];
                av[u] = a[(i64)(j0 + r) * lda + h];
            }
        }
#pragma unroll
        for (int u = 0; u < RW; ++u) {
            const int r = w + u * CL_NSLICE;
            if (r < nr) {
                float tq = 0.0f, tk = 0.0f;
#pragma unroll
                for (int s = 0; s < NS; ++s) {
                    float sq = 0.0f, sk = 0.0f;
                    sq += qv[u][s] * qv[u][s];
                    sk += kv[u][s] * kv[u][s];
                    sq = warp_sum(sq);
                    sk = warp_sum(sk);
                    tq = s == 0 ? sq : tq + sq;      // the warps' partials in warp order
                    tk = s == 0 ? sk : tk + sk;
                }
                const float iq = 1.0f / sqrtf(tq + GDN_L2_EPS), ik = 1.0f / sqrtf(tk + GDN_L2_EPS);
#pragma unroll
                for (int s = 0; s < NS; ++s) {
                    qn[r][32 * s + lane] = (qv[u][s] * iq) * qscale;
                    kn[r][32 * s + lane] = kv[u][s] * ik;
                }
                vx[r][lane] = vv[u];
                zx[r][lane] = zv[u];
                if (lane == 0) {
                    gate[r][0] = sigmoid_f(bv[u]);
                    gate[r][1] = expf(decay * softplus_f(av[u] + dtb));
                }
            }
        }
        __syncthreads();
        for (int r = 0; r < nr; ++r) {
            const float beta = gate[r][0], eg = gate[r][1];
            float acc = 0.0f;                  // pass A: decay, partial (Sᵀk)[col]
#pragma unroll
            for (int i = 0; i < CL_NPER; ++i) {
                const float s = Sr[i] * eg;
                Sr[i] = s;
                acc += s * kn[r][w + i * CL_NSLICE];
            }
            part[w][lane] = acc;
            __syncthreads();
            if (w == 0) {
                float km = part[0][lane];
#pragma unroll
                for (int q2 = 1; q2 < CL_NSLICE; ++q2) km += part[q2][lane];
                dl_sh[lane] = beta * (vx[r][lane] - km);
            }
            __syncthreads();
            const float dl = dl_sh[lane];
            acc = 0.0f;                        // pass B: S += k ⊗ delta, partial (Sᵀq)[col]
#pragma unroll
            for (int i = 0; i < CL_NPER; ++i) {
                const float s = Sr[i] + kn[r][w + i * CL_NSLICE] * dl;
                Sr[i] = s;
                acc += s * qn[r][w + i * CL_NSLICE];
            }
            opart[r][w][lane] = acc;
            if (mode == GDN_CHECKPOINT) {
                float* dst = S_ring + (i64)((slot + 1 + j0 + r) % nslots) * slot_stride + hoff;
#pragma unroll
                for (int i = 0; i < CL_NPER; ++i) dst[(w + i * CL_NSLICE) * CL_DV + col] = Sr[i];
            }
        }
        __syncthreads();
        // o = the slices' sums in order; each warp's butterfly of o² goes to every block of the head
        if (!waited) {
            cluster_wait();
            waited = true;
        }
        const int buf = chunk & 1;
        for (int r = w; r < nr; r += CL_NSLICE) {
            float o = opart[r][0][lane];
#pragma unroll
            for (int q2 = 1; q2 < CL_NSLICE; ++q2) o += opart[r][q2][lane];
            opart[r][0][lane] = o;
            const float p = warp_sum(o * o);
            if (lane < GDN_CLUSTER) st_cluster(&osq[buf][r][rank], (unsigned)lane, p);
        }
        cluster_arrive();
        cluster_wait();
        for (int t = threadIdx.x; t < nr * CL_COLS; t += GDN_CLUSTER_THREADS) {
            const int r = t / CL_COLS, c = t % CL_COLS;
            float so = osq[buf][r][0];
#pragma unroll
            for (int q2 = 1; q2 < GDN_CLUSTER; ++q2) so = so + osq[buf][r][q2];
            const float inv = 1.0f / sqrtf(so / (float)CL_DV + eps);
            // c == lane (the stride is whole warps), so nw is this column's norm weight
            y[(i64)(j0 + r) * ldy + (i64)h * CL_DV + col] = (nw * (opart[r][0][c] * inv)) * silu_f(zx[r][c]);
        }
        __syncthreads();                       // the chunk's shared inputs are free again
    }
    if (!waited) cluster_wait();
    if (mode == GDN_IN_PLACE) {
#pragma unroll
        for (int i = 0; i < CL_NPER; ++i) Sg[(w + i * CL_NSLICE) * CL_DV + col] = Sr[i];
    }
}
#endif
