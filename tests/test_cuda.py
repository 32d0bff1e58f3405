"""CUDA backend (kestrel/cuda.py, kernels/*.cu) against the NumPy twins and the CPU engine.

Every test is skipped cleanly without CuPy or without a GPU. Kernel checks draw fresh random
inputs, poison every output and scratch buffer with NaN first (kestrel.cuda.POISON) and
check that every element was written. Tolerances follow the arithmetic: fp32 accumulation in
a different order than BLAS/NumPy (relative error ~1e-6 per op; 1e-4 after a whole model).
"""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
try:
    _NDEV = cp.cuda.runtime.getDeviceCount()
except Exception:  # no driver, no device
    _NDEV = 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_NDEV == 0, reason="no CUDA GPU visible to CuPy")]

import kestrel  # noqa: E402
from kestrel import backend as kbackend  # noqa: E402
from kestrel.model import Model  # noqa: E402
from kestrel.ops import attention as ops_attn  # noqa: E402
from kestrel.ops import linear as ops_linear  # noqa: E402
from kestrel.ops import mlp as ops_mlp  # noqa: E402
from kestrel.ops import norm as ops_norm  # noqa: E402
from kestrel.ops import rope as ops_rope  # noqa: E402
from kestrel.ops.gdn import GDNShape, gdn_rows  # noqa: E402
from kestrel.weights import bf16_to_f32, f32_to_bf16, random_weights  # noqa: E402

F32 = 2e-5      # one fp32 op, any summation order
MODEL = 1e-4    # a whole fp32 model, CPU vs GPU


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture(scope="module")
def be():
    from kestrel.cuda import CUDABackend
    return CUDABackend()


@pytest.fixture
def poison():
    import kestrel.cuda as kc
    old = kc.POISON
    kc.POISON = True
    yield
    kc.POISON = old


def host(x):
    return np.asarray(kestrel.to_numpy(x))


def dev(a, dtype=np.float32):
    return cp.asarray(np.ascontiguousarray(a, dtype=dtype))


def finite(x):
    return bool(np.all(np.isfinite(host(x))))


# ---- kernels vs their NumPy twins --------------------------------------------------------------
@pytest.mark.parametrize("wdtype", ["fp32", "bf16"])
@pytest.mark.parametrize("N,K", [(37, 64), (130, 96), (50, 30), (70, 4100), (300, 5120), (40, 12288)])
def test_linear_kernel(be, rng, poison, wdtype, N, K):
    """y = x·Wᵀ: vs float64 and the NumPy twin; every row of an M-row call == that row alone."""
    w32 = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    w_host = bf16_to_f32(f32_to_bf16(w32)) if wdtype == "bf16" else w32
    w = be.put_weight("w", w32, wdtype)
    assert w.dtype == (np.uint16 if wdtype == "bf16" else np.float32)
    assert np.array_equal(host(be.weight_f32(w)), w_host)
    x = rng.standard_normal((17, K)).astype(np.float32)
    alone = [host(be.linear(dev(x[j:j + 1]), w))[0] for j in range(9)]
    for m in (1, 2, 3, 4, 5, 8, 9, 17):
        y = host(be.linear(dev(x[:m]), w))
        assert y.shape == (m, N) and np.all(np.isfinite(y))
        ref = x[:m].astype(np.float64) @ w_host.T.astype(np.float64)
        assert rel(y, ref) < F32, m
        assert rel(y, ops_linear.linear(x[:m], w_host)) < F32
        for j in range(min(m, 9)):
            assert np.array_equal(y[j], alone[j]), (m, j)       # batch invariance, bit-exact


