"""Projections: the batch-invariant NumPy twin vs float64, and kernels/linear.cu vs its twin:
every row of an M-row launch is bit-identical to that row launched alone, for every epilogue,
for the engine's two bf16 GEMVs (CUDA-core "fma", tensor-core "tmb") and the fp32 one. The
variants no engine option selects are tested beside their harness, in dev/test_gemv_variants.py."""
import numpy as np
import pytest

from gpu import F32, dev, finite, go, host, needs_gpu, rel
from kestrel import nvrtc as L
from kestrel.ops import linear, mlp
from kestrel.weights import bf16_to_f32, f32_to_bf16


@pytest.mark.parametrize("m", [1, 3, 8, 11])
def test_linear(rng, m):
    x = rng.standard_normal((m, 40)).astype(np.float32)
    w = rng.standard_normal((33, 40)).astype(np.float32)
    assert rel(linear.linear(x, w), x.astype(np.float64) @ w.T.astype(np.float64)) < F32


def test_linear_rows_do_not_depend_on_m(rng):
    x = rng.standard_normal((17, 64)).astype(np.float32)
    w = rng.standard_normal((50, 64)).astype(np.float32)
    alone = np.concatenate([linear.linear(x[j:j + 1], w) for j in range(17)])
    for m in (2, 3, 8, 9, 17):
        assert np.array_equal(linear.linear(x[:m], w), alone[:m]), m


def test_gemv_kernel_choice_refuses_unknown_names(rng):
    w = rng.integers(0, 1 << 16, (4, 8)).astype(np.uint16)
    with pytest.raises(ValueError, match="gemv='cublas'"):
        linear.gemv_launch(w, None, None, 1, 8, 8, 4, gemv="cublas")


def _weight(be, rng, N, K, wdtype):
    w32 = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    w_host = bf16_to_f32(f32_to_bf16(w32)) if wdtype == "bf16" else w32
    w = be.put_weight("w", w32, wdtype)
    assert w.dtype == (np.uint16 if wdtype == "bf16" else np.float32)
    assert np.array_equal(host(be.weight_f32(w)), w_host)
    return w, w_host


def _gemv(be, w, x, N, epilogue="store", half=0, y0=None, kernel="fma", launcher=None):
    m, K = x.shape
    y = dev(y0) if y0 is not None else be.empty((m, N))
    if launcher is None:
        tiled = linear.tmb_tiled(w, K, epilogue, half) if kernel == "tmb" and K % 32 == 0 else None
        go(be, linear.gemv_launch(w, dev(x), y, m, K, K, N, epilogue, half, gemv=kernel, tiled=tiled))
    else:
        go(be, launcher(w, dev(x), y, m, K, K, N, epilogue, half))
    return host(y)


KERNELS = [("fp32", "fma"), ("bf16", "fma"), ("bf16", "tmb")]
MS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 17)


@pytest.mark.parametrize("wdtype,kernel", KERNELS)
@pytest.mark.parametrize("N,K", [(37, 64), (130, 96), (50, 30), (70, 4100), (300, 5120), (40, 12288), (21, 1032)])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_kernel(be, rng, wdtype, kernel, N, K):
    """y = x·Wᵀ: vs float64 and the NumPy twin; every row of an M-row call == that row alone."""
    w, w_host = _weight(be, rng, N, K, wdtype)
    if kernel == "tmb":        # gemv_tmb or gemv_tmr (tmb_kernel) wherever K is in 32-k blocks (on sm_90), else fma
        x0, y0 = dev(rng.standard_normal((1, K))), be.empty((1, N))
        tmb = linear.tmb_eligible(w, K, x0, K)
        assert tmb == (K % 32 == 0 and linear._device()["cc"] >= 90)
        fn = linear.gemv_launch(w, x0, y0, 1, K, K, N, gemv="tmb",
                                tiled=linear.tmb_tiled(w, K) if tmb else None)[0]
        tiles = linear.tmb_tiles(N)
        want = "gemv_" + linear.tmb_kernel(tiles, linear.tmb_ksplit(K, tiles))[0] if tmb else "gemv_bf16"
        assert fn.name.startswith(want)
    x = rng.standard_normal((17, K)).astype(np.float32)
    alone = [_gemv(be, w, x[j:j + 1], N, kernel=kernel)[0] for j in range(17)]
    for m in MS:
        y = _gemv(be, w, x[:m], N, kernel=kernel)
        assert y.shape == (m, N) and np.all(np.isfinite(y))
        assert rel(y, x[:m].astype(np.float64) @ w_host.T.astype(np.float64)) < F32, m
        assert rel(y, linear.linear(x[:m], w_host)) < F32
        for j in range(m):
            assert np.array_equal(y[j], alone[j]), (m, j)       # batch invariance, bit-exact


