"""The committed results tables are what their scripts render from the committed results files,
so a table cannot drift from its measurements (or be edited by hand); and the benchmark scripts'
writers run here, on the CPU backend, where the script allows it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kestrel import settings
from kestrel.lab import results

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("stem", ["bench_projections", "bench_projections_sweep"])
def test_bench_projections_table_is_rendered_from_its_json(tmp_path, stem):
    r = subprocess.run([sys.executable, str(ROOT / "dev" / "bench_projections.py"), "--render",
                        str(ROOT / "results" / f"{stem}.json"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "bench_projections.md").read_text() == (ROOT / "results" / f"{stem}.md").read_text()


def test_bench_gdn_table_is_rendered_from_its_json(tmp_path):
    """scripts/bench_gdn.py's table from the committed results file; and the file says that each
    register kernel matched gdn_recur bit for bit on the device it ran on."""
    import json
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_gdn.py"), "--render",
                        str(ROOT / "results" / "bench_gdn.json"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "bench_gdn.md").read_text() == (ROOT / "results" / "bench_gdn.md").read_text()
    R = json.loads((ROOT / "results" / "bench_gdn.json").read_text())
    assert R["presets"] and all(all(P["bit_identical"].values()) and set(P["bit_identical"]) == {"cluster", "regs"}
                                for P in R["presets"])


def test_bench_engine_tables_are_rendered_from_their_json(tmp_path):
    """scripts/bench_engine.py's writer names its files by results.stem (bench_engine under the
    default GEMV, bench_engine_tmb under gemv=tmb) and writes the committed tables."""
    import json
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_engine
    for kernels, stem in ((None, "bench_engine"), ({"gemv": "tmb"}, "bench_engine_tmb")):
        committed = ROOT / "results" / f"{stem}.json"
        prov = results.load_engine(committed).provenance
        path = bench_engine.save_results(tmp_path, bench_engine.from_json(json.loads(committed.read_text())),
                                         prov, kernels)
        assert path == tmp_path / f"{stem}.json" and path.read_text() == committed.read_text()
        assert path.with_suffix(".md").read_text() == committed.with_suffix(".md").read_text()


def test_projection_uses_account_for_a_steps_weights():
    """kestrel.lab.sizes.projection_uses (which the projection table and chapter 7 sum with) counts
    each 27B projection as often as a step runs it: their weight bytes are the step's weight bytes
    (kestrel.lab.sweep.weight_bytes) but for the norms, the convolution and the gate vectors."""
    from kestrel.lab import sizes
    from kestrel.lab import sweep
    bench = results.load_projections("bench_projections")
    cfg = sweep.config_of("qwen3.5-27b")
    uses = sizes.projection_uses(cfg)
    assert sorted(uses) == sorted(s.shape for s in bench.shapes)
    got = sum(uses[s.shape] * s.weight_bytes for s in bench.shapes)
    assert 0.999 < got / sweep.weight_bytes(cfg, "bf16") < 1.0


def test_recorded_command_names_the_kernel_switches():
    """A results file measured under a kernel switch says so in its command (the same script
    measures other kernels without it); the output folder is never recorded."""
    argv = ["--out", "/tmp/x y", "--reps", "9"]
    assert results.recorded_command("scripts/b.py", argv, {}) == "python3 scripts/b.py --out OUTDIR --reps 9"
    env = {"KESTREL_BF16_GEMV": "tmb", "KESTREL_COMMIT": "abc", "HOME": "/root", "KESTREL_PDL": "0"}
    assert (results.recorded_command("scripts/b.py", argv, settings.kernel_switches(env))
            == "KESTREL_BF16_GEMV=tmb KESTREL_PDL=0 python3 scripts/b.py --out OUTDIR --reps 9")


def test_a_run_under_another_gemv_writes_its_own_results():
    assert results.stem("bench_engine", None) == "bench_engine"
    assert results.stem("bench_engine", {"gemv": "fma", "gdn_recur": "cluster", "pdl": True}) == "bench_engine"
    assert results.stem("bench_engine", {"gemv": "tmb", "pdl": False}) == "bench_engine_tmb"


def test_measured_commit_names_the_tree(monkeypatch):
    """A benchmark records the commit it measured: KESTREL_COMMIT where the tree came without its
    history, else the repository's HEAD."""
    measured_commit = results.measured_commit
    monkeypatch.setenv("KESTREL_COMMIT", "abc1234")
    assert measured_commit() == "abc1234"
    monkeypatch.delenv("KESTREL_COMMIT")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert measured_commit() == head.stdout.strip()


