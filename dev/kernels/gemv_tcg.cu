// dev/kernels/gemv_tcg.cu: a tiled tensor-core GEMV tried for the small matrices and not kept (its
// record: results/cuda_notes.md, "gemv_tcg"). Compiled after kernels/linear.cu (dev/gemv_variants.py),
// whose helpers it uses, so its rows keep gemv_tmb's order; dev/test_gemv_variants.py holds it to
// the engine's bits.

// ==== gemv_tcg_*: tensor cores, a tile's chain groups spread over warps and folded in order in the block ==
//
// Math     and Order: gemv_tmb's, through the same helpers (tmb_split_regs, tmb_kblock_regs). Each chain
//          group's sum dh + (dm + dl) is made by whichever warp holds the group and written to shared
//          memory; one warp a tile then folds them as tmb_fold and tmb_finish do: acc = acc + group over
//          a part's groups in increasing k, from 0.0f, then the parts added in index order. So the K split
//          (linear.tmb_ksplit) is an order here, not a launch: no scratch, no count, no fence, and a row
//          is bit-identical to gemv_tmb's and gemv_tmr's for the same tiled weights (a GPU test checks).
// Layout   tmb_tiled's; a warp's load of one mma step is 512 contiguous bytes (gemv_tmr's loads).
// Launch   block = NT tiles × NS warps a tile (warp w: tile NT·blockIdx.x + w / NS, slice w % NS) × 8
//          activation rows (block order). Slice s takes the tile's chain groups s, s + NS, ... (counted
//          over the parts in order) and walks each in stages of P 32-k blocks. With DB the next stage's
//          loads go out after the first mma of the current one, into a second register buffer (gemv_tmr's
//          reason: that mma's wait covers every load the warp has outstanding). Every warp loads and
//          splits its own activations (lane (g, t): row g, 8 k of each 32-k block; rows past M are
//          zeros), so its instructions per weight byte are the same for every M up to 8. Small
//          matrices get as many warps as they have chain groups. Dynamic shared memory: NT · groups ·
//          512 bytes (dev/gemv_variants.py: tcg_smem). The first stage's weights are loaded before griddep_wait().
template <int NT, int NS, int P, int DB, int EPI>
__device__ __forceinline__ void gemv_tcg_body(const bf16_t* __restrict__ W, const float* __restrict__ X, int ldx,
                                              float* __restrict__ Y, int ldy, int N, int K, int M, int ntiles,
                                              int ks) {
    constexpr int G = TMB_CG / 32;                   // 32-k blocks a chain group
    static_assert(G % P == 0, "a chain group is a whole number of stages");
    extern __shared__ __align__(16) float4 gsum[];   // [NT][groups][lane]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int ti = warp / NS, sl = warp - ti * NS;
    const int tile = tile_block(M, 8) * NT + ti;
    const bool live = tile < ntiles;
    const int m0 = row_group(M, 8) * 8, mc = min(8, M - m0);
    const int nkb = K / 32;
    auto part = [&](int z, int& a, int& n) {         // part z: 32-k blocks [a, a + n)
        a = (int)((i64)z * nkb / ks);
        n = (int)((i64)(z + 1) * nkb / ks) - a;
    };
    int ngroups = 0;
    for (int z = 0; z < ks; ++z) {
        int a, n;
        part(z, a, n);
        ngroups += (n + G - 1) / G;
    }
    auto group = [&](int i, int& kbs, int& nk) {     // chain group i (over the parts in order): [kbs, kbs + nk)
        for (int z = 0; z < ks; ++z) {
            int a, n;
            part(z, a, n);
            const int ng = (n + G - 1) / G;
            if (i < ng) {
                kbs = a + G * i;
                nk = min(G, n - G * i);
                return;
            }
            i -= ng;
        }
        kbs = nk = 0;
    };
    const uint4* wt = (const uint4*)W + (i64)(live ? tile : 0) * nkb * 64 + lane;
    const bool xon = g < mc;
    const float* xr = X + (i64)(m0 + (xon ? g : 0)) * ldx + 8 * t;
    auto load = [&](int kb, int n, uint4 (&w)[P][2], float4 (&xa)[P], float4 (&xb)[P], bool weights, bool acts) {
#pragma unroll
        for (int v = 0; v < P; ++v)
            if (v < n) {
                if (weights) {
                    w[v][0] = tc_ld16(wt + 64 * (kb + v));
                    w[v][1] = tc_ld16(wt + 64 * (kb + v) + 32);
                }
                if (acts) {
                    xa[v] = xon ? __ldg((const float4*)(xr + 32 * (kb + v))) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    xb[v] = xon ? __ldg((const float4*)(xr + 32 * (kb + v)) + 1) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
    };

    int i = sl, kbs = 0, nk = 0, u0 = 0;
    const bool any = live && i < ngroups;
    uint4 wa[P][2], wb[P][2];
    float4 xa0[P], xb0[P], xa1[P], xb1[P];
    if (any) {
        group(i, kbs, nk);
        load(kbs, min(P, nk), wa, xa0, xb0, true, false);   // weights: before the wait
    }
    griddep_enter();
    if (any) load(kbs, min(P, nk), wa, xa0, xb0, false, true);

    float dh[4] = {}, dm[4] = {}, dl[4] = {};
    // One stage from (cw, cxa, cxb); the next stage's loads into (nw, nxa, nxb), which is the same
    // buffer without DB. Returns whether there is a next stage.
    auto stage = [&](uint4 (&cw)[P][2], float4 (&cxa)[P], float4 (&cxb)[P], uint4 (&nw)[P][2], float4 (&nxa)[P],
                     float4 (&nxb)[P]) -> bool {
        const int n = min(P, nk - u0);
        int i2 = i, kbs2 = kbs, nk2 = nk, u2 = u0 + P;
        if (u2 >= nk) {
            i2 += NS;
            u2 = 0;
            if (i2 < ngroups) group(i2, kbs2, nk2);
        }
        const bool next = i2 < ngroups;
#pragma unroll
        for (int v = 0; v < P; ++v) {
            if (v < n) {
                unsigned wd[12];
                tmb_split_regs(cxa[v], cxb[v], wd);
                tmb_kblock_regs(dh, dm, dl, cw[v][0], cw[v][1], wd);
            }
            if (DB && v == 0 && next) load(kbs2 + u2, min(P, nk2 - u2), nw, nxa, nxb, true, true);
        }
        if (!DB && next) load(kbs2 + u2, min(P, nk2 - u2), nw, nxa, nxb, true, true);
        if (u0 + P >= nk) {                          // the chain group ends: its sum, for the fold
            gsum[(ti * ngroups + i) * 32 + lane] = make_float4(dh[0] + (dm[0] + dl[0]), dh[1] + (dm[1] + dl[1]),
                                                               dh[2] + (dm[2] + dl[2]), dh[3] + (dm[3] + dl[3]));
#pragma unroll
            for (int q = 0; q < 4; ++q) dh[q] = dm[q] = dl[q] = 0.0f;
        }
        i = i2;
        kbs = kbs2;
        nk = nk2;
        u0 = u2;
        return next;
    };
    if (any) {
        for (int s = 0;; ++s) {
            bool next;
            if (DB && (s & 1)) next = stage(wb, xa1, xb1, wa, xa0, xb0);
            else if (DB) next = stage(wa, xa0, xb0, wb, xa1, xb1);
            else next = stage(wa, xa0, xb0, wa, xa0, xb0);
            if (!next) break;
        }
    }
    __syncthreads();
    if (!live || sl != 0) return;
    float acc[4];
    for (int z = 0, gi = 0; z < ks; ++z) {
        int a, n;
        part(z, a, n);
        float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int j = 0; j < (n + G - 1) / G; ++j, ++gi) {
            const float4 v = gsum[(ti * ngroups + gi) * 32 + lane];
            s4[0] = s4[0] + v.x;
            s4[1] = s4[1] + v.y;
            s4[2] = s4[2] + v.z;
            s4[3] = s4[3] + v.w;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[q] = z == 0 ? s4[q] : acc[q] + s4[q];
    }
    tc_store<EPI>(Y, ldy, N, tile * (EPI == 2 ? 8 : 16) + g, m0, mc, t, acc);
}

#define GEMV_TCG_KERNEL(NT, NS, P, DB, EPI)                                                                           \
    extern "C" __global__ void __launch_bounds__(NT * NS * 32)                                                        \
        gemv_tcg_t##NT##_s##NS##_p##P##_d##DB##_e##EPI(const bf16_t* __restrict__ W, const float* __restrict__ X,     \
                                                       int ldx, float* __restrict__ Y, int ldy, int N, int K, int M,  \
                                                       int ntiles, int ks) {                                          \
        gemv_tcg_body<NT, NS, P, DB, EPI>(W, X, ldx, Y, ldy, N, K, M, ntiles, ks);                                    \
    }
#define GEMV_TCG(NT, NS, P, DB) \
    GEMV_TCG_KERNEL(NT, NS, P, DB, 0) GEMV_TCG_KERNEL(NT, NS, P, DB, 1) GEMV_TCG_KERNEL(NT, NS, P, DB, 2)
GEMV_TCG_VARIANTS
