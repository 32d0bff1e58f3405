"""Results files written by the benchmark scripts (results/*.json and their .md tables).

Every script writes through write(), which stamps the file's provenance (device, date,
command, commit, and the kernel options its backend reported); every reader in the lab and the
book reads through a load_* function, which checks each field it returns (kestrel.lab.checks)
and raises ResultsFileError, naming the file and the field, for a damaged or foreign file.
A figure prints where its numbers came from with `record.provenance.line()` or annotate().
"""
from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

from kestrel import settings

from .checks import Field, ResultsFileError
from .records import Provenance, SpecFile, SpecSection, read_section, read_spec_file, read_sweep
from .records_bench import (AdaptiveFile, BatchFile, Comparison, EngineFile, GdnFile, HostFile, PeerFile,
                            ProjectionsFile, read_adaptive_file, read_batch_file, read_comparison_file, read_engine_file,
                            read_gdn_file, read_host_file, read_peer_file, read_projections_file)
from .plots import annotate_provenance

RESULTS = Path(__file__).resolve().parents[2] / "results"
MAX_BYTES = 8 << 20        # the largest results file read (the largest committed one is under 300 kB)
MAX_DEPTH = 24             # the deepest nesting a results file has is 6


# ---- reading -------------------------------------------------------------------------------------------
def path_of(source, folder: Path | None = None) -> Path:
    """A results name ('bench_spec' -> <folder>/bench_spec.json, folder default RESULTS) or a path."""
    if isinstance(source, str) and "/" not in source and not source.endswith(".json"):
        if source in ("", ".", "..") or "\\" in source:
            raise ResultsFileError(f"{source!r} is not a results name")
        return Path(folder or RESULTS) / f"{source}.json"
    if isinstance(source, (str, os.PathLike)):
        return Path(source)
    raise ResultsFileError(f"a results file is a name or a path, got {type(source).__name__}")


