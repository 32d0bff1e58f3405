#!/usr/bin/env bash
# Set up this machine for the book and the tests; idempotent, and quick when already done
# (each step first checks whether it is needed). scripts/book.sh and scripts/test.sh run it.
#
#   1. where apt-get works as root: Chromium (the browser tests: the built book, and the live
#      widgets in JupyterLab), MathJax 2.7
#      (served locally: the built book never touches a CDN) and Noto CJK fonts (the article's
#      Chinese title and quotes); without root the browser test skips, and CJK text shows only
#      if the system has a CJK font;
#   2. the Python packages of requirements.txt (CPU torch and transformers are the independent
#      references of the tests; Jupyter Book builds the book; JupyterLab hosts the widget test);
#   3. kestrel itself, editable (pip install -e .);
#   4. with an NVIDIA GPU (nvidia-smi answers): CuPy for the CUDA version the driver reports
#      (the extra gpu-cuda12 or gpu-cuda13 of pyproject.toml). Without one, kestrel runs on NumPy.
#
# PYTHON=python3.12 bash scripts/setup.sh   picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
did=()

# --- 1. system packages ----------------------------------------------------------------------
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  need=()
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
  [ -f /usr/share/javascript/mathjax/MathJax.js ] || need+=(libjs-mathjax)
  have_pkg fonts-noto-cjk || need+=(fonts-noto-cjk)
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    did+=("apt: ${need[*]}")
  fi
else
  echo "setup: no root apt-get here: the browser test skips without chromium; math needs libjs-mathjax" >&2
fi

# --- 2. + 3. Python packages and kestrel (editable) ------------------------------------------
# Prints what is missing: requirement lines not satisfied, and "kestrel" unless an editable
# install of this very checkout is found. Any error (say, no `packaging` yet) counts as missing.
missing=$("$PY" - "$PWD" <<'PYEOF' 2>/dev/null || echo "unknown"
import importlib.metadata as md, importlib.util, os, sys
from packaging.requirements import Requirement
root = sys.argv[1]
out = []
for line in open(os.path.join(root, "requirements.txt")):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate():
        continue
    try:
        ok = req.specifier.contains(md.version(req.name), True)   # pre-release versions count
    except md.PackageNotFoundError:
        ok = False
    if not ok:
        out.append(req.name)
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != root]   # not the checkout itself
os.chdir("/")
spec = importlib.util.find_spec("kestrel")
if spec is None or os.path.dirname(os.path.abspath(spec.origin)) != os.path.join(root, "kestrel"):
    out.append("kestrel")
print(" ".join(out))
PYEOF
)
if [ -n "$missing" ] && [ "$missing" != "kestrel" ]; then
  echo "setup: pip install -r requirements.txt (missing or outdated: $missing)"
  "$PY" -m pip install -q -r requirements.txt
  did+=("pip: requirements")
fi
case " $missing " in
  *" kestrel "*|*" unknown "*)
    echo "setup: pip install -e . (kestrel, editable)"
    "$PY" -m pip install -q --no-deps -e .
    did+=("pip: kestrel editable") ;;
esac

# --- 4. CuPy when there is an NVIDIA GPU -----------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1 && smi=$(nvidia-smi 2>/dev/null); then
  cuda=$(printf '%s\n' "$smi" | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\..*/\1/p' | head -1)
  if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('cupy') is None)" 2>/dev/null; then
    case "$cuda" in
      12|13) echo "setup: GPU with CUDA $cuda: pip install cupy-cuda${cuda}x (extra gpu-cuda$cuda)"
             "$PY" -m pip install -q "cupy-cuda${cuda}x"
             did+=("pip: cupy-cuda${cuda}x") ;;
      *) echo "setup: nvidia-smi reports CUDA '${cuda:-?}': install CuPy by hand (kestrel runs on NumPy without it)" >&2 ;;
    esac
  fi
fi

if [ ${#did[@]} -eq 0 ]; then
  echo "setup: nothing to do (packages, kestrel editable, system tools already in place)"
else
  echo "setup: done (${did[*]})"
fi
