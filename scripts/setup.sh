#!/usr/bin/env bash
# One-time setup of a fresh machine: Python packages (CPU torch for the reference tests),
# kestrel itself (editable), and - where apt works - Chromium (browser test of the built book)
# and MathJax (served locally: the built book never touches a CDN).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  if ! command -v chromium >/dev/null 2>&1 || [ ! -d /usr/share/javascript/mathjax ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium libjs-mathjax >/dev/null
  fi
else
  echo "setup: no root apt-get here; the browser test will skip without chromium" >&2
fi
"$PY" -m pip install -q -r requirements.txt
"$PY" -m pip install -q -e .
