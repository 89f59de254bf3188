"""TRACE rollouts inside TRL's GRPOTrainer: exact advantages through TRL's reward path, end to end."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")

from trace_gym.trainers.trl_adapter import (  # noqa: E402
    Row,
    TRLRolloutConfig,
    check_grpo_args,
    pack_rows,
    trace_advantage,
    unit_rows,
)

from trace_gym.errors import ConfigError, UnknownNameError  # noqa: E402


def _row(reward: float, n: int = 2) -> Row:
    return Row([1, 2], [5] * n, [1] * n, [-0.5] * n, reward, (0, (1,)))


def trl_centring(rewards: list[float], group: int) -> np.ndarray:
    """TRL's advantage with scale_rewards="none": r - mean over each block of `group` rows."""
    r = np.asarray(rewards, dtype=np.float32).reshape(-1, group)
    return (r - r.mean(axis=1, keepdims=True)).reshape(-1)


@pytest.mark.parametrize("group", [2, 3, 4])
def test_packing_makes_trl_centring_the_identity_on_unit_rows(group):
    rng = np.random.default_rng(group)
    rows = [_row(float(a)) for a in rng.normal(size=7)]
    n_rows = group * math.ceil(7 / (group - 1))
    packed, dropped = pack_rows(rows, n_rows, group, pad_id=0, eos_id=9)
    assert dropped == 0 and len(packed) == n_rows
    adv = trl_centring([r.reward for r in packed], group)
    units = [(i, r) for i, r in enumerate(packed) if r.unit is not None]
    assert [r.reward for _, r in units] == [r.reward for r in rows]  # order kept
    np.testing.assert_allclose([adv[i] for i, _ in units], [r.reward for r in rows], atol=1e-5)
    for r in packed:
        if r.unit is None:  # balance / empty rows train nothing
            assert r.env_mask == [0] and r.completion_ids == [9] and r.prompt_ids == [0]


def test_packing_drops_the_smallest_advantages_when_the_batch_is_full():
    rows = [_row(a) for a in (0.1, -2.0, 0.05, 1.5, -0.3)]
    packed, dropped = pack_rows(rows, 4, 2, pad_id=0, eos_id=9)  # 2 blocks x 1 unit
    assert dropped == 3
    assert [r.reward for r in packed if r.unit is not None] == [-2.0, 1.5]
    with pytest.raises(ConfigError, match="num_generations"):
        pack_rows(rows, 5, 2, pad_id=0, eos_id=9)


def test_unit_rows_split_prompt_and_completion_and_fold_weights(make_trace_tree):
    tree = make_trace_tree()
    rows, counts = unit_rows([tree], TRLRolloutConfig(advantage="grpo", prompt_weight="roots"))
    assert (
        counts["units"] == 3 and len(rows) == 3
    )  # three scored leaves, all with nonzero advantage
    for r in rows:
        assert r.prompt_ids == [1, 2]
        assert len(r.completion_ids) == len(r.env_mask) == len(r.logprobs)
    # leaf 3's path: turns 1 (10 11, obs 20), 2 (12, obs 21 22), 3 (13 14)
    leaf3 = next(r for r in rows if r.unit[1][-1] == 3)
    assert leaf3.completion_ids == [10, 11, 20, 12, 21, 22, 13, 14]
    assert leaf3.env_mask == [1, 1, 0, 1, 0, 0, 1, 1]
    # grpo over rewards (0, 1, 1), weight m / U = 2 / 3 folded into the reward
    expected = (0.0 - 2 / 3) / (np.std([0.0, 1.0, 1.0], ddof=1) + 1e-6) * (2 / 3)
    assert leaf3.reward == pytest.approx(expected)


def test_config_and_grpo_args_are_checked():
    with pytest.raises(UnknownNameError):
        TRLRolloutConfig(advantage="ppo")
    with pytest.raises(ConfigError, match="root_budget"):
        TRLRolloutConfig(root_budget=0)
    ok = dict(
        scale_rewards="none",
        multi_objective_aggregation="sum_then_normalize",
        reward_weights=None,
        use_vllm=False,
        temperature=1.0,
    )
    policy = SimpleNamespace(sampling=SimpleNamespace(temperature=1.0))
    check_grpo_args(SimpleNamespace(**ok), policy)
    for bad, match in (
        ({"scale_rewards": "group"}, "scale_rewards"),
        ({"use_vllm": True}, "use_vllm"),
        ({"temperature": 0.7}, "temperature"),
        ({"reward_weights": [2.0]}, "reward_weights"),
    ):
        with pytest.raises(ConfigError, match=match):
            check_grpo_args(SimpleNamespace(**{**ok, **bad}), policy)
    with pytest.raises(ConfigError, match="rollout_func"):
        trace_advantage(["p"], ["c"])


# ---------------------------------------------------------------------- end to end
ROOTS, G, CANDIDATES, M_MAX = 8, 4, 4, 4


