"""The committed results tables are what their scripts render from the committed results files,
so a table cannot drift from its measurements (or be edited by hand); and the benchmark scripts'
writers run here, on the CPU backend, where the script allows it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("stem", ["bench_projections", "bench_projections_sweep"])
def test_bench_projections_table_is_rendered_from_its_json(tmp_path, stem):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_projections.py"), "--render",
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


def test_bench_engine_tables_are_rendered_from_their_json(tmp_path, monkeypatch):
    """scripts/bench_engine.py's writer names its files by results.stem (bench_engine under the
    default GEMV, bench_engine_tmb under KESTREL_BF16_GEMV=tmb) and writes the committed tables."""
    import json
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_engine
    from kestrel.ops import linear
    for gemv, stem in ((linear.BF16_GEMV_DEFAULT, "bench_engine"), ("tmb", "bench_engine_tmb")):
        monkeypatch.setattr(linear, "BF16_GEMV", gemv)
        committed = ROOT / "results" / f"{stem}.json"
        path = bench_engine.save_results(tmp_path, bench_engine.from_json(json.loads(committed.read_text())))
        assert path == tmp_path / f"{stem}.json" and path.read_text() == committed.read_text()
        assert path.with_suffix(".md").read_text() == committed.with_suffix(".md").read_text()


def test_projection_uses_account_for_a_steps_weights():
    """kestrel.lab.sizes.projection_uses (which the projection table and chapter 7 sum with) counts
    each 27B projection as often as a step runs it: their weight bytes are the step's weight bytes
    (kestrel.lab.sweep.weight_bytes) but for the norms, the convolution and the gate vectors."""
    from kestrel.lab import results, sizes
    from kestrel.lab import sweep
    bench = results.load("bench_projections")
    cfg = sweep.config_of("qwen3.5-27b")
    uses = sizes.projection_uses(cfg)
    assert sorted(uses) == sorted(s["shape"] for s in bench["shapes"])
    got = sum(uses[s["shape"]] * s["weight_bytes"] for s in bench["shapes"])
    assert 0.999 < got / sweep.weight_bytes(cfg, "bf16") < 1.0


def test_recorded_command_names_the_kernel_switches():
    """A results file measured under a kernel switch says so in its command (the same script
    measures other kernels without it); the output folder is never recorded."""
    from kestrel.lab.results import recorded_command
    argv = ["--out", "/tmp/x y", "--reps", "9"]
    assert recorded_command("scripts/b.py", argv, {}) == "python3 scripts/b.py --out OUTDIR --reps 9"
    env = {"KESTREL_BF16_GEMV": "tmb", "KESTREL_COMMIT": "abc", "HOME": "/root", "KESTREL_PDL": "0"}
    assert (recorded_command("scripts/b.py", argv, env)
            == "KESTREL_BF16_GEMV=tmb KESTREL_PDL=0 python3 scripts/b.py --out OUTDIR --reps 9")


def test_a_run_under_another_gemv_writes_its_own_results(monkeypatch):
    from kestrel.ops import linear
    from kestrel.lab.results import stem
    monkeypatch.setattr(linear, "BF16_GEMV", linear.BF16_GEMV_DEFAULT)
    assert stem("bench_engine") == "bench_engine"
    monkeypatch.setattr(linear, "BF16_GEMV", "tmb")
    assert stem("bench_engine") == "bench_engine_tmb"


def test_measured_commit_names_the_tree(monkeypatch):
    """A benchmark records the commit it measured: KESTREL_COMMIT where the tree came without its
    history, else the repository's HEAD."""
    from kestrel.lab.results import measured_commit
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
