#!/usr/bin/env bash
# One device call on the GPU machine (see /work/.library/device): the GPU tests, the speculative
# benchmark (results/bench_spec.{json,md}), then the chapters executed on the GPU and stamped.
# Everything worth keeping is copied to $OUT (the notebooks as one tarball).
#   bash scripts/publish_gpu.sh [notebook ...]      (default: every book/*.ipynb)
# Needs the Jupyter wheels in .whl/ (scripts/execute_notebooks.py lists them): the GPU image
# has no Jupyter.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/kestrel-out}"; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{ nvidia-smi -L; date -u; git rev-parse --short HEAD 2>/dev/null; } > "$OUT/env.txt" 2>&1
python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -3 > "$OUT/gpu_tests.log"
cat "$OUT/gpu_tests.log"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 scripts/bench_spec.py 2>&1 | tee "$OUT/bench_spec.log" | tail -40
  cp results/bench_spec.json results/bench_spec.md "$OUT/" 2>/dev/null
fi
python3 scripts/execute_notebooks.py --timeout 900 "$@" 2>&1 | grep -v "without encryption" | tee "$OUT/notebooks.log"
tar czf "$OUT/notebooks.tgz" book/*.ipynb
