#!/usr/bin/env bash
# The book command: set up what is missing (scripts/setup.sh, quick when done), then build the
# book into _build/html/ (static HTML that works offline) with warnings as errors.
#   bash scripts/book.sh              from the outputs committed in book/*.ipynb (executed on a GPU
#                                     and stamped with device and date); nothing is re-run
#   bash scripts/book.sh --execute    first re-execute every chapter here, on the embedded model
#                                     (on the GPU if CuPy sees one, else on the CPU), into
#                                     _build/executed/ (book/*.ipynb untouched), and build from there
#   bash scripts/book.sh --execute --in-place
#                                     the same, but overwrite book/*.ipynb with the new outputs
#   bash scripts/book.sh --all        rebuild every page (other arguments go to jupyter-book)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec bash scripts/build_book.sh "$@"
