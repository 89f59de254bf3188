#!/usr/bin/env bash
# One full TRACE training step (LoRA and full; empirical predictor and the LM critic) with
# HF bf16 generation on a random-init Qwen3-0.6B-shaped model; JSON lines of tokens/s, step
# time and peak memory. Needs torch, transformers, peft (no vLLM, no downloads); under
# 10 minutes on one GPU. `scripts/gpu_check.sh --tiny --device cpu` is the CPU smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec timeout 600 "$PY" scripts/gpu_check_step.py "$@"
