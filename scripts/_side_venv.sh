# Sourced by the set-up scripts of the side venvs (setup_vllm_venv.sh,
# setup_pyserini_venv.sh), run from the repository root:
#   side_venv_begin VENV NAME "IMPORTS" SCRIPT
# creates VENV if needed and sets PY, STAMP and WANT; exits the calling script when the
# stamp matches (pyproject.toml, SCRIPT and this file unchanged) and IMPORTS import;
# otherwise readies pip and installs CPU torch first (a bare torch requirement would pull
# a multi-GB CUDA build). The caller installs the rest, then: echo "$WANT" > "$STAMP".
side_venv_begin() {
  local venv=$1 name=$2 imports=$3 script=$4
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  PY="$venv/bin/python"
  STAMP="$venv/.trace-gym-$name-stamp"
  WANT=$(cat pyproject.toml "$script" scripts/_side_venv.sh | sha256sum | cut -c1-16)
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import $imports" 2>/dev/null; then
    exit 0
  fi
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  "$PY" -m pip install -q --upgrade pip
  "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
}
