"""The committed results tables are what their scripts render from the committed results files,
so a table cannot drift from its measurements (or be edited by hand)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_projections_table_is_rendered_from_its_json(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_projections.py"), "--render",
                        str(ROOT / "results" / "bench_projections.json"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "bench_projections.md").read_text() == (ROOT / "results" / "bench_projections.md").read_text()


def test_projection_uses_account_for_a_steps_weights():
    """kestrel.sizes.projection_uses (which the projection table and chapter 7 sum with) counts
    each 27B projection as often as a step runs it: their weight bytes are the step's weight bytes
    (kestrel.spec.sweep.weight_bytes) but for the norms, the convolution and the gate vectors."""
    from kestrel import results, sizes
    from kestrel.spec import sweep
    bench = results.load("bench_projections")
    cfg = sweep.config_of("qwen3.5-27b")
    uses = sizes.projection_uses(cfg)
    assert sorted(uses) == sorted(s["shape"] for s in bench["shapes"])
    got = sum(uses[s["shape"]] * s["weight_bytes"] for s in bench["shapes"])
    assert 0.999 < got / sweep.weight_bytes(cfg, "bf16") < 1.0