def _depth(x) -> int:
    """The nesting depth of parsed JSON, without recursion."""
    deepest, todo = 0, [(x, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            todo.extend((w, d + 1) for w in v.values())
        elif isinstance(v, list):
            todo.extend((w, d + 1) for w in v)
    return deepest


def read_json(source, folder: Path | None = None) -> tuple:
    """(parsed JSON, the path as shown): at most MAX_BYTES read from a regular file."""
    path = path_of(source, folder)
    shown = repo_relative(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ResultsFileError(f"{shown} does not exist: run the benchmark script that writes it "
                               f"(scripts/bench_*.py) on a GPU first") from None
    except OSError as e:
        raise ResultsFileError(f"{shown} cannot be opened ({e.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise ResultsFileError(f"{shown} is not a regular file")
        raw = fh.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ResultsFileError(f"{shown}: larger than {MAX_BYTES} bytes, more than any results file holds")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ResultsFileError(f"{shown}: not UTF-8 text (byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsFileError(f"{shown}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise ResultsFileError(f"{shown}: nested deeper than any results file") from None
    if _depth(data) > MAX_DEPTH:
        raise ResultsFileError(f"{shown}: nested deeper than {MAX_DEPTH} levels, deeper than any results file")
    return data, shown


def _read(reader, source, folder):
    data, shown = read_json(source, folder)
    try:
        return reader(Field(data, shown), shown)
    except ResultsFileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:   # a check this reader lacks
        raise ResultsFileError(f"{shown}: {type(e).__name__}: {e}") from None


def load_spec(source="bench_spec", folder: Path | None = None) -> SpecFile:
    """A results file of scripts/bench_spec.py (a name in `folder`, default results/, or a path)."""
    return _read(read_spec_file, source, folder)


def load_bench(source="bench_spec", section: str | None = None, folder: Path | None = None) -> SpecSection:
    """One section of a bench_spec file: 'large' (the real shape, histogram replay) or 'tiny'
    (end to end); default 'large' if the file has it, else 'tiny'."""
    f = load_spec(source, folder)
    have = [n for n in ("tiny", "large") if getattr(f, n) is not None]
    name = section or ("large" if f.large is not None else "tiny")
    if name not in have:
        raise ResultsFileError(f"{f.path}: no section {name!r} (has {have})")
    return getattr(f, name)


def load_engine(source="bench_engine", folder: Path | None = None) -> EngineFile:
    """A results file of scripts/bench_engine.py."""
    return _read(read_engine_file, source, folder)


def load_projections(source="bench_projections", folder: Path | None = None) -> ProjectionsFile:
    """A results file of dev/bench_projections.py."""
    return _read(read_projections_file, source, folder)


def load_gdn(source="bench_gdn", folder: Path | None = None) -> GdnFile:
    """A results file of scripts/bench_gdn.py."""
    return _read(read_gdn_file, source, folder)


def load_host(source="bench_host", folder: Path | None = None) -> HostFile:
    """A results file of scripts/bench_host.py."""
    return _read(read_host_file, source, folder)


def load_adaptive(source="bench_adaptive", folder: Path | None = None) -> AdaptiveFile:
    """A results file of scripts/bench_adaptive.py."""
    return _read(read_adaptive_file, source, folder)


def load_peer(source="bench_peer", folder: Path | None = None) -> PeerFile:
    """A results file of scripts/bench_peer.py."""
    return _read(read_peer_file, source, folder)


def load_batch(source="bench_batch", folder: Path | None = None) -> BatchFile:
    """A results file of scripts/bench_batch.py."""
    return _read(read_batch_file, source, folder)


def load_comparison(source="bench_before_after", folder: Path | None = None) -> Comparison:
    """A results file of scripts/compare_bench.py."""
    return _read(read_comparison_file, source, folder)


# Each family's field reader and loader, by the start of its files' names.
READERS = {"bench_spec": read_spec_file, "bench_engine": read_engine_file, "bench_projections": read_projections_file,
           "bench_gdn": read_gdn_file, "bench_host": read_host_file, "bench_before_after": read_comparison_file,
           "bench_adaptive": read_adaptive_file, "bench_peer": read_peer_file, "bench_batch": read_batch_file}
LOADERS = {"bench_spec": load_spec, "bench_engine": load_engine, "bench_projections": load_projections,
           "bench_gdn": load_gdn, "bench_host": load_host, "bench_before_after": load_comparison,
           "bench_adaptive": load_adaptive, "bench_peer": load_peer, "bench_batch": load_batch}


def load(path):
    """Any results file, read by its family's reader (chosen by the start of its name)."""
    p = path_of(path)
    for prefix, loader in LOADERS.items():
        if p.stem.startswith(prefix):
            return loader(p)
    raise ResultsFileError(f"{repo_relative(p)}: no results family is named like it ({sorted(LOADERS)})")


def record_of(family: str, data: dict, shown: str):
    """A results dict held in memory (a script's, before or after writing it) as its family's record."""
    return READERS[family](Field(data, shown), shown)


def live_section(data: dict, name: str, prov: Provenance) -> SpecSection:
    """A section measured just now (kestrel.lab.sweep.large_runs) as the record the file would hold."""
    return read_section(Field(data, "live run", name), name, prov, "live run")


def live_sweep(data: dict):
    """A size sweep measured just now (kestrel.lab.sweep.size_sweep) as the record the file would hold."""
    return read_sweep(Field(data, "live run", "sweep"))


def annotate(fig, prov: Provenance) -> str:
    """Write a provenance line into a figure (the static book shows it) and return it."""
    line = prov.line()
    annotate_provenance(fig, line.replace("`", ""))
    return line


# ---- writing -------------------------------------------------------------------------------------------
def measured_commit():
    """The commit a benchmark measured: KESTREL_COMMIT where the tree was copied without its
    history, else git's HEAD; None outside a repository."""
    if settings.get("KESTREL_COMMIT"):
        return settings.get("KESTREL_COMMIT")
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS.parent, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None




def backend_kernels(be) -> dict | None:
    """The kernel options a backend reports (`be.kernels.as_dict()`), or None where it has none."""
    kernels = getattr(be, "kernels", None)
    return None if kernels is None else dict(kernels.as_dict())


def stem(name: str, kernels: dict | None) -> str:
    """The results file a benchmark writes: `name` for the CUDA-core GEMV (fma), name_<gemv> for
    another, so a run of one GEMV never overwrites another's results. The names predate the
    default's change to tmb (2026-12-07): a default run writes name_tmb."""
    gemv = None if kernels is None else kernels.get("gemv", "fma")
    return name if gemv in (None, "fma") else f"{name}_{gemv}"


DEFAULT_GEMV = settings.VARIABLES["KESTREL_BF16_GEMV"][0]   # the default bf16 GEMV (the variable unset)


def of_default_engine(name: str) -> str:
    """`name`'s results file as the default engine wrote it (stem under DEFAULT_GEMV, e.g.
    bench_spec -> bench_spec_tmb): where the book reads a GPU story recorded by one engine, it
    reads the default one's, whatever this process's KESTREL_BF16_GEMV says (the book's page must
    not change with a reader's settings)."""
    return stem(name, {"gemv": DEFAULT_GEMV})


def recorded_command(script: str, argv: list, switches: dict | None = None) -> str:
    """The command line a results file records, led by the kernel switches it ran under; the
    output folder is written OUTDIR (where a run put its files says nothing about what it measured)."""
    args = ["OUTDIR" if i and argv[i - 1] == "--out" else x for i, x in enumerate(argv)]
    lead = [f"{k}={shlex.quote(str(v))}" for k, v in (switches or {}).items()]
    return " ".join(lead + ["python3", script] + [shlex.quote(x) for x in args])


def repo_relative(path) -> str:
    """A path as a results file records it: relative to the repository when it lies inside it."""
    try:
        return str(Path(path).resolve().relative_to(RESULTS.parent))
    except (ValueError, OSError, RuntimeError):
        return str(path)


def _plain(x):
    """JSON for a value json cannot write: a NumPy scalar's Python value, else its text."""
    item = getattr(x, "item", None)
    return item() if callable(item) else str(x)


def write(out, name: str, data: dict, render, prov: Provenance) -> Path:
    """Write out/<name>.json (data, its provenance fields stamped in) and out/<name>.md
    (render(data)); -> the JSON's path. A field the data already holds keeps its place."""
    data.update(prov.as_dict())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=_plain))
    path.with_suffix(".md").write_text(render(data))
    return path


__all__ = ["RESULTS", "ResultsFileError", "Provenance", "load", "load_spec", "load_bench", "load_engine",
           "load_projections", "load_gdn", "load_host", "load_comparison", "record_of", "live_section", "live_sweep",
           "annotate", "write", "stem", "recorded_command", "backend_kernels",
           "measured_commit", "repo_relative"]
