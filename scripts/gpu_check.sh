#!/usr/bin/env bash
# GPU checks, one JSON line per result, under 10 minutes on one GPU (no vLLM, no downloads;
# needs torch, transformers, peft):
#   1. scripts/gpu_check_step.py: one full TRACE training step (LoRA and full; empirical
#      predictor and the LM critic) with HF bf16 generation on a random-init Qwen3-0.6B-shaped
#      model: tokens/s, step time, peak memory;
#   2. scripts/gpu_check_fsdp.py: FSDP2 sharded training at the 0.6B shape on every visible GPU
#      (`trace-gym bench train` code) and the docs' memory formula against the measured peak
#      per rank (docs/distributed.md "Memory estimate").
# `scripts/gpu_check.sh --tiny --device cpu` is the CPU smoke run of both; GPU_CHECK=step or
# GPU_CHECK=fsdp runs one of them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
WHICH=${GPU_CHECK:-step,fsdp}
rc=0
if [[ ,$WHICH, == *,step,* ]]; then timeout 420 "$PY" scripts/gpu_check_step.py "$@" || rc=$?; fi
if [[ ,$WHICH, == *,fsdp,* ]] && [ "$rc" -ne 3 ]; then timeout 420 "$PY" scripts/gpu_check_fsdp.py "$@" || rc=$?; fi
exit "$rc"