def test_bench_host_runs_and_writes_its_tables(tmp_path):
    """scripts/bench_host.py on the CPU backend (the embedded model): every timing is a positive
    number, the table holds each row, the profile names kestrel's own functions."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_host
    path = bench_host.main(["--preset", "tiny", "--device", "cpu", "--reps", "2", "--n", "2", "--out", str(tmp_path)])
    import json
    R = json.loads(path.read_text())
    assert R["model"] == "tiny (fp32)" and R["command"].startswith("python3 scripts/bench_host.py")
    assert all(v > 0 for v in list(R["device_ms"].values()) + list(R["host_ms"].values()))
    md = path.with_suffix(".md").read_text()
    assert all(f"| {name} |" in md for name in R["device_ms"])
    assert any("linear" in p["function"] for p in R["profile"])


# --------------------------------------------------------------------------- the reader
COMMITTED = sorted((ROOT / "results").glob("*.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_committed_results_file_loads(path):
    rec = results.load(path)
    assert rec.provenance.device and rec.provenance.command and rec.path == f"results/{path.name}"


@pytest.mark.parametrize("script,stem", [("bench_gdn", "bench_gdn"), ("bench_host", "bench_host_tmb"),
                                         ("bench_engine", "bench_engine_tmb"), ("bench_spec", "bench_spec"),
                                         ("bench_batch", "bench_batch_tiny_h100"), ("bench_peer", "bench_peer"),
                                         ("bench_batch", "bench_batch_27b_h100"),
                                         ("bench_batch", "bench_batch_9b_tmb_h100"),
                                         ("bench_batch", "bench_batch_9b_tmb_greedy_h100"),
                                         ("bench_batch", "bench_batch_27b_tmb_passes_h100"),
                                         ("bench_batch", "bench_batch_9b_tmb_passes_h100"),
                                         ("bench_batch", "bench_batch_27b_tmb_h100"),
                                         ("bench_batch", "bench_batch_27b_tmb_greedy_h100"),
                                         ("bench_batch", "bench_batch"),
                                         ("bench_batch", "bench_batch_tiny_h200_before_prepare"),
                                         ("bench_batch", "bench_batch_27b_h100_before_prepare"),
                                         ("bench_adaptive", "bench_adaptive_h100"),
                                         ("bench_adaptive", "bench_adaptive_h100_fma"),
                                         ("bench_adaptive", "bench_adaptive_t192_h100"),
                                         ("bench_engine", "bench_engine_h100"),
                                         ("bench_engine", "bench_engine_tmb_h100")])
def test_committed_tables_are_what_the_writer_renders(tmp_path, script, stem):
    """results.write, given a committed file's data and provenance, writes that file and its table."""
    import importlib
    import json
    sys.path.insert(0, str(ROOT / "scripts"))
    mod = importlib.import_module(script)
    render = getattr(mod, "render_md", None) or getattr(mod, "markdown", None) or mod.render
    committed = ROOT / "results" / f"{stem}.json"
    data = json.loads(committed.read_text())
    if script == "bench_engine":
        data = mod.from_json(data)
    path = results.write(tmp_path, stem, data, render, results.load(committed).provenance)
    assert path.read_text() == committed.read_text()
    assert path.with_suffix(".md").read_text() == committed.with_suffix(".md").read_text()


def _mutations(rng):
    """(description, mutate(d)) over bench_spec.json's dict: values of the wrong kind, missing
    fields, foreign additions; the place each touches drawn at random."""
    def at(d, *keys):
        for k in keys[:-1]:
            d = d[k]
        return d, keys[-1]

    def setter(value, *keys):
        def f(d):
            obj, k = at(d, *keys)
            obj[k] = value
        return f

    def deleter(*keys):
        def f(d):
            obj, k = at(d, *keys)
            del obj[k]
        return f
    run = int(rng.integers(0, 40))
    m = int(rng.integers(1, 5))
    return [
        ("unit cost 'fast'", setter("fast", "large", "units", "ckpt", str(m))),
        ("unit cost -5", setter(-5.0, "large", "units", "step")),
        ("unit cost NaN", setter(float("nan"), "large", "units", "draft")),
        ("k as text", setter("3", "large", "runs", run, "k")),
        ("k as bool", setter(True, "large", "runs", run, "k")),
        ("policy unknown", setter("teleport", "large", "runs", run, "policy")),
        ("phase unknown", setter({"warp": 1.0}, "large", "runs", run, "phase_ms_per_token")),
        ("hist count float", setter({"0": 1.5}, "large", "runs", run, "hist")),
        ("runs not a list", setter({"0": 1}, "large", "runs")),
        ("units missing", deleter("large", "units")),
        ("step missing", deleter("large", "units", "step")),
        ("model missing", deleter("tiny", "model")),
        ("device a number", setter(7, "device")),
        ("sweep bound missing", deleter("sweep", "sizes", 0, "roofline", "bound")),
        ("sweep range reversed", setter([2.0, 1.0], "sweep", "sizes", 0, "runs", 0, "speedup_range")),
        ("unknown unit", setter(1.0, "large", "units", "teleport")),
        ("foreign top-level key", setter({"x": 1}, "extra")),
        ("a run's log dropped", deleter("large", "runs", run, "log")),
    ]


