"""The trainer's asynchronous rollouts (`rollout.max_staleness`): staleness 0 is the
synchronous run, staleness 1 trains one update behind, reproducibly, and checkpoints the
runner's state as of the trained step."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_gym.trainers.config import TrainConfig  # noqa: E402
from trace_gym.trainers.data import Sample  # noqa: E402
from trace_gym.trainers.loop import Trainer  # noqa: E402

from trace_gym.errors import ConfigError  # noqa: E402
from trace_gym.tree import load_trees  # noqa: E402


def _cfg(tmp_path, name, **rollout) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "steps": 3,
            "seed": 3,
            "out_dir": str(tmp_path / name),
            "save_trees": True,
            "save_every": 1,
            "tensorboard": False,
            "progress": False,
            "policy": {"kind": "custom"},
            "rollout": {
                "allocator": "trace",
                "predictor": "empirical",
                "root_budget": 6,
                "replays_per_root": 1.0,
                "candidates_per_step": 3,
                "group_size": 2,
                **rollout,
            },
            "algo": {"name": "treerpo"},
            "optim": {"lr": 1e-2, "micro_batch_size": 3, "mini_batch_size": 8},
        }
    )


def _run(tmp_path, name, policy_factory, env, **rollout):
    policy = policy_factory()
    policy.version = 0  # a versioned generator, as HFPolicy is: every sync bumps it
    tr = Trainer(_cfg(tmp_path, name, **rollout), policy=policy, env_factory=env)
    tr.run()
    return tr


def _trees(tmp_path, name, step):
    return [
        t.to_dict() for t in load_trees(tmp_path / name / "trees" / f"step_{step:06d}.jsonl.gz")
    ]


def _rows(tmp_path, name):
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def _same_weights(a, b):
    return all(
        torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True)
    )


def test_staleness_zero_is_todays_synchronous_run(tmp_path, policy_factory, guess_env_factory):
    plain = _run(tmp_path, "plain", policy_factory, guess_env_factory)
    zero = _run(tmp_path, "zero", policy_factory, guess_env_factory, max_staleness=0)
    for step in range(3):
        assert _trees(tmp_path, "plain", step) == _trees(tmp_path, "zero", step)
    assert _same_weights(plain, zero)
    assert "staleness_mean" not in _rows(tmp_path, "zero")[-1]


def test_staleness_one_trains_one_update_behind_and_reproduces(
    tmp_path, policy_factory, guess_env_factory
):
    a = _run(tmp_path, "a", policy_factory, guess_env_factory, max_staleness=1)
    b = _run(tmp_path, "b", policy_factory, guess_env_factory, max_staleness=1)
    sync = _run(tmp_path, "sync", policy_factory, guess_env_factory)
    first = None
    for step in range(3):
        assert _trees(tmp_path, "a", step) == _trees(tmp_path, "b", step)
        path = tmp_path / "a" / "trees" / f"step_{step:06d}.jsonl.gz"
        versions = {n.policy_version for t in load_trees(path) for n in t.nodes if n.parent}
        first = min(versions) if first is None else first
        assert versions == {first + max(0, step - 1)}  # step s: the weights after s - 1 updates
    assert _same_weights(a, b) and not _same_weights(a, sync)
    assert _trees(tmp_path, "a", 0) == _trees(tmp_path, "sync", 0)  # the same start
    rows = _rows(tmp_path, "a")
    assert [r["policy_lag"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(r["dropped_stale"] == 0 for r in rows) and rows[1]["samples"] > 0
    assert a.runner.policy is a.policy  # the producer handed the runner back


def test_a_checkpoint_holds_the_runner_state_of_the_trained_step(
    tmp_path, policy_factory, guess_env_factory, monkeypatch
):
    seen = []
    original = Trainer.save

    def save(self):
        seen.append((self.step, set(self.checkpoint_runner().history)))
        return original(self)

    monkeypatch.setattr(Trainer, "save", save)
    _run(tmp_path, "ck", policy_factory, guess_env_factory, max_staleness=1)
    prompts = [
        {t.prompt_id for t in load_trees(tmp_path / "ck" / "trees" / f"step_{s:06d}.jsonl.gz")}
        for s in range(3)
    ]
    assert prompts[1] - prompts[0]  # step 1 visits a prompt step 0 did not
    # after step 0 the producer has already grown step 1 (its prompts are in the live
    # runner's history), but the checkpoint of step 1 holds step 0's only
    assert seen[0] == (1, prompts[0])
    assert seen[1] == (2, prompts[0] | prompts[1])
    resumed = Trainer(
        _cfg(tmp_path, "ck", max_staleness=1),
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    assert resumed.load() and resumed.step == 3


def test_stale_rows_get_truncated_importance_weights(tmp_path, policy_factory, guess_env_factory):
    tr = Trainer(_cfg(tmp_path, "w"), policy=policy_factory(), env_factory=guess_env_factory)
    rows = [Sample([1, 2, 3], [0, 1, 1], 1.0, 1.0, [0.0, -1.0, -1.0], staleness=s) for s in (0, 1)]
    old = torch.tensor([[0.0, -0.5, -3.0], [0.0, -0.5, -3.0]])
    gen = torch.tensor([[0.0, -1.0, -1.0], [0.0, -1.0, -1.0]])
    known = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    assert tr._is_weights(rows[:1], old[:1], gen[:1], known[:1]) is None  # fresh: none
    w = tr._is_weights(rows, old, gen, known)
    assert torch.equal(w[0], torch.ones(3))  # the fresh row untouched
    assert w[1, 0] == 1.0  # not a known token
    assert w[1, 1] == pytest.approx(min(2.0, float(torch.exp(torch.tensor(0.5)))))
    assert w[1, 2] == pytest.approx(float(torch.exp(torch.tensor(-2.0))))
    tr.config.algo.stale_is_cap = 1.2
    assert tr._is_weights(rows, old, gen, known)[1, 1] == pytest.approx(1.2)


def test_bad_staleness_settings_fail_at_start_up(tmp_path):
    with pytest.raises(ConfigError, match="max_staleness"):
        _cfg(tmp_path, "bad", max_staleness=-1)
    d = _cfg(tmp_path, "bad2").to_dict()
    d["algo"]["stale_is_cap"] = 0.0
    with pytest.raises(ConfigError, match="stale_is_cap"):
        TrainConfig.from_dict(d)
