#!/usr/bin/env bash
# Create or update a virtual environment with everything trace-gym needs.
#   scripts/setup_venv.sh VENV_DIR [EXTRAS]
# Installs torch==2.13.0 first when torch is absent (a bare `torch` requirement would
# pull a multi-GB CUDA build), then the project (editable) with EXTRAS, then bfcl-eval
# without its dependencies (its full set pins numpy 1.26 and API clients) plus mpmath,
# then (EXTRAS with verl) verl's agent-loop interfaces without verl's dependency set.
set -euo pipefail
VENV=${1:-.venv}
EXTRAS=${2:-all}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."
# System packages, installed with apt when we are root and they are missing; never fail the
# set-up over them (warn instead: the tests that need them then fail, saying what to install).
#   bubblewrap: the math sandbox runs cells and the answer verifier under bwrap (without it
#               the sandbox falls back to weaker isolation with a warning)
#   chromium + chromium-driver: the browser tests of the tree viewer
apt_install() {  # apt_install WHAT PACKAGE...
  local what=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup_venv.sh: installing $* ($what)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "$@" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$@" >/dev/null 2>&1; } \
      || echo "setup_venv.sh: warning: apt-get could not install $* ($what)" >&2
  else
    echo "setup_venv.sh: warning: $* missing ($what); run: sudo apt-get install -y $*" >&2
  fi
}
command -v bwrap >/dev/null 2>&1 || apt_install "the math sandbox" bubblewrap
# found as trace_gym.bench.browser finds them: $TRACE_GYM_CHROMIUM / $TRACE_GYM_CHROMEDRIVER,
# else chromium (chromium-browser, google-chrome) and chromedriver on PATH
have_browser() {
  if [ -n "${TRACE_GYM_CHROMIUM:-}" ]; then command -v "$TRACE_GYM_CHROMIUM" >/dev/null 2>&1 || return 1
  else command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
    || command -v google-chrome >/dev/null 2>&1 || return 1
  fi
  command -v "${TRACE_GYM_CHROMEDRIVER:-chromedriver}" >/dev/null 2>&1
}
have_browser || apt_install "the browser tests" chromium chromium-driver
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
STAMP="$VENV/.trace-gym-stamp-$EXTRAS"
WANT=$(cat pyproject.toml scripts/setup_venv.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import trace_gym" 2>/dev/null; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip's own output (what it collects, downloads and builds, with its progress bars) is
# shown; SETUP_QUIET=1 makes it quiet. Each step prints one line when it starts and one
# with its time when it ends, so a long install is never a silent wait.
PIP_Q=()
[ "${SETUP_QUIET:-0}" = 1 ] && PIP_Q=(-q)
case ",$EXTRAS," in *,verl,*) NSTEPS=6 ;; *) NSTEPS=5 ;; esac
STEP=0
T_ALL=$SECONDS
step() {  # step "what it does" command...
  local what=$1 t0=$SECONDS
  shift
  STEP=$((STEP + 1))
  echo "setup [$STEP/$NSTEPS] $what ..." >&2
  "$@"
  echo "setup [$STEP/$NSTEPS] $what: done in $((SECONDS - t0)) s" >&2
}
install_torch() { "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install "${PIP_Q[@]}" "torch==2.13.0"; }
step "pip itself" "$PY" -m pip install "${PIP_Q[@]}" --upgrade pip
step "torch 2.13.0 (CPU build; skipped when present)" install_torch
step "trace-gym, editable, with extras [$EXTRAS]" "$PY" -m pip install "${PIP_Q[@]}" -e ".[$EXTRAS]"
step "bfcl-eval without its dependencies" "$PY" -m pip install "${PIP_Q[@]}" --no-deps "bfcl-eval==2026.3.23"
step "mpmath (bfcl-eval's one needed dependency)" "$PY" -m pip install "${PIP_Q[@]}" "mpmath>=1.3"
# verl's agent-loop interfaces (trace_gym.trainers.verl_adapter), without verl's own
# dependency set (see the `verl` extra in pyproject.toml for why); hydra-core and omegaconf
# need the antlr4 4.9.3 runtime, and math-verify's LaTeX parser judges some answers
# differently on 4.9.3 than on its own 4.13.2 ("25" vs "25\%"), so verl gets a venv of its
# own (scripts/setup_verl_venv.sh) and `all` leaves it out
install_verl() {
  "$PY" -m pip install "${PIP_Q[@]}" --no-deps "verl==0.9.1" "hydra-core==1.3.2" "omegaconf==2.3.0" \
    "antlr4-python3-runtime==4.9.3"
  # verl's wheel also ships its own top-level `tests` package; in site-packages it shadows
  # this project's tests/ wherever the checkout is not first on sys.path (Ray workers
  # unpickling test helpers by module name), so it goes (tests/test_ci.py checks)
  "$PY" -c 'import pathlib, shutil, sysconfig; t = pathlib.Path(sysconfig.get_paths()["purelib"], "tests"); (t / "special_e2e").is_dir() and shutil.rmtree(t)'
}
case ",$EXTRAS," in *,verl,*)
  step "verl 0.9.1, hydra-core, omegaconf, antlr4 4.9.3 without their dependencies" install_verl ;;
esac
echo "setup: $VENV ready in $((SECONDS - T_ALL)) s" >&2
echo "$WANT" > "$STAMP"