@pytest.mark.parametrize("wdtype", ["fp32", "bf16"])
def test_linear_epilogues(be, rng, poison, wdtype):
    """The fused path's epilogues: y += x·Wᵀ (residual) and SwiGLU over a stacked [gate; up]."""
    I, K, m = 72, 64, 3
    w32 = (rng.standard_normal((2 * I, K)) / 8).astype(np.float32)
    w_host = bf16_to_f32(f32_to_bf16(w32)) if wdtype == "bf16" else w32
    w = be.put_weight("w", w32, wdtype)
    x = rng.standard_normal((m, K)).astype(np.float32)
    y0 = rng.standard_normal((m, 2 * I)).astype(np.float32)
    y = dev(y0)
    be.linear_epilogue(dev(x), w, y, epi=1)
    assert rel(host(y), y0 + ops_linear.linear(x, w_host)) < F32
    act = cp.full((m, I), np.nan, np.float32)
    be.linear_epilogue(dev(x), w, act, epi=2, half=I)
    g, u = ops_linear.linear(x, w_host[:I]), ops_linear.linear(x, w_host[I:])
    assert finite(act) and rel(host(act), ops_mlp.swiglu(g, u)) < F32


def test_rmsnorm_swiglu_embed_argmax(be, rng, poison):
    x = (3 * rng.standard_normal((5, 3, 1000))).astype(np.float32)
    w = (0.2 * rng.standard_normal(1000)).astype(np.float32)
    y = host(be.rmsnorm(dev(x), dev(w), 1e-6))
    assert np.all(np.isfinite(y)) and rel(y, ops_norm.rmsnorm(x, w, 1e-6)) < F32
    g, u = rng.standard_normal((2, 7, 33)).astype(np.float32) * 4
    s = host(be.swiglu(dev(g), dev(u)))
    assert np.all(np.isfinite(s)) and rel(s, ops_mlp.swiglu(g, u)) < F32
    table = rng.standard_normal((97, 40)).astype(np.float32)
    toks = rng.integers(0, 97, 6)
    for wd in ("fp32", "bf16"):
        t = be.put_weight("e", table, wd)
        want = bf16_to_f32(f32_to_bf16(table)) if wd == "bf16" else table
        assert np.array_equal(host(be.embed(t, toks)), want[toks])
    lg = rng.standard_normal((4, 5003)).astype(np.float32)
    lg[1, [17, 4000]] = lg[1].max() + 1.0          # a tie: the first index wins, as numpy.argmax
    lg[2, 4999] = np.nan                            # NaN counts as the maximum, as numpy.argmax
    assert np.array_equal(host(be.argmax(dev(lg))), np.argmax(lg, axis=-1))
    assert int(be.argmax(dev(lg[0]))) == int(np.argmax(lg[0]))


