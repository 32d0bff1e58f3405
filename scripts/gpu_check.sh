#!/usr/bin/env bash
# One GPU session's worth of checks, in one command (for a machine with an NVIDIA GPU):
# the PDL self-test (in its own process), the CUDA tests, then the engine benchmark. Logs and
# results land in OUTDIR (default _build/gpu): env.txt, test_cuda.log, bench.log,
# bench_engine.json/.md, peer.json.
#     bash scripts/gpu_check.sh [OUTDIR]        # then copy bench_engine.* into results/
set -o pipefail
cd "$(dirname "$0")/.."
outdir=${1:-_build/gpu}
mkdir -p "$outdir"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi; python3 -c "import sys, cupy, numpy; print(sys.version); print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; } > "$outdir/env.txt" 2>&1
# graphs with programmatic dependent launch must give the same bits as without; else turn it off
if timeout 90 python3 scripts/pdl_selftest.py >> "$outdir/env.txt" 2>&1; then
  export KESTREL_PDL_SELFTEST=passed
else
  export KESTREL_PDL_SELFTEST="failed (rc $?), PDL off" KESTREL_PDL=0
fi
echo "PDL self-test: $KESTREL_PDL_SELFTEST" | tee -a "$outdir/env.txt"
timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -q -o addopts="" -p no:cacheprovider -rfE tests/test_cuda.py 2>&1 | tee "$outdir/test_cuda.log"
timeout "${BENCH_TIMEOUT:-330}" python3 scripts/bench_engine.py --out "$outdir" --budget "${BENCH_BUDGET:-300}" ${BENCH_ARGS:-} 2>&1 | tee "$outdir/bench.log"
