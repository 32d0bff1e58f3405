#!/usr/bin/env bash
# Everything a GPU run publishes, in one command on a machine with an NVIDIA GPU: the GPU tests,
# the speculative benchmark (results/bench_spec_tmb.{json,md} under the default GEMV), then every
# chapter executed on the GPU and stamped with device and date (scripts/execute_notebooks.py). Logs, a copy of the
# results and the executed notebooks (one tarball) go to OUTDIR (default _build/gpu).
#   bash scripts/publish_gpu.sh [--out OUTDIR] [notebook ...]     (default: every book/*.ipynb)
# Where Jupyter is not installed (and there is no network), wheels in .whl/ are installed
# offline into _build/pysite first (scripts/execute_notebooks.py lists them).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
outdir=_build/gpu
if [ "${1:-}" = "--out" ]; then outdir="$2"; shift 2; fi
mkdir -p "$outdir"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target _build/pysite .whl/*.whl || exit 1
  export PYTHONPATH="$PWD/_build/pysite:$PWD"
else
  export PYTHONPATH="$PWD"
fi
{ nvidia-smi -L; date -u; git rev-parse --short HEAD 2>/dev/null; } > "$outdir/env.txt" 2>&1
python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -3 > "$outdir/gpu_tests.log"
cat "$outdir/gpu_tests.log"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 scripts/bench_spec.py 2>&1 | tee "$outdir/bench_spec.log" | tail -40
  cp results/bench_spec*.json results/bench_spec*.md "$outdir/" 2>/dev/null
fi
python3 scripts/execute_notebooks.py --timeout 900 "$@" 2>&1 | grep -v "without encryption" | tee "$outdir/notebooks.log"
tar czf "$outdir/notebooks.tgz" book/*.ipynb
