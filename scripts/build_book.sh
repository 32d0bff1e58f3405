#!/usr/bin/env bash
# Build the Kestrel book (static HTML, works offline) into _build/html/, without the set-up
# (scripts/book.sh is set-up + this).
#
#   scripts/build_book.sh              build from the outputs committed in book/*.ipynb
#   scripts/build_book.sh --execute    first re-execute every notebook in book/ on this machine
#                                      (GPU if present, else CPU), stamping each
#                                      (scripts/execute_notebooks.py; the widget cells keep their
#                                      text form), into _build/executed/book/ (book/*.ipynb
#                                      untouched), then build from there
#   scripts/build_book.sh --execute --in-place
#                                      the same, but overwrite book/*.ipynb with the new outputs
#   scripts/build_book.sh --all ...    other arguments go to `jupyter-book build`
#                                      (--all: rebuild every page, not just changed ones)
#
# Warnings are errors (-W). plotly.min.js and MathJax come from local copies
# (book/_ext/kestrel_book.py); MathJax needs libjs-mathjax (scripts/setup.sh installs it).
# Open _build/html/index.html.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"

execute=0
in_place=0
args=()
for a in "$@"; do
  case "$a" in
    --execute) execute=1 ;;
    --in-place) in_place=1 ;;
    *) args+=("$a") ;;
  esac
done

# The book's source: the repository root, or a copy of it holding freshly executed notebooks
# (the chapters, the appendix pages and links to what the build reads from the root).
src=.
if [[ $execute == 1 && $in_place == 1 ]]; then
  echo "book: executing book/*.ipynb in place: their committed outputs are replaced"
  "$PY" scripts/execute_notebooks.py
elif [[ $execute == 1 ]]; then
  src=_build/executed
  echo "book: executing into $src/book/ (book/*.ipynb untouched; --in-place overwrites them)"
  rm -rf "$src"
  mkdir -p "$src/book"
  cp _config.yml _toc.yml "$src/"
  cp book/*.md "$src/book/"
  ln -s ../../../book/_ext ../../../book/_static "$src/book/"
  ln -s ../../kestrel "$src/kestrel"
  "$PY" scripts/execute_notebooks.py --out-dir "$src/book"
else
  echo "book: building from the outputs committed in book/*.ipynb (nothing is executed)"
fi
if [[ $execute == 1 ]]; then
  # the live widgets' outputs keep their text form only (what a reader opening the notebook
  # without running it should see, trusted or not): their models died with the executing kernel
  "$PY" scripts/browser_widgets.py --drop-widget-views "$src"/book*/*.ipynb
fi

# always through $PY (not the first jupyter-book on PATH): the interpreter that has the book's
# packages, the one running the tests when they build the book
jb=("$PY" -c 'import sys; from jupyter_book.cli.main import main; sys.argv[0] = "jupyter-book"; main()')
"${jb[@]}" build "$src" --path-output . -W --keep-going "${args[@]+"${args[@]}"}"
echo "book: $(pwd)/_build/html/index.html"
