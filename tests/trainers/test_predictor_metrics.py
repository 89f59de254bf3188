"""The predictor's health on realised groups in the training metrics, with the LM critic."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from trace_gym.trainers.predictor_metrics import predictor_metrics

from trace_gym.predict.health import gain_rank


def _scored(flat_tree, rewards, value):
    t = flat_tree(rewards)
    t.root.value = value
    return t


def test_gain_rank_against_realised_groups(make_flat_tree):
    """v (1 - v) ranks the realised mixedness z (1 - z): right order -> 1, reversed -> -1,
    a constant predictor -> nan; calibration against the groups' leaves."""
    groups = [(1, 1, 1, 1), (1, 0, 0, 0), (1, 1, 0, 0), (0, 0, 0, 0)]  # z = 1, .25, .5, 0
    good = [0.95, 0.3, 0.5, 0.02]
    trees = [_scored(make_flat_tree, g, v) for g, v in zip(groups, good, strict=True)]
    m = predictor_metrics(trees, predictor_s=1.0, step_s=40.0)
    z = [np.mean(g) for g in groups]
    assert m["predictor_gain_rank"] == pytest.approx(gain_rank(good, z))
    assert m["predictor_gain_rank"] > 0.9  # below 1 only by the tie z = 0 / z = 1
    assert m["predictor_scored"] == 4 and m["predictor_distinct"] == 4
    assert m["predictor_share"] == pytest.approx(0.025)
    assert 0 <= m["predictor_ece"] < 0.1 and 0 < m["predictor_brier"] < 0.25
    assert math.isnan(m["predictor_gain_rank_prefix"])  # flat trees: no scored prefix
    bad = [
        _scored(make_flat_tree, g, v) for g, v in zip(groups, [0.5, 0.02, 0.97, 0.45], strict=True)
    ]
    assert predictor_metrics(bad, 0.0, 1.0)["predictor_gain_rank"] < -0.5
    flat = [_scored(make_flat_tree, g, 0.5) for g in groups]
    mc = predictor_metrics(flat, 0.0, 1.0)
    assert math.isnan(mc["predictor_gain_rank"]) and mc["predictor_distinct"] == 1
    empty = predictor_metrics([], 0.0, 0.0)
    assert math.isnan(empty["predictor_gain_rank"]) and math.isnan(empty["predictor_share"])


def test_prefix_values_count_apart(make_trace_tree):
    t = make_trace_tree()
    t.root.value, t.nodes[1].value = 0.5, 0.4
    m = predictor_metrics([t], 0.0, 1.0)
    assert m["predictor_scored"] == 1  # the root; the prefix is counted by the prefix figure
    assert math.isnan(m["predictor_gain_rank_prefix"])  # one prefix: undefined, not 0


TINY_CRITIC = {
    "device": "cpu",
    "max_tokens": 48,
    "lr": 3e-3,
    "epochs": 3,
    "batch_size": 8,
    "tiny": {
        "vocab_size": 384,
        "hidden_size": 32,
        "intermediate_size": 64,
        "head_dim": 16,
        "episodes_per_env": 16,
    },
}


def test_train_logs_the_critics_health_and_its_update_fits_the_targets(
    tmp_path, policy_factory, guess_env_factory
):
    """Two steps of `trace-gym train` with the critic as the predictor: every row of
    metrics.jsonl has its gain_rank (finite, or nan when undefined) and time share, and
    the runner's update moved the critic's predictions toward the step's tree targets."""
    pytest.importorskip("transformers")
    from trace_gym.trainers.config import TrainConfig
    from trace_gym.trainers.loop import Trainer

    from trace_gym.predict import training_batch

    cfg = TrainConfig.from_dict(
        {
            "steps": 2,
            "seed": 3,
            "out_dir": str(tmp_path / "run"),
            "save_trees": True,
            "tensorboard": False,
            "progress": False,
            "policy": {"kind": "custom"},
            "rollout": {
                "allocator": "trace",
                "predictor": "critic",
                "predictor_kwargs": TINY_CRITIC,
                "root_budget": 8,
                "replays_per_root": 1.0,
                "candidates_per_step": 4,
                "group_size": 2,
            },
            "algo": {"name": "treerpo"},
            "optim": {"lr": 1e-3, "micro_batch_size": 4, "mini_batch_size": 8},
        }
    )
    trainer = Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)
    critic = trainer.runner.predictor
    assert critic.name == "critic"
    initial = critic.state_dict()
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        for key in ("predictor_gain_rank", "predictor_gain_rank_prefix", "predictor_ece"):
            assert isinstance(r[key], float), key  # finite, or nan when undefined
        assert r["predictor_scored"] >= 1 and 0 < r["predictor_share"] < 1
    # the critic starts at a constant (zero head): step 0's ranking is undefined
    assert math.isnan(rows[0]["predictor_gain_rank"]) and rows[0]["predictor_distinct"] == 1
    from trace_gym.tree import load_trees

    trees = load_trees(tmp_path / "run" / "trees" / "step_000000.jsonl.gz")
    states, y, w = training_batch(trees, prefix_share=0.06, rng=np.random.default_rng(0))
    after = critic.predict(states)
    critic.load_state_dict(initial)
    before = critic.predict(states)
    err = lambda v: float(np.average(np.abs(v - y), weights=w))  # noqa: E731
    assert err(after) < err(before) - 0.02
