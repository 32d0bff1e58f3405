"""Results files written by the benchmark scripts (results/*.json), with their provenance.

A figure in the book that shows a number not measured in the chapter itself loads it from
here, and prints where it came from: device, date, command and commit. load_bench() reads a
speculative-decoding benchmark (scripts/bench_spec.py) into typed objects.
"""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "results"


def load(name: str) -> dict:
    """results/<name>.json as a dict; a clear error if the benchmark has not been run."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: run the benchmark script that writes it "
                                f"(scripts/bench_spec.py or scripts/bench_engine.py) on a GPU first")
    return json.loads(path.read_text())


def measured_commit():
    """The commit a benchmark measured: KESTREL_COMMIT where the tree was copied without its
    history, else git's HEAD; None outside a repository."""
    if os.environ.get("KESTREL_COMMIT"):
        return os.environ["KESTREL_COMMIT"]
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS.parent, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# The environment switches that change which kernels run (and so what a benchmark measures).
KERNEL_SWITCHES = ("KESTREL_BF16_GEMV", "KESTREL_GDN_RECUR", "KESTREL_PDL")


def stem(name: str) -> str:
    """The results file a benchmark writes: `name`, or name_<kernel> when it runs under a bf16 GEMV
    other than the engine's default (KESTREL_BF16_GEMV), so such a run cannot overwrite the
    default's results."""
    from kestrel import settings
    from kestrel.ops import linear
    gemv = settings.get("KESTREL_BF16_GEMV")
    return name if gemv == linear.GEMV_DEFAULT else f"{name}_{gemv}"


def recorded_command(script: str, argv: list, environ=None) -> str:
    """The command line a results file records, led by the kernel switches set in the environment;
    the output folder is written OUTDIR (where a run put its files says nothing about what it
    measured)."""
    env = os.environ if environ is None else environ
    args = ["OUTDIR" if i and argv[i - 1] == "--out" else x for i, x in enumerate(argv)]
    switches = [f"{k}={shlex.quote(env[k])}" for k in KERNEL_SWITCHES if k in env]
    return " ".join(switches + ["python3", script] + [shlex.quote(x) for x in args])


def repo_relative(path) -> str:
    """A path as a results file records it: relative to the repository when it lies inside it."""
    try:
        return str(Path(path).resolve().relative_to(RESULTS.parent))
    except (ValueError, OSError):
        return str(path)


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


@dataclass
class SpecBench:
    """One section of a speculative-decoding benchmark: its unit costs, its runs, and (the
    end-to-end section) the model's teacher-forced acceptance per pairing."""
    units: object                     # spec.UnitCosts
    runs: list                        # [spec.RunSummary]
    acceptance: dict = field(default_factory=dict)    # spec.Pairing -> alpha list
    model: str | None = None
    device: str | None = None
    date: str | None = None
    section: str = ""
    path: str | None = None
    provenance: str = ""


SECTIONS = ("tiny", "large")


def load_bench(source="bench_spec", section: str | None = None) -> SpecBench:
    """A benchmark results file of scripts/bench_spec.py as a SpecBench.
    source: a results name ('bench_spec' -> results/bench_spec.json), a path to such a JSON, or
    the loaded dict. section: 'large' (the real shape, histogram replay) or 'tiny' (end to
    end); default 'large' if present, else 'tiny'."""
    from kestrel import speculative as spec
    from kestrel.errors import KestrelError
    path = None
    if isinstance(source, dict):
        d = source
    elif isinstance(source, str) and not source.endswith(".json") and "/" not in source:
        d, path = load(source), str(RESULTS / f"{source}.json")
    else:
        p = Path(source)
        d, path = json.loads(p.read_text()), str(p)
    name = section or ("large" if "large" in d else "tiny")
    if name not in SECTIONS or name not in d:
        raise KestrelError(f"{path or 'results'}: no section {name!r} (has {[s for s in SECTIONS if s in d]})")
    sec = d[name]
    device = sec.get("device", d.get("device"))
    runs = [spec.RunSummary.from_dict({"model": sec.get("model", ""), "device": device or "", **row})
            for row in sec.get("runs", [])]
    acc = {spec.Pairing.parse(pr): a.get("alpha") for pr, a in (sec.get("acceptance") or {}).items()}
    return SpecBench(units=spec.UnitCosts.from_dict(sec["units"]), runs=runs, acceptance=acc,
                     model=sec.get("model"), device=device, date=d.get("date"), section=name, path=path,
                     provenance=provenance({**d, "device": device}))