def test_a_damaged_results_file_raises_one_named_error(tmp_path):
    """Each mutation of a committed file loads to the same record (a field no record reads) or
    raises ResultsFileError naming the file and the field, never another exception."""
    import dataclasses
    import json
    import math

    import numpy as np
    rng = np.random.default_rng()
    text = (ROOT / "results" / "bench_spec.json").read_text()
    good = results.load_spec(ROOT / "results" / "bench_spec.json")
    for what, mutate in _mutations(rng):
        d = json.loads(text)
        mutate(d)
        p = tmp_path / "bench_spec.json"
        p.write_text(json.dumps(d, allow_nan=True))
        try:
            got = results.load_spec(p)
        except results.ResultsFileError as e:
            msg = str(e)
            assert msg.startswith(f"{p}: ") and ": expected" in msg or ": missing" in msg, (what, msg)
            continue
        assert what in ("foreign top-level key", "a run's log dropped"), (what, "loaded")
        for name in ("tiny", "large"):                   # the same record, read from another path
            g = getattr(good, name)
            assert dataclasses.replace(getattr(got, name), path=g.path, provenance=g.provenance) == g, what
        assert got.sweep == good.sweep and got.provenance == good.provenance, what
    assert math.isfinite(good.large.units.step)


def test_a_batch_files_passes_are_read_and_checked(tmp_path):
    """bench_batch's round passes (unit_costs) load as BatchPasses whose rounds add up from the file;
    a pass time that is negative or text, or select/fold timed for other n than 1..k, is refused."""
    import json
    src = ROOT / "results" / "bench_batch_27b_tmb_passes_h100.json"
    d = json.loads(src.read_text())
    b = results.load_batch(src)
    assert [p.B for p in b.passes] == [u["B"] for u in d["unit_costs"]]
    for p, u in zip(b.passes, d["unit_costs"]):
        for n in range(1, p.k + 1):
            assert p.checkpointed_round(n) == u["verify_ckpt"] + u["select"][str(n)]
            assert p.cached_round(n) == u["verify_cached"] + u["fold"][str(n)]
    for mutate in (lambda u: u.__setitem__("fold", {"1": 1.0}), lambda u: u.__setitem__("verify_ckpt", -1.0),
                   lambda u: u.__setitem__("step", "fast"), lambda u: u["select"].__setitem__("9", 1.0)):
        bad = json.loads(src.read_text())
        mutate(bad["unit_costs"][-1])
        p = tmp_path / "bench_batch.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(results.ResultsFileError):
            results.load_batch(p)


@pytest.mark.parametrize("content", [b"", b'{"device": "x", "date": "y", "com', b"\xff\xfe{}", b"[" * 100000,
                                     b"[" * 30 + b"]" * 30, b"7", b"{}"], ids=str)
def test_a_foreign_or_broken_file_is_refused(tmp_path, content):
    p = tmp_path / "bench_spec.json"
    p.write_bytes(content)
    with pytest.raises(results.ResultsFileError, match=str(p)):
        results.load_spec(p)


def test_an_oversized_file_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "MAX_BYTES", 1000)
    p = tmp_path / "bench_spec.json"
    p.write_text(" " * 1001 + "{}")
    with pytest.raises(results.ResultsFileError, match="larger than 1000 bytes"):
        results.load_spec(p)


def test_widgets_and_figures_refuse_a_damaged_file(tmp_path):
    import json
    from kestrel.lab import serving, widgets
    d = json.loads((ROOT / "results" / "bench_spec.json").read_text())
    d["large"]["units"]["ckpt"]["2"] = "fast"
    p = tmp_path / "bench_spec.json"
    p.write_text(json.dumps(d))
    with pytest.raises(results.ResultsFileError, match=r"large\.units\.ckpt\[2\]|large\.units\.ckpt\.2"):
        widgets.runs.as_units(str(p))
    with pytest.raises(results.ResultsFileError):
        widgets.cost_explorer(str(p))
    e = json.loads((ROOT / "results" / "bench_engine.json").read_text())
    del e["device_props"]["memory_bytes"]
    (tmp_path / "bench_engine.json").write_text(json.dumps(e))
    with pytest.raises(results.ResultsFileError, match="device_props.memory_bytes"):
        results.load_engine("bench_engine", folder=tmp_path)
    assert serving.device_memory()[0] > 0
