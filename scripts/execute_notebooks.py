#!/usr/bin/env python3
"""Execute the book's notebooks (in place, or into --out-dir) and stamp where/when they ran.

    python scripts/execute_notebooks.py                  # every book/*.ipynb
    python scripts/execute_notebooks.py book/ch05_*.ipynb --timeout 1200
    python scripts/execute_notebooks.py --out-dir _build/executed/book   # book/ untouched

Each notebook is run top to bottom in a fresh ``python3`` kernel (cwd = the notebook's
folder, repository root on PYTHONPATH so ``import kestrel`` works without installing),
its outputs replaced, and its metadata stamped:

    "kestrel": {"device": "NVIDIA H200 (GPU)", "executed_at": "2025-...Z",
                "command": "python scripts/execute_notebooks.py ...", "duration_s": 81.2}

The notebooks choose the backend themselves (``kestrel.load(device="auto")``: CUDA
through CuPy if a GPU is visible, else NumPy); ``device`` records the GPU if one is
visible (nvidia-smi or CuPy), else the CPU. A notebook that raises is left untouched on
disk (unless --allow-errors) and the script exits non-zero.

Runs without Jupyter itself. For a machine with neither Jupyter nor network access, carry
these wheels in .whl/ (closure of `pip install nbclient nbformat ipykernel plotly ipywidgets`,
Python 3.11; scripts/publish_gpu.sh installs them offline):
  nbclient nbformat jupyter_client jupyter_core ipykernel ipython comm debugpy
  matplotlib-inline nest-asyncio2 psutil pyzmq tornado traitlets platformdirs
  python-dateutil fastjsonschema jsonschema jsonschema-specifications referencing
  rpds-py attrs jedi parso pexpect ptyprocess prompt_toolkit wcwidth Pygments
  ipython_pygments_lexers stack-data asttokens executing pure_eval typing_extensions
  packaging tzdata  +  plotly narwhals  +  ipywidgets widgetsnbextension jupyterlab_widgets
(pyzmq, rpds-py, psutil, tornado, debugpy are binary wheels: fetch them for the target's
Python version/platform, e.g. `pip download --only-binary=:all:
--python-version 3.11 --platform manylinux2014_x86_64 -d .whl ...`).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_name() -> str | None:
    """Name of the first visible CUDA GPU, or None."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return None
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            names = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
            if out.returncode == 0 and names:
                return names[0]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import cupy  # noqa: F401  (only if installed)

        if cupy.cuda.runtime.getDeviceCount() > 0:
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        pass
    return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_description() -> str:
    if os.environ.get("KESTREL_DEVICE_NAME"):
        return os.environ["KESTREL_DEVICE_NAME"]
    gpu = gpu_name()
    if gpu:
        return f"{gpu} (GPU)"
    return f"{cpu_name()} (CPU, {os.cpu_count()} cores)"


def execute(path: Path, *, timeout: int, kernel: str, allow_errors: bool, device: str,
            command: str, out: Path) -> tuple[bool, float, str]:
    """Run `path` (cwd: its folder) and write the executed, stamped notebook to `out`."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name=kernel, allow_errors=allow_errors,
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,        # no per-cell timestamps: keep diffs small
        store_widget_state=False,   # the static book cannot render widgets offline anyway
    )
    t0 = time.perf_counter()
    error = ""
    try:
        client.execute()
    except CellExecutionError as e:
        error = str(e)
    dur = time.perf_counter() - t0
    if error and not allow_errors:
        return False, dur, error
    nb.metadata["kestrel"] = {
        "device": device,
        "executed_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "duration_s": round(dur, 1),
    }
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3",
                                          "language": "python"})
    nbformat.write(nb, out)
    return True, dur, error


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path,
                    help="notebooks to execute (default: every book/*.ipynb)")
    ap.add_argument("--timeout", type=int, default=1800, help="per-cell timeout, s (default 1800)")
    ap.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    ap.add_argument("--allow-errors", action="store_true",
                    help="keep going past failing cells and write the notebook anyway")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="write the executed notebooks here instead of over the sources")
    args = ap.parse_args(argv)

    paths = args.notebooks or sorted((ROOT / "book").glob("*.ipynb"))
    paths = [p.resolve() for p in paths]
    if not paths:
        print("execute_notebooks: no notebooks found", file=sys.stderr)
        return 1
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
    # The kernel inherits our environment: make `import kestrel` resolve to this checkout.
    pp = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([pp] if pp else []))

    device = device_description()
    rel = [os.path.relpath(p, ROOT) for p in paths] if args.notebooks else []
    extra = [a for a in argv if not a.endswith(".ipynb")]
    command = shlex.join(["python", "scripts/execute_notebooks.py", *extra, *rel])
    print(f"execute_notebooks: {len(paths)} notebook(s) on {device}", flush=True)
    failed = 0
    for p in paths:
        out = p if args.out_dir is None else args.out_dir.resolve() / p.name
        ok, dur, err = execute(p, timeout=args.timeout, kernel=args.kernel,
                               allow_errors=args.allow_errors, device=device, command=command, out=out)
        name = os.path.relpath(out, ROOT)
        if ok:
            print(f"  ok    {name}  ({dur:.1f} s){'  [with errors]' if err else ''}", flush=True)
        else:
            failed += 1
            print(f"  FAIL  {name}  ({dur:.1f} s): not written\n{err}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
