"""TRL across processes: 2 accelerate ranks train as one process on TRACE trees of the global batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from trace_gym.trainers.trl_adapter import TraceRollout, TRLRolloutConfig  # noqa: E402

from trace_gym.errors import ConfigError  # noqa: E402
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy  # noqa: E402


def test_several_processes_refuse_a_runner_that_is_not_rank_sharded():
    rollout = TraceRollout(
        RandomCountdownPolicy(), lambda: CountdownEnv(num_tasks=4), TRLRolloutConfig(seed=0)
    )
    assert type(rollout.runner).__name__ == "BranchingRunner"  # no process group here
    trainer = SimpleNamespace(
        num_generations=2,
        model=SimpleNamespace(training=True),
        accelerator=SimpleNamespace(num_processes=2, process_index=0),
    )
    with pytest.raises(ConfigError, match="2 processes"):
        rollout(["count-0", "count-0"], trainer)


@pytest.mark.slow  # two TRL launches, one of 2 processes (~1 min on a shared 2-core machine)
def test_two_accelerate_processes_train_like_one(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("accelerate")
    from trace_gym.agents.tiny import default_test_config, tiny_model_dir
    from trace_gym.bench.trl_dist import DEFAULT_CONFIG, GOALS, run_bench

    # built once here, so the two ranks never race to build the cached model
    tiny_model_dir(default_test_config(env_kwargs={"trace/Sim-v0": {"num_tasks": 8}}))
    rep = run_bench({**DEFAULT_CONFIG, "steps": 2}, tmp_path, processes=2)

    assert rep["runner"] == "RankShardedRunner" and rep["ranks_agree"]
    # TRACE allocated M over the global batch (4 distinct prompts), not M per rank
    assert rep["roots_per_step"] == [DEFAULT_CONFIG["roots"]] * 2
    assert rep["candidates_per_step"] == [DEFAULT_CONFIG["candidates"]] * 2
    assert rep["allocation_equal"] and rep["trees_equal"]
    assert rep["tree_logprob_diff"] <= GOALS["tree_logprob_diff"]
    # what TRL's loss saw is our advantages, on both launches, and the same on both
    assert rep["trl_advantage_diff"] <= GOALS["trl_advantage_diff"]
    assert rep["advantage_diff"] <= GOALS["advantage_diff"]
    assert sum(rep["unit_rows"]) > 0
    # and TRL's update moved the weights the same way (fp32)
    assert rep["max_abs_weight_diff"] <= GOALS["max_abs_weight_diff"]
    assert rep["loss_diff"] <= 1e-5
    assert all(rep["met"].values())
