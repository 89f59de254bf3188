#!/usr/bin/env bash
# A virtual environment for the OpenEnv tests (tests/openenv, docs/openenv.md): the project
# with the `openenv` extra (OpenEnv 0.10 and its full dependency set, gradio included).
#   scripts/setup_openenv_venv.sh VENV_DIR
# Why its own venv: openenv requires gradio, whose pillow<13 would downgrade the main
# stack's pillow 13.0, so `all` leaves the extra out. CI (.ci/run) builds it fresh and
# runs `pytest -m openenv` there with TRACE_GYM_REQUIRE=openenv, so they cannot skip.
set -euo pipefail
VENV=${1:?usage: scripts/setup_openenv_venv.sh VENV_DIR}
exec "$(dirname "$0")/setup_venv.sh" "$VENV" "openenv,dev"
