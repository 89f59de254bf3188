"""`trace/Wrapped-v0` on real peer packages (the `peers` extra: gem-llm, reasoning-gym)."""

from __future__ import annotations

import pickle

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401  (registers trace/Wrapped-v0)
from trace_gym.checker import check_checkpoint
from trace_gym.wrap import replay_cost

GEM_GAMES = ["game:GuessTheNumber-v0-easy", "game:Sudoku-v0-easy", "game:Game2048-v0-easy"]


def _sudoku_move(env, rng):
    """A well-formed (often illegal) Sudoku move: gem keeps the episode going on those."""
    r, c, v = rng.integers(1, 5, size=3)
    return f"\\boxed{{{r} {c} {v}}}"


@pytest.mark.parametrize("game", GEM_GAMES)
def test_gem_games_pass_check_checkpoint(game):
    env = gym.make("trace/Wrapped-v0", env=f"gem:{game}", num_tasks=20)
    assert env.unwrapped.restore_mode == "replay"  # gem's games have no get_state
    act = _sudoku_move if "Sudoku" in game else None
    report = check_checkpoint(env, max_steps=6, action_fn=act)
    assert report["turns"] >= 2 and len(report["checkpoints"]) >= 2


def test_gem_replay_restores_a_mid_episode_state():
    env = gym.make("trace/Wrapped-v0", env="gem:game:GuessTheNumber-v0-easy", num_tasks=20)
    base = env.unwrapped
    base.reset(options={"task": 3})
    base.step("\\boxed{5}")
    base.step("\\boxed{12}")
    ck = base.checkpoint()
    want = base.step("\\boxed{9}")
    fresh = gym.make(
        "trace/Wrapped-v0", env="gem:game:GuessTheNumber-v0-easy", num_tasks=20
    ).unwrapped
    fresh.restore(pickle.loads(pickle.dumps(ck)))
    assert replay_cost(fresh) == 2
    assert fresh.step("\\boxed{9}") == want


def test_gem_native_state_path_on_its_reasoning_gym_env():
    env = gym.make("trace/Wrapped-v0", env="gem:rg:basic_arithmetic", num_tasks=10)
    assert env.unwrapped.restore_mode == "state"  # gem's own get_state / set_state
    check_checkpoint(env, action_fn=lambda e, rng: "\\boxed{0}")
    assert replay_cost(env) == 0


def test_reasoning_gym_dataset_graded_reward():
    env = gym.make(
        "trace/Wrapped-v0",
        env="reasoning_gym:basic_arithmetic",
        env_kwargs={"size": 20, "seed": 3},
        num_tasks=20,
    )
    check_checkpoint(env)
    base = env.unwrapped
    prompt, info = base.reset(options={"task": 4})
    gold = base.inner.entry["answer"]
    assert prompt == base.inner.ds[4]["question"]
    _, reward, terminated, _, _ = base.step(f"The answer is \\boxed{{{gold}}}")
    assert terminated and reward == 1.0
    base.reset(options={"task": 4})
    assert base.step("\\boxed{not a number}")[1] == 0.0


def test_bench_alloc_runs_on_a_wrapped_peer_env(tmp_path):
    """`bench alloc --env trace/Wrapped-v0 --policy scripted` on reasoning-gym (graded rewards)."""
    import json

    from trace_gym.bench.alloc import main

    kwargs = {
        "env": "reasoning_gym:basic_arithmetic",
        "env_kwargs": {"size": 200},
        "num_tasks": 200,
    }
    argv = [
        "--env",
        "trace/Wrapped-v0",
        "--policy",
        "scripted",
        "--env-kwargs",
        json.dumps(kwargs),
        "--steps",
        "2",
        "--roots",
        "32",
        "--replays",
        "1",
        "--policies",
        "trace,grpo",
        "--no-progress",
        "--json",
        str(tmp_path / "s.json"),
    ]
    assert main(argv) == 0
    d = json.loads((tmp_path / "s.json").read_text())
    # the scripted answers are right half the time; wrong ones score partial credit
    # (often > 0.5), so groups are mixed on raw rewards and, at the wrapped env's
    # exact-success threshold, hold success/failure pairs
    assert (
        d["policies"]["grpo"]["mixed_groups"] > 0 and d["policies"]["grpo"]["contrastive_pairs"] > 0
    )
    assert d["policies"]["trace"]["failed_branches"] == 0
