// kernels/attention.cu: gated attention decode over a KV cache with a cursor, M rows at once
// (NumPy twin and launchers:
// kestrel/ops/attention.py, with kestrel/ops/rope.py and kestrel/ops/norm.py).
//
// Math     per row j at position p = ctrl[CTRL_POS] + j, query head i, kv head i / (nh / nkv):
//            q = rope(rmsnorm_zc(q_raw, q_norm)), k = rope(rmsnorm_zc(k_raw, k_norm)), v = v_raw
//            (zero-centred RMSNorm over hd; partial NeoX RoPE on the first 2·rh channels:
//             (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), tables indexed by p - rope_row0)
//            K/V rows p are appended to the cache first (attn_kv_append), then
//            s_l = (q · K[l]) · scale for l = 0..p (causal inside the batch: row j sees the rows
//            of rows < j of its own batch, never those after), softmax in fp32,
//            out = (Σ_l e_l V[l] / Σ_l e_l) · sigmoid(gate)   (gate = the second hd of the head).
// Layout   q/gate: row j of [M, ldq], head i at columns i·2hd (query hd | gate hd);
//          k, v: [M, ldk] / [M, ldv], kv head h at columns h·hd; caches [max_seq, nkv, hd];
//          out [M, ldo], head i at columns i·hd; cos/sin [n_pos, rh].
// Launch   attn_kv_append: grid (nkv, M), block KV_APPEND_THREADS, smem (hd + RED_FLOATS) floats.
//          attn_decode:    grid (nh, M), block T = ATTN_DECODE_THREADS, smem (hd + RED_FLOATS + L_max)
//          floats; thread t scores cache rows t, t+T, ... (dot over hd in order, fmaf), block max/sum in fixed
//          order, then thread d accumulates Σ_l e_l V[l, d] in increasing l. Each (head, row)
//          block is independent of M: row j is bit-identical whatever the batch width.
//          Batched (a segment table, kernels/common.cuh): grid (heads, the most rows of a
//          segment, segments); a block past its segment's rows returns at once.
#include "common.cuh"

// buf[0..hd) = rope(rmsnorm_zc(x)) for one head; every thread returns after a barrier.
__device__ __forceinline__ void norm_rope_head(const float* __restrict__ x, const float* __restrict__ w,
                                               const float* __restrict__ cs, const float* __restrict__ sn,
                                               int hd, int rh, float eps, float* buf, float* red) {
    float ss = 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        const float v = x[d];
        buf[d] = v;
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)hd + eps);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) buf[d] = (buf[d] * inv) * (1.0f + w[d]);
    __syncthreads();
    for (int d = threadIdx.x; d < rh; d += blockDim.x) {
        const float x1 = buf[d], x2 = buf[d + rh], c = cs[d], s = sn[d];
        buf[d] = x1 * c - x2 * s;
        buf[d + rh] = x2 * c + x1 * s;
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(KV_APPEND_THREADS) attn_kv_append(
    const float* __restrict__ kin, int ldk, const float* __restrict__ vin, int ldv, const float* __restrict__ knw,
    const float* __restrict__ cosT, const float* __restrict__ sinT, int rope_row0, float* __restrict__ kc,
    float* __restrict__ vc, const int* __restrict__ ctrl, int nkv, int hd, int rh, float eps,
    const i64* __restrict__ seg) {
    extern __shared__ float sm[];
    griddep_enter();
    float* kb = sm;
    float* red = sm + hd;
    const int h = blockIdx.x, j = blockIdx.y;
    if (seg) {                     // segment blockIdx.z of a batched launch (common.cuh)
        const Seg sg = seg_at(seg, blockIdx.z);
        if (j >= sg.M) return;     // the whole block, before any barrier
        kin += sg.lo * ldk;
        vin += sg.lo * ldv;
        kc = (float*)sg.p0;
        vc = (float*)sg.p1;
        ctrl = sg.ctrl;
    }
    const int p = ctrl[CTRL_POS] + j;
    const i64 crow = (i64)(p - rope_row0) * rh;
    norm_rope_head(kin + (i64)j * ldk + (i64)h * hd, knw, cosT + crow, sinT + crow, hd, rh, eps, kb, red);
    float* kr = kc + ((i64)p * nkv + h) * hd;
    float* vr = vc + ((i64)p * nkv + h) * hd;
    const float* vi = vin + (i64)j * ldv + (i64)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        kr[d] = kb[d];
        vr[d] = vi[d];
    }
}

extern "C" __global__ void __launch_bounds__(ATTN_DECODE_THREADS) attn_decode(
    const float* __restrict__ qin, int ldq, const float* __restrict__ qnw, const float* __restrict__ cosT,
    const float* __restrict__ sinT, int rope_row0, const float* __restrict__ kc, const float* __restrict__ vc,
    float* __restrict__ out, int ldo, const int* __restrict__ ctrl, int nh, int nkv, int hd, int rh, float eps,
    float scale, const i64* __restrict__ seg) {
    extern __shared__ float sm[];
    griddep_enter();
    float* qs = sm;
    float* red = sm + hd;
    float* sc = red + RED_FLOATS;
    const int i = blockIdx.x, j = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    if (seg) {                     // segment blockIdx.z of a batched launch (common.cuh)
        const Seg sg = seg_at(seg, blockIdx.z);
        if (j >= sg.M) return;     // the whole block, before any barrier
        qin += sg.lo * ldq;
        out += sg.lo * ldo;
        kc = (const float*)sg.p0;
        vc = (const float*)sg.p1;
        ctrl = sg.ctrl;
    }
    const int p = ctrl[CTRL_POS] + j, L = p + 1, kvh = i / (nh / nkv);
    const float* qr = qin + (i64)j * ldq + (i64)i * 2 * hd;
    const i64 crow = (i64)(p - rope_row0) * rh;
    norm_rope_head(qr, qnw, cosT + crow, sinT + crow, hd, rh, eps, qs, red);

    const i64 kst = (i64)nkv * hd;
    const float* kb = kc + (i64)kvh * hd;
    const float* vb = vc + (i64)kvh * hd;
    float mx = neg_inf_f();
    for (int l = tid; l < L; l += nt) {
        const float* kr = kb + (i64)l * kst;
        float s = 0.0f;
        if ((hd & 3) == 0) {
            for (int d = 0; d < hd; d += 4) {
                const float4 k4 = __ldg((const float4*)(kr + d));
                s = fmaf(qs[d], k4.x, s);
                s = fmaf(qs[d + 1], k4.y, s);
                s = fmaf(qs[d + 2], k4.z, s);
                s = fmaf(qs[d + 3], k4.w, s);
            }
        } else {
            for (int d = 0; d < hd; ++d) s = fmaf(qs[d], __ldg(kr + d), s);
        }
        s = s * scale;
        sc[l] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, red);
    float se = 0.0f;
    for (int l = tid; l < L; l += nt) {
        const float e = expf(sc[l] - mx);
        sc[l] = e;
        se += e;
    }
    const float tot = block_sum(se, red);   // its barriers also publish sc[]
    for (int d = tid; d < hd; d += nt) {
        float o = 0.0f;
        const float* vd = vb + d;
        for (int l = 0; l < L; ++l) o = fmaf(sc[l], __ldg(vd + (i64)l * kst), o);
        o = o / tot;
        out[(i64)j * ldo + (i64)i * hd + d] = o * sigmoid_f(qr[hd + d]);
    }
}
