"""The committed results tables are what their scripts render from the committed results files,
so a table cannot drift from its measurements (or be edited by hand)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_projections_table_is_rendered_from_its_json(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_projections.py"), "--render",
                    str(ROOT / "results" / "bench_projections.json"), "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=120)
    got = (tmp_path / "bench_projections.md").read_text()
    assert got == (ROOT / "results" / "bench_projections.md").read_text()
    R = json.loads((ROOT / "results" / "bench_projections.json").read_text())
    assert R["device"] in got and R["date"] in got and R["command"].replace("OUTDIR", "") in got.replace("OUTDIR", "")