@pytest.mark.parametrize("wdtype,kernel", KERNELS)
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_epilogues(be, rng, wdtype, kernel):
    """y += x·Wᵀ (the residual) and SwiGLU over a stacked [gate; up]: M = 1..8, rows independent of M."""
    I, K = 72, 224
    w, w_host = _weight(be, rng, 2 * I, K, wdtype)
    x = rng.standard_normal((8, K)).astype(np.float32)
    y0 = rng.standard_normal((8, 2 * I)).astype(np.float32)
    add_alone = [_gemv(be, w, x[j:j + 1], 2 * I, "add", y0=y0[j:j + 1], kernel=kernel)[0] for j in range(8)]
    act_alone = [_gemv(be, w, x[j:j + 1], I, "swiglu", half=I, kernel=kernel)[0] for j in range(8)]
    for m in range(1, 9):
        y = _gemv(be, w, x[:m], 2 * I, "add", y0=y0[:m], kernel=kernel)
        assert rel(y, y0[:m] + linear.linear(x[:m], w_host)) < F32
        act = _gemv(be, w, x[:m], I, "swiglu", half=I, kernel=kernel)
        g, u = linear.linear(x[:m], w_host[:I]), linear.linear(x[:m], w_host[I:])
        assert finite(act) and rel(act, mlp.swiglu(g, u)) < F32
        for j in range(m):
            assert np.array_equal(y[j], add_alone[j]) and np.array_equal(act[j], act_alone[j]), (m, j)


@pytest.mark.parametrize("kernel", ["tmb"])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_tmb_stacked_rows_equal_their_parts(be, rng, kernel):
    """A row of a stacked matrix sits at another place in its mma tile than in its own matrix:
    the bits must not change (the stacked projections rely on it), nor for SwiGLU's [gate; up]."""
    K, parts = 320, (37, 50, 8, 19)
    ws = [_weight(be, rng, n, K, "bf16")[0] for n in parts]
    stacked = cp_concat(ws)
    x = rng.standard_normal((5, K)).astype(np.float32)
    ys = _gemv(be, stacked, x, sum(parts), kernel=kernel)
    r0 = 0
    for w, n in zip(ws, parts):
        assert np.array_equal(ys[:, r0:r0 + n], _gemv(be, w, x, n, kernel=kernel))
        r0 += n
    I = 27
    gate, up = _weight(be, rng, I, K, "bf16")[0], _weight(be, rng, I, K, "bf16")[0]
    act = _gemv(be, cp_concat([gate, up]), x, I, "swiglu", half=I, kernel=kernel)
    g, u = dev(_gemv(be, gate, x, I, kernel=kernel)), dev(_gemv(be, up, x, I, kernel=kernel))
    out = be.empty((5, I))
    go(be, mlp.swiglu_launch(g, u, out, 5 * I))
    assert np.array_equal(act, host(out))


@pytest.mark.parametrize("kernel", ["fma", "tmb"])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_bf16_wide_range_activations(be, rng, kernel):
    """Activations over 2^±40 in one row: fp32 accuracy (the tensor-core kernel's three bf16
    terms of x must reproduce it exactly, not to bf16's 8 bits)."""
    N, K = 96, 2048
    w, w_host = _weight(be, rng, N, K, "bf16")
    x = (rng.standard_normal((4, K)) * 2.0 ** rng.uniform(-40, 40, (4, K))).astype(np.float32)
    y = _gemv(be, w, x, N, kernel=kernel)
    ref = x.astype(np.float64) @ w_host.T.astype(np.float64)
    assert finite(y)
    for j in range(4):
        assert rel(y[j], ref[j]) < F32, j


def cp_concat(ws):
    import cupy as cp
    return cp.ascontiguousarray(cp.concatenate(ws, axis=0))


