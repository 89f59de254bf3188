"""Slow end-to-end pipeline checks: success rises under RL; TRACE / TreePO / GRPO at equal budget."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers")

from trace_gym.trainers.config import TrainConfig  # noqa: E402
from trace_gym.trainers.loop import Trainer  # noqa: E402


@pytest.mark.slow
def test_char_model_learns_the_guess_task(tmp_path, policy_factory, guess_env_factory):
    cfg = TrainConfig.from_dict(
        {
            "steps": 25,
            "seed": 0,
            "out_dir": str(tmp_path / "run"),
            "save_every": 0,
            "tensorboard": False,
            "progress": False,
            "eval_every": 25,
            "eval_tasks": 4,
            "eval_samples": 16,
            "policy": {"kind": "custom"},
            "rollout": {
                "allocator": "trace",
                "root_budget": 16,
                "replays_per_root": 1.0,
                "candidates_per_step": 4,
                "group_size": 4,
                "m_max": 8,
            },
            "algo": {"name": "treerpo"},
            "optim": {"lr": 3e-3, "micro_batch_size": 16, "mini_batch_size": 8, "epochs": 2},
        }
    )
    tr = Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)
    before = tr.evaluate()["success"]
    after = tr.run()[-1]["eval_success"]
    assert after >= before + 0.2, (before, after)


@pytest.mark.slow
@pytest.mark.timeout(
    1800
)  # 9 runs x 30 steps: 6 min quiet, but it hit the default 600 s at load 10+
def test_sim_pipeline_three_methods_three_seeds(tmp_path):
    pytest.importorskip("transformers")
    from trace_gym.bench.pipeline import METHODS, compare

    # the tiny model is built once into the shared cache (~/.cache/trace-gym or $TRACE_GYM_CACHE)
    rep = compare(
        list(METHODS), [0, 1, 2], steps=30, out=tmp_path / "pipe"
    )  # 6 min on a quiet 2-core machine
    for method, row in rep["summary"].items():
        assert all(math.isfinite(v) for v in row["gain"]), method
        assert 20.0 <= row["accounted_cost"][0] <= 24.0 + 1e-9, (
            method
        )  # equal accounted budget (24)
    gains = [r["after"] - r["before"] for rs in rep["runs"].values() for r in rs]
    assert sum(gains) / len(gains) > 0.0, gains  # success rises on average under RL