@pytest.mark.parametrize("nh,nkv,hd,rot", [(4, 2, 16, 4), (2, 1, 32, 16), (6, 1, 256, 64)])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_attention_kernel(be, rng, poison, nh, nkv, hd, rot, m):
    """q/k norm + partial RoPE + causal attention over cache rows < pos+j+1 + sigmoid gate."""
    pos, max_seq, eps = int(rng.integers(0, 40)), 64, 1e-6
    qg = rng.standard_normal((m, nh, 2 * hd)).astype(np.float32)
    k = rng.standard_normal((m, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((m, nkv, hd)).astype(np.float32)
    qn, kn = (0.2 * rng.standard_normal((2, hd))).astype(np.float32)
    cos, sin = ops_rope.rope_tables(rot, 1e4, max_seq)
    kc0 = np.full((max_seq, nkv, hd), np.nan, np.float32)
    vc0 = kc0.copy()
    kc0[:pos] = rng.standard_normal((pos, nkv, hd))
    vc0[:pos] = rng.standard_normal((pos, nkv, hd))
    kc_cpu, vc_cpu = kc0.copy(), vc0.copy()
    want = kbackend.CPUBackend().attn_core(qg, k, v, qn, kn, cos[pos:pos + m], sin[pos:pos + m], kc_cpu, vc_cpu, pos,
                                           eps, hd ** -0.5)
    kc, vc = dev(kc0), dev(vc0)
    got = host(be.attn_core(dev(qg), dev(k), dev(v), dev(qn), dev(kn), dev(cos[pos:pos + m]), dev(sin[pos:pos + m]),
                            kc, vc, pos, eps, hd ** -0.5))
    assert np.all(np.isfinite(got)) and rel(got, want) < F32
    kc, vc = host(kc), host(vc)
    assert rel(kc[pos:pos + m], kc_cpu[pos:pos + m]) < F32 and np.array_equal(vc[pos:pos + m], vc_cpu[pos:pos + m])
    assert np.array_equal(kc[:pos], kc0[:pos]) and np.array_equal(vc[:pos], vc0[:pos])   # older rows untouched
    assert np.all(np.isnan(kc[pos + m:])) and np.all(np.isnan(vc[pos + m:]))             # rows past the batch too
    # row j alone (after rows < j appended) gives the same bits as row j of the batch
    kc1, vc1 = dev(kc0), dev(vc0)
    for j in range(m):
        p = pos + j
        r = host(be.attn_core(dev(qg[j:j + 1]), dev(k[j:j + 1]), dev(v[j:j + 1]), dev(qn), dev(kn),
                              dev(cos[p:p + 1]), dev(sin[p:p + 1]), kc1, vc1, p, eps, hd ** -0.5))
        assert np.array_equal(r[0], got[j])


@pytest.mark.parametrize("shape", [(2, 4, 16, 16, 4), (2, 2, 8, 12, 3), (2, 4, 128, 128, 4), (1, 3, 64, 32, 2)])
@pytest.mark.parametrize("m", [1, 3, 4])
@pytest.mark.parametrize("slots", [False, True])
def test_gdn_kernel(be, rng, poison, shape, m, slots):
    """conv + gates + l2norm + delta rule + gated norm for M rows; in place or per-row slots."""
    nk, nv, dk, dv, K = shape
    sh = GDNShape(nk, nv, dk, dv, K, 1e-6)
    C = sh.C
    qkv = rng.standard_normal((m, C)).astype(np.float32)
    z = rng.standard_normal((m, nv * dv)).astype(np.float32)
    b, a = rng.standard_normal((2, m, nv)).astype(np.float32)
    cw = (rng.standard_normal((C, 1, K)) / np.sqrt(K)).astype(np.float32)
    A_log = np.log(rng.uniform(1, 16, nv)).astype(np.float32)
    dt = rng.uniform(-1, 1, nv).astype(np.float32)
    nw = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
    S0 = (0.3 * rng.standard_normal((nv, dk, dv))).astype(np.float32)
    h0 = rng.standard_normal((C, K - 1)).astype(np.float32)
    S_c, h_c = S0.copy(), h0.copy()
    Ss_c = [np.full_like(S0, np.nan) for _ in range(m)] if slots else None
    hs_c = [np.full_like(h0, np.nan) for _ in range(m)] if slots else None
    want = gdn_rows(sh, qkv, z, b, a, cw.reshape(C, K), A_log, dt, nw, S_c, h_c, Ss_c, hs_c)
    S_g, h_g = dev(S0), dev(h0)
    Ss_g = [cp.full(S0.shape, np.nan, np.float32) for _ in range(m)] if slots else None
    hs_g = [cp.full(h0.shape, np.nan, np.float32) for _ in range(m)] if slots else None
    got = host(be.gdn_core(sh, dev(qkv), dev(z), dev(b), dev(a), dev(cw), dev(A_log), dev(dt), dev(nw), S_g, h_g,
                           Ss_g, hs_g))
    assert np.all(np.isfinite(got)) and rel(got, want) < F32
    if slots:
        assert np.array_equal(host(S_g), S0) and np.array_equal(host(h_g), h0)   # live state only read
        for j in range(m):
            assert finite(Ss_g[j]) and rel(host(Ss_g[j]), Ss_c[j]) < F32, j
            assert rel(host(hs_g[j]), hs_c[j]) < F32, j
    else:
        assert rel(host(S_g), S_c) < F32 and rel(host(h_g), h_c) < F32
    # the state after row j (slot j) equals the state after j+1 single-row calls, bit for bit
    if slots:
        S1, h1 = dev(S0), dev(h0)
        for j in range(m):
            r = host(be.gdn_core(sh, dev(qkv[j:j + 1]), dev(z[j:j + 1]), dev(b[j:j + 1]), dev(a[j:j + 1]), dev(cw),
                                 dev(A_log), dev(dt), dev(nw), S1, h1))
            assert np.array_equal(r[0], got[j])
            assert np.array_equal(host(S1), host(Ss_g[j])) and np.array_equal(host(h1), host(hs_g[j]))


# ---- the engine on the GPU ----------------------------------------------------------------------
PRESETS = ["test-a", "test-b"]


def models(name, dtype="fp32", seed=5):
    cpu = kestrel.load(name, device="cpu", dtype=dtype, seed=seed)
    gpu = kestrel.load(name, device="cuda", dtype=dtype, seed=seed)
    return cpu, gpu


def live(eng):
    S, h = eng.live_state()
    d = {"S": host(S).copy(), "hist": host(h).copy(), "kc": host(eng.kc[:, :eng.cursor]).copy(),
         "vc": host(eng.vc[:, :eng.cursor]).copy(), "pos": eng.cursor, "mtp_len": eng.mtp_cursor}
    if eng.model.has_mtp:
        d["mtp_kc"] = host(eng.mtp_kc[:eng.mtp_cursor]).copy()
        d["mtp_vc"] = host(eng.mtp_vc[:eng.mtp_cursor]).copy()
    return d


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_load_cuda_same_weights_as_cpu():
    for dtype in ("fp32", "bf16"):
        cpu, gpu = models("test-a", dtype)
        assert gpu.be.name == "cuda" and "cuda" in kestrel.load("test-b", device="auto").be.name
        for n, w in cpu.w.items():
            assert np.array_equal(host(gpu.be.weight_f32(gpu.w[n])), w), n


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpu_engine_vs_cpu_engine(name, dtype, rng):
    """Prefill + greedy decode: hidden/logits close to the CPU engine, the same token stream."""
    cpu, gpu = models(name, dtype)
    V = cpu.cfg.vocab_size
    prompt = rng.integers(0, V, 7).tolist()
    ec, eg = kestrel.Engine(cpu, max_seq=64, mmax=4), kestrel.Engine(gpu, max_seq=64, mmax=4)
    sc, sg = ec.prefill(prompt), eg.prefill(prompt)
    assert rel(host(sg.hidden), sc.hidden) < MODEL and rel(host(sg.logits), sc.logits) < MODEL
    lc, lg = sc.logits[-1], host(sg.logits)[-1]
    for i in range(32):
        tc, tg = int(np.argmax(lc)), int(np.argmax(lg))
        top2 = np.sort(lc)[-2:]
        assert tc == tg, f"greedy streams diverge at generated token {i} (position {ec.cursor}): " \
                         f"CPU {tc} vs GPU {tg}, CPU top-2 logit gap {top2[1] - top2[0]:.3g}"
        sc, sg = ec.step(ec.cursor, tc), eg.step(eg.cursor, tg)
        assert rel(host(sg.hidden), sc.hidden) < MODEL and rel(host(sg.logits), sc.logits) < MODEL, i
        lc, lg = sc.logits, host(sg.logits)
    assert gpu.be.stats["graphs_captured"] > 0 and not gpu.be.stats["graph_errors"]


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpu_batch_invariance(name, dtype, rng):
    """Row j of step_m(M) == the j-th of M steps, bit for bit: hidden, logits and state (M=1..4)."""
    gpu = kestrel.load(name, device="cuda", dtype=dtype, seed=3)
    V = gpu.cfg.vocab_size
    for m in range(1, 5):
        prompt = rng.integers(0, V, int(rng.integers(1, 9))).tolist()
        toks = rng.integers(0, V, m).tolist()
        for rep in range(2):        # the second round replays the captured graphs
            a, b = kestrel.Engine(gpu, max_seq=64, mmax=4), kestrel.Engine(gpu, max_seq=64, mmax=4)
            a.prefill(prompt)
            b.prefill(prompt)
            sa = a.step_m(len(prompt), toks)
            rows = [b.step(len(prompt) + j, t) for j, t in enumerate(toks)]
            assert np.array_equal(host(sa.hidden), np.stack([host(r.hidden) for r in rows])), (m, rep)
            assert np.array_equal(host(sa.logits), np.stack([host(r.logits) for r in rows])), (m, rep)
            assert_same(live(a), live(b))


@pytest.mark.parametrize("name", PRESETS)
def test_fused_plan_equals_op_by_op(name, rng):
    """The fused, graph-replayed plan computes exactly what the generic forward computes on the
    same kernels one op at a time (catches any wiring error of the plan)."""
    from kestrel.cuda import CUDABackend
    cfg = kestrel.PRESETS[name]
    t = random_weights(cfg, 9)
    fused = Model(cfg, t, CUDABackend(), weight_dtype="bf16")
    plain = Model(cfg, t, CUDABackend(fused=False), weight_dtype="bf16")
    V, D = cfg.vocab_size, cfg.hidden_size
    prompt = rng.integers(0, V, 5).tolist()
    ea, eb = kestrel.Engine(fused, max_seq=64, mmax=3), kestrel.Engine(plain, max_seq=64, mmax=3)
    outs = []
    for e in (ea, eb):
        s = e.prefill(prompt)
        r = [s.logits]
        for i in range(4):
            r.append(e.step(e.cursor, int(prompt[i])).logits)
        r.append(e.step_m(e.cursor, prompt[:3]).logits)
        r.append(e.verify_checkpointed(e.cursor, prompt[1:4]).logits)
        e.select_checkpoint(2)
        m = e.mtp_step(0, prompt, s.hidden)
        r += [m.hidden, m.logits, e.mtp_step(5, 7, m.hidden[-1]).logits]
        outs.append([host(x) for x in r] + [v for v in live(e).values() if isinstance(v, np.ndarray)])
    for x, y in zip(*outs):
        assert np.array_equal(x, y)
    assert fused.be.stats["graph_replays"] > 0


@pytest.mark.parametrize("name", PRESETS)
def test_primitives_bit_exact_on_gpu(name, rng):
    """mark/rollback restore S/hist/cursors exactly; replaying after a rollback reproduces the
    same bits; mtp_truncate rewinds the MTP slot with no copy."""
    gpu = kestrel.load(name, device="cuda", dtype="bf16", seed=4)
    V = gpu.cfg.vocab_size
    e = kestrel.Engine(gpu, max_seq=64, mmax=3, batch="flex")
    s = e.prefill(rng.integers(0, V, 6).tolist())
    e.mtp_step(0, rng.integers(0, V, 6), s.hidden)
    before = live(e)
    e.mark()
    toks = rng.integers(0, V, 3).tolist()
    r1 = e.step_m(6, toks)
    m1 = e.mtp_step(6, toks[0], r1.hidden[0])
    e.step(9, 5)
    e.rollback()
    assert_same(live(e), before)
    e.mark()
    r2 = e.step_m(6, toks)
    m2 = e.mtp_step(6, toks[0], r2.hidden[0])
    assert np.array_equal(host(r1.logits), host(r2.logits)) and np.array_equal(host(m1.logits), host(m2.logits))
    e.rollback()
    assert_same(live(e), before)
    with pytest.raises(kestrel.SnapshotError):
        e.rollback()
    e.mtp_step(6, 3, r2.hidden[0])
    e.mtp_step(7, 4, r2.hidden[1])
    e.mark()
    e.mtp_truncate(6)
    assert e.mtp_cursor == 6 and not e.has_snapshot
    m3 = e.mtp_step(6, toks[0], r2.hidden[0])
    assert np.array_equal(host(m3.logits), host(m1.logits))


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("m", [1, 3, 4])
def test_verify_checkpointed_gpu(name, m, rng):
    """verify_checkpointed + select_checkpoint(n): equal to n successive steps exactly on the GPU,
    and close to the same calls on the CPU."""
    cpu, gpu = models(name, "fp32", seed=6)
    V = cpu.cfg.vocab_size
    prompt = rng.integers(0, V, 5).tolist()
    toks = rng.integers(0, V, m).tolist()
    ref = kestrel.Engine(gpu, max_seq=64, mmax=4)
    ref.prefill(prompt)
    rows, states = [], []
    for j in range(m):
        rows.append(ref.step(5 + j, toks[j]))
        states.append(live(ref))
    for n in range(m + 1):
        eg, ec = kestrel.Engine(gpu, max_seq=64, mmax=4), kestrel.Engine(cpu, max_seq=64, mmax=4)
        eg.prefill(prompt)
        ec.prefill(prompt)
        before = live(eg)
        sg, sc = eg.verify_checkpointed(5, toks), ec.verify_checkpointed(5, toks)
        assert np.array_equal(host(sg.logits), np.stack([host(r.logits) for r in rows]))
        assert np.array_equal(host(sg.hidden), np.stack([host(r.hidden) for r in rows]))
        assert rel(host(sg.logits), sc.logits) < MODEL
        eg.select_checkpoint(n)
        ec.select_checkpoint(n)
        assert_same(live(eg), before if n == 0 else states[n - 1])
        Sg, hg = eg.live_state()
        Sc, hc = ec.live_state()
        assert rel(host(Sg), Sc) < MODEL and rel(host(hg), hc) < MODEL
        nxt = int(rng.integers(0, V))
        assert rel(host(eg.step(5 + n, nxt).logits), ec.step(5 + n, nxt).logits) < MODEL


def test_random_model_on_gpu_families():
    """Large presets draw on the GPU: same families as random_weights (not the same numbers)."""
    from kestrel.cuda import CUDABackend
    be = CUDABackend()
    cfg = kestrel.PRESETS["test-a"]
    m = be.random_model(cfg, seed=1, dtype="bf16", gpu_draw=True)
    ref = random_weights(cfg, 1)
    for n, w in ref.items():
        g = host(be.weight_f32(m.w[n]))
        assert g.shape == w.shape and np.all(np.isfinite(g)), n
        assert (m.w[n].dtype == np.uint16) == (w.ndim == 2), n
        if w.size >= 2000:
            assert abs(g.std() / w.std() - 1) < 0.1 and abs(g.mean() - w.mean()) < 0.1 * w.std() + 0.02, n
    e = kestrel.Engine(m, max_seq=32, mmax=2)
    s = e.prefill([1, 2, 3])
    assert np.all(np.isfinite(host(s.logits)))


def test_pdl_graphs_bit_exact():
    """Graphs captured with programmatic dependent launch compute the same bits as without."""
    from kestrel.cuda import CUDABackend, pdl_selftest
    if not CUDABackend().pdl:
        pytest.skip("programmatic dependent launch is off (KESTREL_PDL=0 or a pre-Hopper GPU)")
    assert pdl_selftest()


def test_tiny_six_starts_on_gpu_match_cpu_and_the_record():
    """The embedded model in float32 on the GPU: the six starts' greedy streams equal the CPU's and
    the completions transformers produced at training time. A flip would be reported with its
    position and the CPU logit gap there."""
    import json
    gpu = kestrel.load("tiny", device="cuda")
    cpu = kestrel.load("tiny", device="cpu")
    record = json.loads((kestrel.ASSETS / "tiny" / "training_record.json").read_text())
    for c in record["completions"]:
        prompt = cpu.tokenizer.encode(c["start"])
        g = kestrel.generate(gpu, prompt, 64)
        if g != c["completion_bytes"]:
            i = next(j for j, (a, b) in enumerate(zip(g, c["completion_bytes"])) if a != b)
            lg = kestrel.Engine(cpu, max_seq=128).prefill(prompt + c["completion_bytes"][:i]).logits[-1]
            top = np.sort(lg)[-2:]
            pytest.fail(f"start {c['start']!r}: GPU stream leaves the record at byte {i} (CPU top-2 logit gap {top[1] - top[0]:.3g})")
        assert kestrel.generate(cpu, prompt, 64) == g
