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
