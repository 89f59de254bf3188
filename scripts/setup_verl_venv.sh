#!/usr/bin/env bash
# A virtual environment for the verl adapter's tests: the project with the extras those
# tests use, plus verl 0.9.1's agent-loop interfaces (installed --no-deps by
# setup_venv.sh when the extras name verl).
#   scripts/setup_verl_venv.sh VENV_DIR
# Why its own venv: verl's configs need hydra-core 1.3 / omegaconf 2.3, which need the
# antlr4 4.9.3 runtime, and math-verify's LaTeX parser judges some answers differently on
# 4.9.3 than on the 4.13.2 it installs with ("25" vs "25\%", tests/math/test_bench_judge.py).
# CI (.ci/run) builds it fresh and runs `pytest -m verl` there with TRACE_GYM_REQUIRE=verl.
set -euo pipefail
VENV=${1:?usage: scripts/setup_verl_venv.sh VENV_DIR}
exec "$(dirname "$0")/setup_venv.sh" "$VENV" "train,math,ray,verl,dev"