# ---- gemv_tmb: the tiled layout and the kernel's addressing, on the CPU ----------------------------
def test_tmb_ksplit_depends_on_the_matrix_alone():
    """A matrix's K split (part of its order) is a function of its K and tile count, within the
    compiled splits and at most K/32; the 27B rows keep the splits their results were measured with."""
    for K in (32, 1024, 2048, 4096, 5120, 6144, 8192, 12288, 17408):
        for tiles in (1, 64, 128, 129, 320, 511, 512, 2176, 15520):
            ks = linear.tmb_ksplit(K, tiles)
            assert ks in linear.TMB_KSPLITS and ks <= K // 32, (K, tiles, ks)
    # the 27B shape: in_proj, q|k|v, gate|up, down, out/o_proj, head
    assert [linear.tmb_ksplit(K, t) for K, t in ((5120, 1030), (5120, 896), (5120, 2176), (17408, 320),
                                                  (6144, 320), (5120, 15520))] == [1, 1, 1, 3, 3, 1]
    # the short matrices of the small presets split more: 0.8B down, 4B out_proj; short rows do not
    assert linear.tmb_ksplit(3584, 64) == 4 and linear.tmb_ksplit(4096, 160) == 3
    assert linear.tmb_ksplit(1024, 64) == 1


@pytest.mark.parametrize("rows,K,epilogue,half", [(37, 64, "store", 0), (42, 96, "swiglu", 21), (16, 32, "add", 0)])
def test_tmb_tiled_layout(rng, rows, K, epilogue, half):
    """Element (tile T, 32-k block kb, mma step s, lane 4g + t, q, h, j) of the tiled bytes is row
    g + 8h of tile T (swiglu: gate rows 8T.., then up rows half + 8T..) at k = 32kb + 8t + 4s + 2q + j;
    zero past the matrix."""
    W = rng.integers(0, 1 << 16, (rows, K)).astype(np.uint16)
    t = linear.tmb_tiled(W, K, epilogue, half)
    T = linear.tmb_tiles(rows, epilogue, half)
    assert t.shape == (T * 16, K) and t.dtype == np.uint16
    e = t.reshape(T, K // 32, 2, 8, 4, 2, 2, 2)                  # [T][kb][s][g][t][q][h][j]
    for T_ in range(T):
        for r in range(16):
            h, g = divmod(r, 8)
            if epilogue == "swiglu":
                n = T_ * 8 + g
                src = (half + n if h else n) if n < half else None
            else:
                n = T_ * 16 + r
                src = n if n < rows else None
            got = e[T_, :, :, g, :, :, h].transpose(0, 2, 1, 3, 4).reshape(K)   # [kb][t][s][q][j]: k in order
            assert np.array_equal(got, W[src] if src is not None else np.zeros(K, np.uint16)), (T_, r)
    with pytest.raises(ValueError, match="multiple of 32"):
        linear.tmb_tiled(W[:, :K - 8], K - 8)


def _split3(x):
    u = np.asarray(x, np.float32)
    out, r = [], u
    for _ in range(3):
        hi = (r.view(np.uint32) & 0xFFFF0000).view(np.float32)
        out.append(hi.astype(np.float64))
        r = (r - hi).astype(np.float32)
    return out


def _split3_words(x0, x1):
    """split3 of kernels/linear.cu: the (hi, mid, lo) bf16x2 words of two floats (x0 in the low half)."""
    r, words = np.array([x0, x1], np.float32), []
    for _ in range(3):
        bits = r.view(np.uint32)
        words.append(int(bits[0] >> 16) | int(bits[1] >> 16) << 16)
        r = (r - (bits & 0xFFFF0000).view(np.float32)).astype(np.float32)
    return words


def _xsplit_stage(x, m0, mc, k0, nkbs):
    """The block's xsplit for one stage, as gemv_tmb packs it: [kb][j][lane] -> 4 words."""
    out = np.zeros((nkbs, 3, 32, 4), np.uint32)
    for kb in range(nkbs):
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            u = x[m0 + g, k0 + 32 * kb + 8 * t:k0 + 32 * kb + 8 * t + 8] if g < mc else np.zeros(8, np.float32)
            w = [0] * 12
            w[0], w[2], w[4] = _split3_words(u[0], u[1])
            w[1], w[3], w[5] = _split3_words(u[2], u[3])
            w[6], w[8], w[10] = _split3_words(u[4], u[5])
            w[7], w[9], w[11] = _split3_words(u[6], u[7])
            out[kb, :, lane] = np.array(w, np.uint32).reshape(3, 4)
    return out


# the (b0, b1) words of each chain (hi, mid, lo) for mma step h, as kblock reads x0, x1, x2
_XSPLIT_READ = {0: (((0, 0), (0, 1)), ((0, 2), (0, 3)), ((1, 0), (1, 1))),
                1: (((1, 2), (1, 3)), ((2, 0), (2, 1)), ((2, 2), (2, 3)))}


def _tmb_trace(W, x, y0, K, epilogue, half, kc, ks):
    """gemv_tmb's addressing traced in Python, each mma exact (float64): the tiled bytes read as
    kernels/linear.cu reads them (stage base 32(TK + k0), lane offsets 1024kb + 512s + 16·lane),
    the B fragments read from the block's xsplit as packed there (and checked against the three
    terms of each activation), the parts of the K split, the D-fragment stores."""
    epi = linear.EPI[epilogue]
    flat = linear.tmb_tiled(W, K, epilogue, half).reshape(-1)
    T = linear.tmb_tiles(W.shape[0], epilogue, half)
    M, nkb = x.shape[0], K // 32
    N = half if epi == 2 else W.shape[0]
    Y = y0.astype(np.float64).copy() if epi == 1 else np.full((M, N), np.nan)
    wide = lambda u: (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    for m0 in range(0, M, 8):
        mc = min(8, M - m0)
        for tile in range(T):
            acc = np.zeros((16, 8))
            for z in range(ks):
                klo, khi = 32 * (z * nkb // ks), 32 * ((z + 1) * nkb // ks)
                for k0 in range(klo, khi, kc):
                    base = (tile * K + k0) * 32 // 2            # uint16 elements
                    nkbs = min(kc, khi - k0) // 32
                    xs = _xsplit_stage(x, m0, mc, k0, nkbs)
                    for kb in range(nkbs):
                        for h in range(2):
                            A, B = np.zeros((16, 16)), [np.zeros((16, 8)) for _ in range(3)]
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                oa = base + (1024 * kb + 512 * h + 16 * lane) // 2   # step h's fragment
                                f = wide(flat[oa:oa + 8])              # registers (a0, a1, a2, a3)
                                A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = f[0:2], f[2:4]
                                A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = f[4:6], f[6:8]
                                want = _split3(x[m0 + g, k0 + 32 * kb + 8 * t + 4 * h:][:4]) if g < mc else [np.zeros(4)] * 3
                                for B_, (j0, j1), part in zip(B, _XSPLIT_READ[h], want):
                                    for rows, (j, i) in ((slice(2 * t, 2 * t + 2), j0), (slice(2 * t + 8, 2 * t + 10), j1)):
                                        word = np.array([xs[kb, j, lane, i]], np.uint32)
                                        B_[rows, g] = wide(word.view(np.uint16))
                                    assert np.array_equal(np.r_[B_[2 * t:2 * t + 2, g], B_[2 * t + 8:2 * t + 10, g]],
                                                          part), (kb, h, lane)
                            for B_ in B:
                                acc += A @ B_
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for c in (2 * t, 2 * t + 1):
                    if c >= mc:
                        continue
                    if epi == 2:
                        if tile * 8 + g < N:
                            s = acc[g, c]
                            Y[m0 + c, tile * 8 + g] = s / (1 + np.exp(-s)) * acc[g + 8, c]
                        continue
                    for n, r in ((tile * 16 + g, g), (tile * 16 + g + 8, g + 8)):
                        if n < N:
                            Y[m0 + c, n] = Y[m0 + c, n] + acc[r, c] if epi == 1 else acc[r, c]
    return Y


@pytest.mark.parametrize("rows,K,epilogue,half", [(40, 352, "store", 0), (37, 320, "add", 0), (42, 384, "swiglu", 21)])
def test_tmb_addressing_traced_on_the_cpu(rng, rows, K, epilogue, half):
    """The tiled layout and the kernel's addressing (stages, K split, fragments, stores) together
    compute x·Wᵀ: traced with exact mma, the product equals float64's for partial tiles, a last
    stage shorter than KC, 9 rows (two row groups) and K splits of 1 to 3 parts."""
    W = (rng.standard_normal((rows, K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    x = rng.standard_normal((9, K)).astype(np.float32)
    N = half if epilogue == "swiglu" else rows
    y0 = rng.standard_normal((9, N)).astype(np.float32)
    s = x.astype(np.float64) @ bf16_to_f32(W).astype(np.float64).T
    if epilogue == "swiglu":
        want = mlp.swiglu(s[:, :half], s[:, half:2 * half])
    else:
        want = y0 + s if epilogue == "add" else s
    for kc, ks in ((128, 1), (64, 2), (256, 3)):
        got = _tmb_trace(W, x, y0, K, epilogue, half, kc, ks)
        assert np.all(np.isfinite(got)) and rel(got, want) < 1e-12, (kc, ks)


@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_tmb_needs_its_tiled_weights(be, rng):
    """Both tiled kernels refuse another matrix's tiled weights, uncompiled shapes and K splits
    they cannot take, each with an error that names it."""
    w, _ = _weight(be, rng, 40, 64, "bf16")
    X, y = dev(rng.standard_normal((2, 64))), be.empty((2, 40))
    tiled = linear.tmb_tiled(w, 64)
    with pytest.raises(ValueError, match="tiled"):
        linear.gemv_launch(w, X, y, 2, 64, 64, 40, gemv="tmb")
    for kind, good_shape, bad_shape in (("tmb", linear.TMB_SHAPES[0], (7, 256, 2)), ("tmr", linear.TMR_SHAPES[0], (3, 8))):
        name = f"gemv_{kind}"
        with pytest.raises(ValueError, match=f"{name}: tiled weights"):
            linear._tiled_launch(kind, good_shape, 1, w, linear.tmb_tiled(w[:16], 64), X, y, 2, 64, 64, 40)
        with pytest.raises(ValueError, match=f"{name} shape .* not compiled"):
            linear._tiled_launch(kind, bad_shape, 1, w, tiled, X, y, 2, 64, 64, 40)
        with pytest.raises(ValueError, match=f"{name} K split 3"):
            linear._tiled_launch(kind, good_shape, 3, w, tiled, X, y, 2, 64, 64, 40)   # K = 64 is two 32-k blocks


def _tiled_cases(be, rng, R: int, I: int = 45, K: int = 1056):
    """A bf16 [2I, K] matrix (N not a multiple of a tile, K not of a stage or a chain group), R
    fresh activation rows, and per epilogue (name, outputs, half, y before, float64 result)."""
    w, w_host = _weight(be, rng, 2 * I, K, "bf16")
    x = rng.standard_normal((R, K)).astype(np.float32)
    y0 = rng.standard_normal((R, 2 * I)).astype(np.float32)
    ref = x.astype(np.float64) @ w_host.T.astype(np.float64)
    return w, x, K, (("store", 2 * I, 0, None, ref), ("add", 2 * I, 0, y0, y0 + ref),
                     ("swiglu", I, I, None, mlp.swiglu(ref[:, :I], ref[:, I:])))


@pytest.mark.parametrize("ks", linear.TMB_KSPLITS)
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_tmb_shapes(be, rng, ks):
    """Every compiled gemv_tmb shape and every gemv_tmr shape, every epilogue, N not a multiple of
    a tile, K not of a stage or a chain group, 1-8, 11 and 15 rows: vs float64, rows independent of
    M, the same bits for every shape of both kernels (NW, KC, ST, T and P do not enter a row's
    order; dev/test_gemv_variants.py adds the swept shapes, KC = 64 and 128 among them, and
    dev/kernels/gemv_tcg.cu), and the K-split counts back at zero after each launch."""
    import cupy as cp
    R = 15
    w, x, K, cases = _tiled_cases(be, rng, R)
    for epi, n, half, y_init, want in cases:
        tiled = linear.tmb_tiled(w, K, epi, half)
        first = None
        for kind, shape in [("tmb", s) for s in linear.TMB_SHAPES] + [("tmr", s) for s in linear.TMR_SHAPES]:
            def launcher(*a):
                return linear._tiled_launch(kind, shape, ks, a[0], tiled, *a[1:])
            alone = [_gemv(be, w, x[j:j + 1], n, epi, half, None if y_init is None else y_init[j:j + 1],
                           launcher=launcher)[0] for j in range(R)]
            for m in (1, 2, 3, 4, 5, 6, 7, 8, 11, R):
                y = _gemv(be, w, x[:m], n, epi, half, None if y_init is None else y_init[:m], launcher=launcher)
                assert finite(y) and rel(y, want[:m]) < F32, (epi, kind, shape, m)
                for j in range(m):
                    assert np.array_equal(y[j], alone[j]), (epi, kind, shape, m, j)
            assert int(cp.count_nonzero(linear.tmb_scratch()[1])) == 0
            if first is None:
                first = y
            assert np.array_equal(y, first), (epi, kind, shape)


@pytest.mark.parametrize("ks", linear.TMB_KSPLITS)
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gemv_tmb_row_groups(be, rng, ks):
    """gemv_tmb over several row groups a block (TMBG_SHAPES, the batch's M > 8): every row of a
    9-67-row launch, every epilogue, is bit-identical to that row launched alone on the engine's
    M = 1 kernel (gemv_tmb or gemv_tmr), and close to float64; partial row groups and row-group
    blocks included; the K-split counts back at zero."""
    import cupy as cp
    R = 67
    w, x, K, cases = _tiled_cases(be, rng, R)
    for epi, n, half, y_init, want in cases:
        tiled = linear.tmb_tiled(w, K, epi, half)
        single = linear.tmb_kernel(linear.tmb_tiles(w.shape[0], epi, half), ks, epi)

        def alone_launcher(*a):
            return linear._tiled_launch(*single, ks, a[0], tiled, *a[1:])
        alone = np.stack([_gemv(be, w, x[j:j + 1], n, epi, half, None if y_init is None else y_init[j:j + 1],
                                launcher=alone_launcher)[0] for j in range(R)])
        for shape in linear.TMBG_SHAPES:
            def launcher(*a):
                return linear._tiled_launch("tmb", shape, ks, a[0], tiled, *a[1:])
            for m in (9, 16, 17, 31, 33, 64, R):
                y = _gemv(be, w, x[:m], n, epi, half, None if y_init is None else y_init[:m], launcher=launcher)
                assert finite(y) and rel(y, want[:m]) < F32, (epi, shape, m)
                assert np.array_equal(y, alone[:m]), (epi, shape, m)
            assert int(cp.count_nonzero(linear.tmb_scratch()[1])) == 0


def test_tmbg_shape_rule():
    """The row-group kernel's shape for M rows is its pick table's (TMBG_PICK for a matrix in one K
    part, TMBG_PICK_KSPLIT for a split one) for the least M at least that, else its widest; every
    pick is compiled; every compiled tiled shape fits the shared memory one block may have, in at
    most 1024 threads."""
    from kestrel import nvrtc as L
    for ks, table in ((1, linear.TMBG_PICK), (2, linear.TMBG_PICK_KSPLIT), (3, linear.TMBG_PICK_KSPLIT)):
        pick = sorted(table.items())
        for M in (9, 16, 17, 31, 32, 33, 63, 64):
            assert linear.tmbg_shape(M, ks) == next((v for m, v in pick if M <= m), pick[-1][1]), (M, ks)
        assert linear.tmbg_shape(500, ks) == pick[-1][1]
        assert linear.tmb_kernel(100, ks, "store", 9) == ("tmb", linear.tmbg_shape(9, ks))
        assert set(table.values()) <= set(linear.TMBG_SHAPES)
    assert linear.tmbg_shape(24, 3) != linear.tmbg_shape(24, 1)   # split matrices take their own pick
    assert all(s[0] * s[3] * 32 <= 1024 for s in linear.TMBG_SHAPES)
    for s in linear.TMB_SHAPES + linear.TMBG_SHAPES:
        assert linear.tmb_smem(*s) + 1024 <= L.SMEM_MAX, s
        assert linear.TMB_CG % s[1] == 0, s


@needs_gpu
def test_tmb_kernel_rule(be):
    """blocks_per_sm agrees with the driver's occupancy query for every gemv_tmr kernel; the engine's
    pick between the two tiled kernels is a compiled shape, gemv_tmr for a few tiles, gemv_tmb for
    very many, and once it is gemv_tmb it stays so for more tiles."""
    import cupy as cp
    for (t, p) in linear.TMR_SHAPES:
        for epi in (0, 1, 2):
            fn = L.kernel("linear", f"gemv_tmr_t{t}_p{p}_e{epi}")
            want = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, 32 * (t + 1), 0)
            assert L.blocks_per_sm(fn, 32 * (t + 1)) == want >= 1, (t, p, epi)
    for ks in (1, 3):
        for epi in linear.EPI:
            picks = [linear.tmb_kernel(tiles, ks, epi) for tiles in (3, 100, 320, 1030, 2176, 15520, 10 ** 5)]
            for kind, shape in picks:
                assert shape in (linear.TMR_SHAPES if kind == "tmr" else linear.TMB_SHAPES), (kind, shape)
            kinds = [k for k, _ in picks]
            assert kinds[0] == "tmr" and kinds[-1] == "tmb", (ks, epi, kinds)
            assert kinds == sorted(kinds, key=("tmr", "tmb").index), (ks, epi, kinds)