def _tiny_sim():
    """The warm-started tiny Qwen3 (40 SFT steps) and the learnable simulator preset (~0.44 success)."""
    import gymnasium as gym
    from trace_gym.agents.hf import HFPolicy
    from trace_gym.agents.tiny import default_test_config, tiny_model_dir
    from trace_gym.bench.pipeline import pipeline_preset

    model_dir = tiny_model_dir(default_test_config(env_kwargs={"trace/Sim-v0": {"num_tasks": 8}}))
    policy = HFPolicy.from_pretrained(str(model_dir), temperature=1.0, max_batch=32)
    preset = pipeline_preset()
    return policy, lambda: gym.make("trace/Sim-v0", preset=preset, num_tasks=8, seed=0)


def test_trl_grpo_trainer_trains_on_trace_trees(tmp_path, monkeypatch):
    import torch
    from trace_gym.trainers.trl_adapter import ALLOCATION_FILE, make_grpo_trainer
    from trl import GRPOConfig

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    policy, env_factory = _tiny_sim()
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=CANDIDATES * G,
        num_generations=G,
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        report_to=["tensorboard"],
        use_cpu=True,
        scale_rewards="none",
        learning_rate=1e-3,
        seed=0,
        temperature=1.0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    cfg = TRLRolloutConfig(
        root_budget=ROOTS, replays_per_root=0.5, m_max=M_MAX, advantage="treerpo", seed=0
    )
    trainer = make_grpo_trainer(policy, env_factory, args, cfg)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    # the generator is the module TRL trained, and TRL's update moved it
    assert policy.model is trainer.accelerator.unwrap_model(trainer.model)
    assert any(
        not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True)
    )
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3 and all(
        math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"]) for h in logs
    )
    assert all(h["trace/roots"] == ROOTS and h["trace/candidates"] == CANDIDATES for h in logs)
    assert sum(h["trace/unit_rows"] for h in logs) > 0 and max(h["grad_norm"] for h in logs) > 0

    # the allocation: TRACE's group sizes over TRL's sampled prompts, one record per generation batch
    records = [
        json.loads(line) for line in (tmp_path / "trl" / ALLOCATION_FILE).read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [0, 1, 2]
    for r, h in zip(records, logs, strict=True):
        sizes = list(r["group_sizes"].values())
        assert len(r["candidates"]) == CANDIDATES and set(r["group_sizes"]) <= set(r["candidates"])
        assert sum(sizes) == ROOTS and all(2 <= m <= M_MAX for m in sizes)
        assert (
            sum(r["replays"].values())
            == r["replays_total"]
            == h["trace/replays"]
            == round(0.5 * ROOTS)
        )
        assert h["trace/group_size_max"] == max(sizes) and h["trace/selected_prompts"] == len(sizes)
    last = trainer.rollout_func.last_trees
    assert {t.prompt_id: len(t.root.children) for t in last} == records[-1]["group_sizes"]

    # what TRL's loss saw for the last batch: exactly our packed advantages
    rows = trainer.rollout_func.last_rows
    np.testing.assert_allclose(
        list(trainer._logs["advantages"]), [r.reward for r in rows], atol=1e-5
    )

    # and the allocation reached TRL's TensorBoard logs
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = [p.parent for p in (tmp_path / "trl").rglob("events.out.tfevents.*")]
    acc = EventAccumulator(str(run))
    acc.Reload()
    assert [e.value for e in acc.Scalars("train/trace/roots")] == [ROOTS] * 3


@pytest.mark.slow  # two short TRL runs (~1 min on a shared 2-core machine)
def test_trl_checkpoints_carry_the_runner_state_into_a_resumed_run(tmp_path, monkeypatch):
    from trace_gym.trainers.trl_adapter import RUNNER_STATE_FILE, make_grpo_trainer
    from trl import GRPOConfig

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    cfg = TRLRolloutConfig(root_budget=ROOTS, replays_per_root=0.5, m_max=M_MAX, seed=0)

    def build(steps):
        policy, env_factory = _tiny_sim()
        args = GRPOConfig(
            output_dir=str(tmp_path / "trl"),
            per_device_train_batch_size=CANDIDATES * G,
            num_generations=G,
            max_steps=steps,
            save_strategy="steps",
            save_steps=1,
            report_to="none",
            use_cpu=True,
            scale_rewards="none",
            learning_rate=1e-3,
            seed=0,
            temperature=1.0,
            disable_tqdm=True,
        )
        return make_grpo_trainer(policy, env_factory, args, cfg)

    first = build(2)
    first.train()
    saved = dict(first.rollout_func.runner.history)
    assert saved and (tmp_path / "trl" / "checkpoint-2" / RUNNER_STATE_FILE).is_file()
    resumed = build(3)
    assert not resumed.rollout_func.runner.history
    resumed.train(resume_from_checkpoint=True)
    history = resumed.rollout_func.runner.history
    for prompt, visits in saved.items():  # steps 0-1 restored, step 2 appended
        assert history[prompt].rewards[: len(visits.rewards)] == visits.rewards
    assert sum(len(v.rewards) for v in history.values()) > sum(
        len(v.rewards) for v in saved.values()
    )
