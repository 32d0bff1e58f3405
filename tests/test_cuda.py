"""The CUDA backend (kestrel/cuda/) as a whole against the CPU engine: lowered plans, graphs,
programmatic dependent launch, batch invariance, the primitives and per-row checkpoints.
Each kernel against its NumPy twin is tested beside its op, in tests/ops/test_<op>.py.

Every test is skipped cleanly without CuPy or without a GPU. Tolerances follow the arithmetic:
fp32 accumulation in a different order than BLAS/NumPy (1e-4 relative after a whole model);
everything that must be bit-exact is compared with array_equal.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
try:
    _NDEV = cp.cuda.runtime.getDeviceCount()
except Exception:  # no driver, no device
    _NDEV = 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_NDEV == 0, reason="no CUDA GPU visible to CuPy")]

import kestrel  # noqa: E402
from conftest import draft_both_ways, mtp_rows_both_ways, verify_fed_both_ways  # noqa: E402
from gpu import MODEL, host, rel  # noqa: E402
from kestrel.model import Model  # noqa: E402
from kestrel.weights import random_weights  # noqa: E402

PRESETS = ["test-a", "test-b"]


def models(name, dtype="fp32", seed=5, kernels=None):
    cpu = kestrel.load(name, device="cpu", dtype=dtype, seed=seed)
    gpu = kestrel.load(name, device="cuda", dtype=dtype, seed=seed, kernels=kernels)
    return cpu, gpu


def live(eng):
    S, h = eng.live_state()
    d = {"S": host(S).copy(), "hist": host(h).copy(), "kc": host(eng.state.kc[:, :eng.cursor]).copy(),
         "vc": host(eng.state.vc[:, :eng.cursor]).copy(), "pos": eng.cursor, "mtp_len": eng.mtp_cursor}
    if eng.model.has_mtp:
        d["mtp_kc"] = host(eng.state.mtp_kc[:eng.mtp_cursor]).copy()
        d["mtp_vc"] = host(eng.state.mtp_vc[:eng.mtp_cursor]).copy()
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
    """The plan with stacked projections, epilogues, graphs and programmatic dependent launch
    computes exactly what one eager launch per weight computes (catches a wiring error of the
    stacks or of graph capture)."""
    from kestrel.cuda import CUDABackend
    cfg = kestrel.PRESETS[name]
    t = random_weights(cfg, 9)
    fused = Model(cfg, t, CUDABackend(), weight_dtype="bf16")
    plain = Model(cfg, t, CUDABackend(use_graphs=False, stack_projections=False), weight_dtype="bf16")
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
    assert fused.be.stats["graph_replays"] > 0 and plain.be.stats["graph_replays"] == 0


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


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", PRESETS)
def test_mtp_fill_gpu(name, dtype, rng):
    """mtp_fill's plan (the MTP program cut after its attention) writes the MTP KV rows bit for
    bit as mtp_step's does (M = 5, 1 and 3 at start rows 0, 4 and 5), graph replay included, and the
    next MTP step's logits after either are the same bits."""
    gpu = kestrel.load(name, device="cuda", dtype=dtype, seed=6)
    V, D = gpu.cfg.vocab_size, gpu.cfg.hidden_size
    prompt = rng.integers(0, V, 10).tolist()
    for q, m in ((0, 5), (4, 1), (5, 3)):
        hid = rng.standard_normal((m, D)).astype(np.float32)
        toks = rng.integers(0, V, m).tolist()
        engines = mtp_rows_both_ways(gpu, prompt, q, toks, hid, calls=2)
        got = [(live(e), host(e.mtp_step(q + m, 3, hid[-1]).logits)) for e in engines.values()]
        assert_same(got[0][0], got[1][0])
        assert np.array_equal(got[0][1], got[1][1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", PRESETS)
def test_mtp_draft_gpu(name, dtype, rng):
    """The device draft chain (argmax, feed, hidden and position moved between graph replays
    on the device) leaves every buffer bit-identical to k mtp_step calls fed from the host, with
    the same drafts and hiddens; forced tokens too; fill rows in the first pass (an M = m+1 plan)
    against an mtp_fill before the steps; graph replay included (calls=2)."""
    gpu = kestrel.load(name, device="cuda", dtype=dtype, seed=6)
    V, D = gpu.cfg.vocab_size, gpu.cfg.hidden_size
    prompt = rng.integers(0, V, 10).tolist()
    for q, k, forced, m in ((0, 1, False, 0), (4, 4, False, 0), (9, 3, True, 0), (0, 1, False, 2), (3, 3, False, 3),
                            (5, 2, True, 1)):
        h = gpu.be.asarray(rng.standard_normal(D).astype(np.float32))
        f = rng.integers(0, V, k).tolist() if forced else None
        fill = (rng.integers(0, V, m).tolist(), gpu.be.asarray(rng.standard_normal((m, D)).astype(np.float32))) if m else None
        got = draft_both_ways(gpu, prompt, q, int(rng.integers(0, V)), h, k, forced=f, calls=2, fill=fill)
        (ea, ta, ha), (eb, tb, hb) = got["mtp_draft"], got["mtp_step"]
        assert ta == tb and np.array_equal(ha, hb)
        assert ea.mtp_cursor == eb.mtp_cursor == q + m + k
        assert_same(live(ea), live(eb))
        a, b = ea.snapshot_state(), eb.snapshot_state()
        for key in a:
            assert np.array_equal(a[key], b[key]) if isinstance(a[key], np.ndarray) else a[key] == b[key], key


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("entry", ["verify_checkpointed", "verify_cached", "step_m"])
def test_verify_fed_a_draft_feed_gpu(entry, dtype, rng):
    """A verify fed draft.feed(head) takes the drafted tokens device to device (the host never
    read them): same rows and state, bit for bit, as the verify fed them as a list."""
    gpu = kestrel.load("test-a", device="cuda", dtype=dtype, seed=8)
    V, D = gpu.cfg.vocab_size, gpu.cfg.hidden_size
    prompt = rng.integers(0, V, 9).tolist()
    for head, k in (((), 3), ((int(rng.integers(0, V)),), 3), ((int(rng.integers(0, V)),), 1)):
        h = gpu.be.asarray(rng.standard_normal(D).astype(np.float32))
        (ea, sa, ta), (eb, sb, tb) = verify_fed_both_ways(gpu, prompt, head, int(rng.integers(0, V)), h, k, entry)
        assert ta == tb
        assert np.array_equal(host(sa.logits), host(sb.logits)) and np.array_equal(host(sa.hidden), host(sb.hidden))
        a, b = ea.snapshot_state(), eb.snapshot_state()
        for key in a:
            assert np.array_equal(a[key], b[key]) if isinstance(a[key], np.ndarray) else a[key] == b[key], key


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


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_verify_cached_fold_gpu(name, dtype, rng):
    """verify_cached rows == plain steps and the live state only read; fold_cached(n) leaves the
    state of n plain steps bit for bit (graphs replayed on the second pass), close to the CPU."""
    cpu, gpu = models(name, dtype, seed=8)
    V = cpu.cfg.vocab_size
    prompt = rng.integers(0, V, 5).tolist()
    toks = rng.integers(0, V, 4).tolist()
    ref = kestrel.Engine(gpu, max_seq=64, mmax=4)
    ref.prefill(prompt)
    rows, states = [], []
    for j in range(4):
        rows.append(ref.step(5 + j, toks[j]))
        states.append(live(ref))
    for rep in range(2):
        for n in range(5):
            eg, ec = kestrel.Engine(gpu, max_seq=64, mmax=4), kestrel.Engine(cpu, max_seq=64, mmax=4)
            eg.prefill(prompt)
            ec.prefill(prompt)
            before = live(eg)
            sg, sc = eg.verify_cached(5, toks), ec.verify_cached(5, toks)
            assert np.array_equal(host(sg.logits), np.stack([host(r.logits) for r in rows])), (rep, n)
            assert rel(host(sg.logits), sc.logits) < MODEL
            S, h = eg.live_state()
            assert np.array_equal(host(S), before["S"]) and np.array_equal(host(h), before["hist"])
            eg.fold_cached(n)
            ec.fold_cached(n)
            assert_same(live(eg), before if n == 0 else states[n - 1])
            Sg, _ = eg.live_state()
            Sc, _ = ec.live_state()
            assert rel(host(Sg), Sc) < MODEL
    assert gpu.be.stats["graphs_captured"] > 0 and not gpu.be.stats["graph_errors"]


def test_random_model_on_gpu_families():
    """Large presets draw on the GPU: same families as random_weights (not the same numbers)."""
    from kestrel.cuda import CUDABackend
    be = CUDABackend()
    cfg = kestrel.PRESETS["test-a"]
    tensors, stacks, _ = be.random_weights(cfg, seed=1, dtype="bf16", gpu_draw=True)
    m = kestrel.Model(cfg, tensors, be, weight_dtype="bf16", stacks=stacks)
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
    import subprocess
    from kestrel.cuda import CUDABackend
    if not CUDABackend().pdl:
        pytest.skip("programmatic dependent launch is off (KESTREL_PDL=0 or a pre-Hopper GPU)")
    script = Path(__file__).resolve().parents[1] / "scripts" / "pdl_selftest.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)   # its own process
    assert r.returncode == 0, r.stdout + r.stderr


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


def test_tmb_engine(rng):
    """The engine on the tiled-weight tensor-core GEMVs (kernels={"gemv": "tmb"}): its plans
    launch gemv_tmb or gemv_tmr and never the CUDA-core bf16 GEMV, the rows of step_m equal single steps bit for bit, and greedy decoding keeps
    the CPU engine's stream."""
    from kestrel.ops import linear
    if linear._device()["cc"] < 90:
        pytest.skip("gemv_tmb needs bulk copies (sm_90)")
    cpu, gpu = models("test-a", "bf16", seed=4, kernels={"gemv": "tmb"})
    assert gpu.be.kernels.gemv == "tmb"
    V = cpu.cfg.vocab_size
    prompt = rng.integers(0, V, 6).tolist()
    toks = rng.integers(0, V, 4).tolist()
    a, b = kestrel.Engine(gpu, max_seq=64, mmax=4), kestrel.Engine(gpu, max_seq=64, mmax=4)
    a.prefill(prompt)
    b.prefill(prompt)
    sa = a.step_m(len(prompt), toks)
    rows = [b.step(len(prompt) + j, t) for j, t in enumerate(toks)]
    assert np.array_equal(host(sa.logits), np.stack([host(r.logits) for r in rows]))
    assert_same(live(a), live(b))
    names = {getattr(fn, "name", "") for p in gpu.be.plans(gpu).values() for fn, *_ in p.launches}
    assert any(n.startswith(("gemv_tmb", "gemv_tmr")) for n in names) and not any(n.startswith("gemv_bf16") for n in names)
    ec, eg = kestrel.Engine(cpu, max_seq=64, mmax=4), kestrel.Engine(gpu, max_seq=64, mmax=4)
    sc, sg = ec.prefill(prompt), eg.prefill(prompt)
    lc, lg = sc.logits[-1], host(sg.logits)[-1]
    for i in range(16):
        tc, tg = int(np.argmax(lc)), int(np.argmax(lg))
        assert tc == tg, i
        sc, sg = ec.step(ec.cursor, tc), eg.step(eg.cursor, tg)
        lc, lg = sc.logits, host(sg.logits)
        assert rel(lg, lc) < MODEL, i


@pytest.mark.parametrize("name", PRESETS)
def test_tiled_only_engine(name, rng):
    """kernels={"gemv": "tmb", "tiled_only": True}: the same bits as the tmb engine that keeps the
    originals (steps, a checkpointed verify, the states), every matrix it tiled is dropped from the
    model (a linear.TiledOnly that refuses to be read; the tied embedding keeps its rows), and the device memory held is
    smaller by about the dropped matrices' size."""
    import gc
    from kestrel.ops import linear
    if linear._device()["cc"] < 90:
        pytest.skip("gemv_tmb needs bulk copies (sm_90)")
    V = kestrel.preset(name).vocab_size
    prompt, toks = rng.integers(0, V, 7).tolist(), rng.integers(0, V, 3).tolist()
    seed = int(rng.integers(0, 2 ** 31))
    pool = cp.get_default_memory_pool()

    def run(tiled_only):
        gc.collect()
        used0 = pool.used_bytes()
        m = kestrel.load(name, device="cuda", dtype="bf16", seed=seed,
                         kernels={"gemv": "tmb", "tiled_only": tiled_only})
        e = kestrel.Engine(m, max_seq=64, mmax=4)
        out = [host(e.prefill(prompt).logits)]
        out += [host(e.step(e.cursor, t).logits) for t in toks]
        out.append(host(e.verify_checkpointed(e.cursor, toks).logits))
        gc.collect()
        return m, e, out, pool.used_bytes() - used0

    ma, ea, oa, used_a = run(False)
    mb, eb, ob, used_b = run(True)
    assert mb.be.kernels.tiled_only and not ma.be.kernels.tiled_only
    for x, y in zip(oa, ob):
        assert np.array_equal(x, y)
    assert_same(live(ea), live(eb))
    dropped = [n for n, a in mb.w.items() if isinstance(a, linear.TiledOnly)]
    assert dropped, "no matrix was dropped"
    assert not any(isinstance(a, linear.TiledOnly) for a in ma.w.values())
    assert isinstance(mb.w["embed_tokens.weight"], cp.ndarray)
    for n in dropped:
        with pytest.raises(ValueError, match="tiled copy"):
            mb.be.to_numpy(mb.w[n])
    drop_bytes = sum(2 * int(np.prod(ma.w[n].shape)) for n in dropped)
    assert used_b <= used_a - 0.9 * drop_bytes, (used_a, used_b, drop_bytes)
