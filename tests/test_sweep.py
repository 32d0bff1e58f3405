"""The sweep over sizes and k (kestrel.lab.sweep) and its roofline, on the CPU test shapes."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import kestrel
from kestrel.lab import results
from kestrel import speculative as spec
from kestrel.program import expected_shapes
from kestrel.lab import sweep
from kestrel.program import param_count

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def swept():
    return sweep.size_sweep(["test-a", "test-b"], T=12, P=8, device="cpu", reps=2, repeats=1)


def test_sweep_has_one_row_per_size_and_k(swept):
    json.dumps(swept)                                   # plain data, as the results file stores it
    rows = sweep.rows(results.live_sweep(swept))
    assert [(r["preset"], r["k"]) for r in rows] == [(p, k) for p in ("test-a", "test-b") for k in (1, 2, 3, 4)]
    for r in rows:
        assert r["ms_per_token"] > 0 and r["greedy_ms_per_token"] > 0 and r["speedup"] > 0
        assert r["bit_exact"] is True
        assert r["policy"] == "checkpoint" and r["pairing"] == "trained"
        lo, hi = r["ms_per_token_range"]
        assert lo <= r["ms_per_token"] <= hi
    # the trained pairing's d_1 is free: k = 1 advances exactly one token a round, deeper k more
    adv = {r["k"]: r["advance_per_round"] for r in rows if r["preset"] == "test-a"}
    assert adv[1] == 1.0 and adv[4] > adv[1]
    assert swept["bandwidth_Bps"] > 0 and swept["launch_ms_per_kernel"] >= 0


def _weights_read(cfg, dtype):
    """Every main-model weight once; a vector in fp32, a matrix in dtype; an untied embedding
    table is looked up (one row), not read."""
    n = 0
    for name, shape in expected_shapes(cfg).items():
        if name.startswith("mtp."):
            continue
        size = 2 if dtype == "bf16" and len(shape) == 2 else 4     # the table's dtype, a row of it
        if name == "embed_tokens.weight" and not cfg.tie_word_embeddings:
            shape = shape[1:]
        n += math.prod(shape) * size
    return n


@pytest.mark.parametrize("preset", ["test-a", "test-b", "qwen3.5-0.8b", "qwen3.5-27b"])
def test_roofline_floor_is_the_weight_bytes(preset):
    cfg = kestrel.preset(preset)
    dtype = sweep.native_dtype(preset)
    r = sweep.roofline(cfg, dtype=dtype, bandwidth=4e12, launch_ms_per_kernel=0.003)
    assert r["weight_bytes"] == _weights_read(cfg, dtype)
    if dtype == "bf16" and cfg.tie_word_embeddings:      # tied: every parameter is read
        vec = sum(math.prod(s) for n, s in expected_shapes(cfg).items()      # vectors, conv kernels: fp32
                  if len(s) != 2 and not n.startswith("mtp."))
        assert r["weight_bytes"] == 2 * param_count(cfg, mtp=False) + 2 * vec
    assert r["floor_ms"] == pytest.approx(r["weight_bytes"] / 4e12 * 1e3)
    assert r["launch_ms"] == pytest.approx(r["kernels_per_step"] * 0.003)
    gdn, attn = len(cfg.gdn_layers), len(cfg.attn_layers)
    assert r["kernels_per_step"] > 2 * (gdn + attn)


def test_roofline_names_the_regimes():
    """At a GPU's bandwidth and a few microseconds a launch, the embedded model is launch-bound
    and the 27B shape bandwidth-bound (its floor is hundreds of times its launches' cost)."""
    tiny = sweep.roofline(sweep.config_of("tiny"), dtype="fp32", bandwidth=4e12, launch_ms_per_kernel=0.003)
    big = sweep.roofline(kestrel.preset("qwen3.5-27b"), dtype="bf16", bandwidth=4e12, launch_ms_per_kernel=0.003)
    assert tiny["bound"] == "launch" and big["bound"] == "bandwidth"
    assert big["floor_ms"] > 5 * big["launch_ms"] and tiny["launch_ms"] > 5 * tiny["floor_ms"]


def test_roofline_matches_the_engine_benchmark():
    """The recorded engine benchmark counts the same floor bytes and, where it broke a step
    down, the same kernel launches as the roofline computes from the config."""
    path = results.RESULTS / "bench_engine.json"
    if not path.exists():
        pytest.skip("results/bench_engine.json is not there")
    d = json.loads(path.read_text())          # the raw file: its step breakdown is no record's field
    checked = 0
    for p in d["presets"]:
        name = p["preset"]
        cfg = sweep.config_of(name)
        r = sweep.roofline(cfg, dtype=p["dtype"], bandwidth=1e12, launch_ms_per_kernel=0.0)
        assert r["weight_bytes"] == p["floor_bytes"], name
        b = p.get("breakdown")
        if b:
            import ast
            b = ast.literal_eval(b) if isinstance(b, str) else b
            assert b["step1"]["launches"] == r["kernels_per_step"], name
        checked += 1
    assert checked >= 3


def test_launch_cost_is_the_smallest_leftover_per_kernel(swept):
    sizes = swept["sizes"]
    per = [(s["units"]["step"] - s["floor_ms"]) / s["kernels_per_step"] for s in sizes]
    assert swept["launch_ms_per_kernel"] == pytest.approx(max(min(per), 0.0))
    for s in sizes:
        r = s["roofline"]
        assert r["step_ms"] == s["units"]["step"] and r["bound"] in ("launch", "bandwidth")
        assert set(r["verify_over_step"]) == {1, 2, 3, 4}


def test_sections_without_a_gpu_say_where_they_come_from():
    ok, why = sweep.gpu_fits(["qwen3.5-27b"])
    if ok:
        pytest.skip("a GPU here holds the 27B shape: the sections run live")
    assert why
    here, skipped = sweep.runnable(sweep.SIZE_PRESETS + sweep.QUICK_PRESETS, device="cpu")
    assert "tiny" in here and "test-a" in here and "qwen3.5-27b" not in here
    assert {p for p, _ in skipped} == {"qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b"}
    default = results.of_default_engine("bench_spec")
    assert sweep.recorded_files() == (default, "bench_spec") and default == "bench_spec_tmb"
    try:
        results.load(default)
    except results.ResultsFileError:
        pytest.skip(f"results/{default}.json is not there")
    big = sweep.large_section()       # the default engine's runs
    assert not big.live and big.data.model == "qwen3.5-27b" and big.file == default
    assert big.source.startswith(f"read from results/{default}.json: measured on ") and not big.note
    # a section the default engine's file lacks is read from the fma file, and the line says so
    sizes = sweep.size_section()
    if results.load_spec(default).sweep is None:
        assert sizes.file == "bench_spec" and f"results/{default}.json (the default engine's) has no " \
            "size sweep" in sizes.source and sizes.source.startswith("read from results/bench_spec.json")
    else:
        assert sizes.file == default and not sizes.note


def test_beats_greedy_reads_the_rows(swept):
    best = sweep.beats_greedy(results.live_sweep(swept))
    assert set(best) == {"test-a", "test-b"}
    for s in swept["sizes"]:
        top = max(r["speedup"] for r in s["runs"])
        assert (best[s["preset"]] is not None) == (top > 1)


def test_bench_script_quick_writes_the_sweep(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_spec.py"), "--quick", "--skip-tiny", "--out", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = json.loads((tmp_path / "bench_spec_quick.json").read_text())
    assert "sweep" in d and "large" in d and "tiny" not in d
    w = d["sweep"]
    assert [s["preset"] for s in w["sizes"]] == list(sweep.QUICK_PRESETS)
    assert all(r["bit_exact"] for s in w["sizes"] for r in s["runs"])
    assert all(len(s["runs"]) == 4 and s["roofline"]["bound"] in ("launch", "bandwidth") for s in w["sizes"])
    for r in d["large"]["runs"]:                     # part (b): medians with their range
        assert r["repeats"] == 1
        assert r["ms_per_token_range"][0] <= r["ms_per_token"] <= r["ms_per_token_range"][1]
        assert r["speedup_range"][0] <= r["speedup"] <= r["speedup_range"][1]
        spec.RunSummary.from_dict(r)
    md = (tmp_path / "bench_spec_quick.md").read_text()
    assert "## (d) every size" in md and "| test-a |" in md and "launch" in md
    # --skip-sweep leaves the section out
    p = subprocess.run(cmd + ["--skip-large", "--skip-sweep"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0
    assert "sweep" not in json.loads((tmp_path / "bench_spec_quick.json").read_text())


def _replay_plan_traffic(monkeypatch, size: int, T: int = 24) -> dict:
    """The speculative benchmark's large runs on test-a, with the CUDA backend's plan cache
    (kestrel/cuda/cache.py) replayed around the CPU backend: every program run of at most
    GRAPH_MAX_ROWS rows looks its plan up by (program, rows, GDN mode, engine state) in a
    PlanCache of `size`; a miss counts a lowering, a cached plan's second use a capture.
    -> the runs' rows, with plans_lowered_or_captured_while_timed as on a GPU."""
    from kestrel.backend import CPUBackend
    from kestrel.cuda.cache import GRAPH_MAX_ROWS, PlanCache
    model = kestrel.load("test-a", device="cpu", seed=3)
    cache, stats = PlanCache(size), {"plans_lowered": 0, "graphs_captured": 0}
    model.be.stats = stats
    run, fold = CPUBackend.run, CPUBackend.fold

    def use(prog, st, m, mode):
        if m > GRAPH_MAX_ROWS:
            return
        plan, made = cache.get_or_make((prog.name, m, mode, id(st.S)), lambda: {"uses": 0})
        stats["plans_lowered"] += made
        plan["uses"] += 1
        stats["graphs_captured"] += plan["uses"] == 2

    def traced_run(be, model, prog, st, tokens, pos, hid=None, gdn_mode="in_place"):
        use(prog, st, len(tokens), gdn_mode)
        return run(be, model, prog, st, tokens, pos, hid, gdn_mode)

    def traced_fold(be, model, prog, st, n):
        use(prog, st, n, "in_place")
        return fold(be, model, prog, st, n)

    monkeypatch.setattr(CPUBackend, "run", traced_run)
    monkeypatch.setattr(CPUBackend, "fold", traced_fold)
    out = sweep.large_runs(model, T=T, P=8, repeats=1, reps=1)
    assert stats["plans_lowered"] > 0 and stats["graphs_captured"] > 0
    return out["runs"]


def test_timed_runs_lower_and_capture_no_plan(monkeypatch):
    """The large runs' warm-up (each run twice, in full) leaves every plan their timed repeats
    use lowered and captured in the backend's cache; with the 48 plans the cache used to keep,
    the timed runs re-lowered some (so the replay can tell the two apart)."""
    from kestrel.cuda.cache import PLAN_CACHE
    rows = _replay_plan_traffic(monkeypatch, size=PLAN_CACHE)
    assert {r["schedule"] for r in rows} == {s[0] for s in sweep.LARGE_SCHEDULES}
    assert [r["plans_lowered_or_captured_while_timed"] for r in rows] == [0] * len(rows)
    rows = _replay_plan_traffic(monkeypatch, size=48)
    assert sum(r["plans_lowered_or_captured_while_timed"] for r in rows) > 0
