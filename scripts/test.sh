#!/usr/bin/env bash
# The test command: set up what is missing (scripts/setup.sh, quick when done), then run every
# test: unit tests, the notebooks under nbval on this machine's backend, the book build with
# warnings as errors, the built HTML offline, the browser test, and the GPU tests where a GPU
# is present (they skip cleanly without one). .ci/run runs exactly this.
#   bash scripts/test.sh                    everything
#   bash scripts/test.sh tests/test_spec.py -x     arguments go to pytest
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest "$@"
