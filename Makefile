# trace-gym: make setup | demo | test | bench
# Each target creates/updates its own virtual environment ($(VENV)).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test test-slow test-all bench lint typecheck

setup:
	@scripts/setup_venv.sh $(VENV) all

demo: setup
	$(PY) -m trace_gym.cli demo

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

# the slow set alone (CI runs it after `make test`, see .ci/run)
test-slow: setup
	$(PY) -m pytest -q -m "slow and not gpu" --durations=25 $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest -q -m "not gpu" $(PYTEST_ARGS)

bench: setup
	$(PY) -m trace_gym.cli bench alloc-speed
	$(PY) -m trace_gym.cli bench alloc --preset math
	$(PY) -m trace_gym.cli bench math-env
	$(PY) -m trace_gym.cli bench retrieval
	$(PY) -m trace_gym.cli bench bfcl

# ruff and mypy are pinned in the dev extra: another version formats (or infers) differently
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# mypy on the modules listed in pyproject.toml's [tool.mypy] files (docs/development.md)
typecheck: setup
	$(PY) -m mypy
