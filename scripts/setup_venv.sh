#!/usr/bin/env bash
# Create or update a virtual environment with everything trace-gym needs.
#   scripts/setup_venv.sh VENV_DIR [EXTRAS]
# Installs torch==2.13.0 first when torch is absent (a bare `torch` requirement would
# pull a multi-GB CUDA build), then the project (editable) with EXTRAS, then bfcl-eval
# without its dependencies (its full set pins numpy 1.26 and API clients) plus mpmath.
set -euo pipefail
VENV=${1:-.venv}
EXTRAS=${2:-all}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."
# The math sandbox runs cells and the answer verifier under bubblewrap. Install it when we
# are root and it is missing; never fail the set-up over it (the sandbox then falls back to
# weaker isolation with a warning, and the bwrap tests fail loudly).
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing bubblewrap (bwrap) for the math sandbox" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1 \
      || { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1; } \
      || echo "warning: could not install bubblewrap with apt-get; the math sandbox will use weaker isolation" >&2
  else
    echo "warning: bubblewrap (bwrap) is not installed; the math sandbox will use weaker isolation" \
         "(install it: apt-get install bubblewrap)" >&2
  fi
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
STAMP="$VENV/.trace-gym-stamp-$EXTRAS"
WANT=$(cat pyproject.toml scripts/setup_venv.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import trace_gym" 2>/dev/null; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$PY" -m pip install -q --upgrade pip
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e ".[$EXTRAS]"
"$PY" -m pip install -q --no-deps "bfcl-eval==2026.3.23"
"$PY" -m pip install -q "mpmath>=1.3"
echo "$WANT" > "$STAMP"
