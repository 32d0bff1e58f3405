"""Results files written by the benchmark scripts (results/*.json), with their provenance.

A figure in the book that shows a number not measured in the chapter itself loads it from
here, and prints where it came from: device, date, command and commit.
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"


def load(name: str) -> dict:
    """results/<name>.json as a dict; a clear error if the benchmark has not been run."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: run the benchmark script that writes it "
                                f"(scripts/bench_spec.py or scripts/bench_engine.py) on a GPU first")
    return json.loads(path.read_text())


def provenance(d: dict) -> str:
    """'measured on <device> at <date> by `<command>`' for a results dict (or one of its parts)."""
    dev = d.get("device", "?")
    date = d.get("date", "?")
    cmd = d.get("command", "?")
    commit = d.get("commit")
    return f"measured on {dev} at {date} by `{cmd}`" + (f" (commit {commit})" if commit else "")


def annotate(fig, d: dict) -> str:
    """Write the results file's provenance into a figure (the static book shows it) and return it."""
    line = provenance(d)
    from .plots import annotate_provenance
    annotate_provenance(fig, line.replace("`", ""))
    return line
