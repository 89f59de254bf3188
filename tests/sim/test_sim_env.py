"""`trace/Sim-v0` and `SimPolicy`: contract, determinism, true values, martingale identities."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import trace_gym
from trace_gym.checker import check_checkpoint
from trace_gym.policy import Conversation, Policy
from trace_gym.sim import PRESETS, SimEnv, SimPolicy, pool_values, true_value
from trace_gym.sim.sampling import sample_trees
from trace_gym.tree import Turn


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_checkpoint_contract_for_every_preset(preset):
    env = gym.make("trace/Sim-v0", preset=preset, num_tasks=16)
    report = check_checkpoint(env, max_steps=40, num_checkpoints=4)
    assert report["turns"] >= 2


def test_bad_text_is_a_wasted_turn_not_a_crash():
    env = SimEnv("math", num_tasks=4)
    env.reset(seed=0, options={"task": 1})
    obs, r, term, trunc, info = env.step("answer")  # before the first turn: refused
    assert not term and info["action"] == "malformed" and "at least one" in obs.lower()
    obs, r, term, trunc, info = env.step("\x00 garbage \ud800")
    assert info["action"] == "malformed"
    assert env.turn == 2


def test_episode_ends_at_the_task_turn_count_with_a_binary_reward():
    env = SimEnv("hotpotqa", num_tasks=8)
    for task in range(8):
        env.reset(seed=task, options={"task": task})
        while not env.done:
            _, r, term, trunc, _ = env.step("action 0")
        assert term and not trunc and r in (0.0, 1.0)
        assert env.turn == env.task.turns
        assert env.true_value() == r


def _play(env: SimEnv, policy: Policy, prompt: str, turns: list[Turn], rng: np.random.Generator):
    """Play to the end; returns the turns and the values Z after each turn (pre-draw at the end)."""
    values = []
    reward = 0.0
    while not env.done:
        conv = Conversation(
            env.id, env.task_id, prompt, tuple(turns), seed=int(rng.integers(2**63))
        )
        text = policy.generate([conv])[0].text
        obs, reward, *_ = env.step(text)
        turns.append(Turn(text, obs))
        values.append(true_value(env.task_id, [t.action for t in turns]))
    return turns, values, reward


def test_policy_is_deterministic_given_the_conversation_and_implements_the_protocol():
    policy = SimPolicy()
    assert isinstance(policy, Policy)
    conv = Conversation("trace/Sim-v0", "sim-math-0-5", "p", (), seed=42)
    a, b = policy.generate([conv, conv])
    assert a.text == b.text and a.token_ids == b.token_ids and a.token_ids
    texts = {
        policy.generate([Conversation("trace/Sim-v0", "sim-math-0-5", "p", (), seed=s)])[0].text
        for s in range(20)
    }
    assert len(texts) == 20  # the draft nonce differs by seed


def test_env_true_value_matches_the_pure_function_along_an_episode():
    env = SimEnv("hotpotqa", num_tasks=8, seed=3)
    policy = SimPolicy("hotpotqa")
    rng = np.random.default_rng(0)
    for task in range(8):
        prompt, _ = env.reset(seed=task, options={"task": task})
        assert env.true_value() == pytest.approx(true_value(env.task_id, []))
        turns: list[Turn] = []
        while not env.done:
            conv = Conversation(
                env.id, env.task_id, prompt, tuple(turns), seed=int(rng.integers(2**63))
            )
            text = policy.generate([conv])[0].text
            obs, *_ = env.step(text)
            turns.append(Turn(text, obs))
            if not env.done:
                assert env.true_value() == pytest.approx(
                    true_value(env.task_id, [t.action for t in turns])
                )


def _mid_state(preset: str):
    """An env restored to a prefix whose value is well inside (0, 1)."""
    env = SimEnv(preset, num_tasks=400, seed=0)
    policy = SimPolicy(preset)
    rng = np.random.default_rng(123)
    z0 = pool_values(preset, 400)
    for task in np.argsort(np.abs(z0 - 0.5))[:5]:
        prompt, _ = env.reset(seed=int(task), options={"task": int(task)})
        turns: list[Turn] = []
        for _ in range(2):
            conv = Conversation(
                env.id, env.task_id, prompt, tuple(turns), seed=int(rng.integers(2**63))
            )
            text = policy.generate([conv])[0].text
            obs, *_ = env.step(text)
            turns.append(Turn(text, obs))
            if env.done:
                break
        if not env.done and 0.15 < env.true_value() < 0.85:
            return env, policy, prompt, turns
    raise AssertionError("no mid-value prefix found; the preset changed?")


@pytest.mark.parametrize("preset", ["math", "hotpotqa", "bfcl"])
def test_martingale_and_quadratic_variation_by_monte_carlo(preset):
    """From a prefix H_t: E[Z_{t+1}] = Z_t and E[sum (Z_{s+1} - Z_s)^2] = V_t (1 - V_t),
    the sum ending with the jump to the realised reward (fixed seeds, 5 standard errors)."""
    env, policy, prompt, turns = _mid_state(preset)
    v = env.true_value()
    ck = env.checkpoint()
    rng = np.random.default_rng(7)
    n = 600 if preset != "bfcl" else 300
    first, qv, qv_env, rewards = [], [], [], []
    for _ in range(n):
        env.restore(ck)
        path, values, reward = _play(env, policy, prompt, list(turns), rng)
        z = np.array([v, *values, reward])
        first.append(z[1])
        qv.append(float(np.sum(np.diff(z) ** 2)))
        rewards.append(reward)
        # the env's own value process skips the pre-draw value: still a martingale ending in r
        qv_env.append(float(np.sum(np.diff(np.array([v, *values[:-1], reward])) ** 2)))
    for name, xs, want in [
        ("E[Z_t+1]", first, v),
        ("E[reward]", rewards, v),
        ("E[QV]", qv, v * (1 - v)),
        ("E[QV env]", qv_env, v * (1 - v)),
    ]:
        xs = np.asarray(xs)
        se = xs.std(ddof=1) / np.sqrt(len(xs))
        assert abs(xs.mean() - want) <= 5 * se + 1e-9, (
            f"{preset} {name}: {xs.mean():.4f} vs {want:.4f} (se {se:.4f})"
        )


def test_drift_makes_tasks_easier_and_moves_the_env_value():
    base = pool_values("math", 300)
    later = pool_values("math", 300, skill=PRESETS["math"].skill + 2.0)
    assert later.mean() > base.mean()
    env = SimEnv("math", num_tasks=300, drift=0.2)
    env.reset(seed=0, options={"task": int(np.argmin(np.abs(base - 0.5)))})
    v0 = env.true_value()
    env.set_step(10)
    assert env.skill == pytest.approx(PRESETS["math"].skill + 2.0)
    assert env.true_value() != v0
    policy = SimPolicy("math", drift=0.2)
    policy.set_step(10)
    assert policy.skill == pytest.approx(env.skill)


def test_sampled_trees_carry_true_values_and_targets():
    trees = sample_trees("math", 6, roots=4, replays_per_root=1)
    for tree in trees:
        assert tree.root.true_value is not None and tree.root.target is not None
        assert len(tree.leaves()) == 8
        for node in tree.nodes[1:]:
            if not node.terminal:
                acts = [t.action for t in tree.turns(node.id)]
                assert node.true_value == pytest.approx(true_value(tree.prompt_id, acts))
    # the effective ratio is the share of trees whose leaves saw both outcomes
    mixed = [len({leaf.reward for leaf in t.leaves()}) == 2 for t in trees]
    assert {leaf.reward for t in trees for leaf in t.leaves()} <= {0.0, 1.0}
    assert trace_gym.tree.effective_ratio(trees) == pytest.approx(sum(mixed) / len(trees))


def test_true_value_before_reset_says_what_to_do():
    from trace_gym.errors import ResetNeeded

    with pytest.raises(ResetNeeded, match="call env.reset"):
        SimEnv("math", num_tasks=4).true_value()
