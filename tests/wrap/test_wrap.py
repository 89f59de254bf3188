"""`trace_gym.wrap`: user envs, restore paths, the divergence error, spec strings."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import trace_gym
from trace_gym.checker import CheckpointContractError, check_checkpoint
from trace_gym.errors import CheckpointError, CheckpointRefused, ConfigError
from trace_gym.wrap import WrappedEnv, replay_cost


class CounterGame:
    """A user's own text env (no trace-gym base class): reach `goal` by 'inc'/'dec'."""

    def __init__(self, goal: int = 4, max_turns: int = 8):
        self.goal, self.max_turns = goal, max_turns

    def reset(self, seed=None):
        self.rng = np.random.default_rng(seed)
        self.value, self.t = int(self.rng.integers(0, 3)), 0
        return f"start at {self.value}, reach {self.goal}", {"goal": self.goal}

    def step(self, action):
        self.t += 1
        self.value += {"inc": 1, "dec": -1}.get(action.strip(), 0)
        noise = int(self.rng.integers(100))
        done = self.value == self.goal
        return (
            f"value={self.value} noise={noise}",
            float(done),
            done,
            self.t >= self.max_turns,
            {"t": self.t},
        )

    def example_action(self, rng):
        return "inc" if rng.random() < 0.7 else "dec"


class StateCounterGame(CounterGame):
    """The same game with its own get_state / set_state (the fast path)."""

    def get_state(self):
        return {"value": self.value, "t": self.t, "rng": self.rng.bit_generator.state}

    def set_state(self, s):
        self.value, self.t = s["value"], s["t"]
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = s["rng"]


class _GameHandle:
    """A `HandleCounterGame` checkpoint: restore() / release() (ares PR 96's shape)."""

    def __init__(self, owner, state):
        self.owner, self.state, self.released = owner, state, False

    def restore(self):
        if self.released:
            raise CheckpointError("handle released")
        StateCounterGame.set_state(self.owner, self.state)

    def release(self):
        self.released = True


class HandleCounterGame(StateCounterGame):
    """The game offering the checkpointable-environment protocol instead of get/set_state."""

    checkpointable = True
    get_state = set_state = None  # only the protocol: checkpoint() -> handle

    def checkpoint(self):
        return _GameHandle(self, StateCounterGame.get_state(self))


def _long_handle_game():
    return HandleCounterGame(goal=99, max_turns=50)


class RefusingGame(CounterGame):
    """Says it can checkpoint, then refuses: the wrapper replays from then on."""

    checkpointable = True

    def checkpoint(self):
        raise CheckpointRefused("checkpoint refused: not in this build")


_CALLS = [0]


class LeakyGame(CounterGame):
    """Deterministic for two steps, then reads a process-wide counter: not replayable."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        if self.t >= 3:
            _CALLS[0] += 1
            obs += f" calls={_CALLS[0]}"
        return obs, r, term, trunc, info


def _long_game():
    return CounterGame(goal=99, max_turns=50)


def _play(env, n, rng):
    for _ in range(n):
        env.step(env.example_action(rng))


@pytest.mark.parametrize("restore", ["replay", "copy"])
def test_user_env_passes_check_checkpoint(restore):
    env = trace_gym.wrap(CounterGame, restore=restore, num_tasks=5, max_turns=6)
    report = check_checkpoint(
        env,
        make_fresh=lambda: trace_gym.wrap(CounterGame, restore=restore, num_tasks=5, max_turns=6),
    )
    assert report["turns"] >= 2 and len(report["checkpoints"]) >= 2


def test_native_state_path_is_chosen_and_passes():
    env = trace_gym.wrap(StateCounterGame, num_tasks=5)
    assert env.restore_mode == "state"
    check_checkpoint(env, make_fresh=lambda: trace_gym.wrap(StateCounterGame, num_tasks=5))
    assert replay_cost(env) == 0  # never replayed: set_state did the work


def test_replay_restores_and_counts_steps():
    env = trace_gym.wrap(_long_game, num_tasks=3, max_turns=20)
    env.reset(seed=1, options={"task": 2})
    rng = np.random.default_rng(0)
    _play(env, 3, rng)
    ck = env.checkpoint()
    assert ck.payload["state"]["seed"] == 2 and len(ck.payload["state"]["actions"]) == 3
    after = [env.step("inc") for _ in range(2)]
    fresh = trace_gym.wrap(_long_game, num_tasks=3, max_turns=20)
    fresh.restore(pickle.loads(pickle.dumps(ck)))
    assert replay_cost(fresh) == 3
    assert [fresh.step("inc") for _ in range(2)] == after


def test_copy_handle_survives_reuse_and_pickle_falls_back_to_replay():
    env = trace_gym.wrap(_long_game, restore="copy", num_tasks=3, max_turns=20)
    env.reset(options={"task": 0})
    _play(env, 2, np.random.default_rng(1))
    ck = env.checkpoint()
    assert ck.local is not None
    first = [env.step("inc") for _ in range(3)]
    for _ in range(2):  # the handle is copied on restore, so it can be restored twice
        env.restore(ck)
        assert [env.step("inc") for _ in range(3)] == first
    env.restore(pickle.loads(pickle.dumps(ck)))  # no local handle: replay
    assert replay_cost(env) == 2
    assert [env.step("inc") for _ in range(3)] == first


def test_non_deterministic_env_fails_naming_the_step():
    env = trace_gym.wrap(LeakyGame, num_tasks=2, max_turns=20)
    env.reset(options={"task": 0})
    for _ in range(4):
        env.step("dec")
    ck = env.checkpoint()
    with pytest.raises(CheckpointError, match=r"replay diverged at step 3 \('dec'\)"):
        trace_gym.wrap(LeakyGame, num_tasks=2, max_turns=20).restore(ck)
    with pytest.raises((CheckpointError, CheckpointContractError), match=r"step [23]"):
        check_checkpoint(
            env,
            make_fresh=lambda: trace_gym.wrap(LeakyGame, num_tasks=2, max_turns=20),
            action_fn=lambda e, rng: "dec",
            max_steps=6,
        )


def test_global_random_is_owned_by_the_env():
    """A gem-style env seeded through the global `random`: the caller's draws don't leak in."""

    class GlobalRandomGame(CounterGame):
        def reset(self, seed=None):
            random.seed(seed)
            self.value, self.t = 0, 0
            return "go", {}

        def step(self, action):
            self.t += 1
            return f"roll={random.randint(0, 10**6)}", 0.0, False, False, {}

    env = trace_gym.wrap(GlobalRandomGame, num_tasks=2, max_turns=10)
    env.reset(options={"task": 1})
    env.step("a")
    ck = env.checkpoint()
    want = [env.step("a")[0] for _ in range(3)]
    random.random()  # the caller uses the global generator in between
    env.restore(ck)
    assert [env.step("a")[0] for _ in range(3)] == want
    check_checkpoint(
        env, make_fresh=lambda: trace_gym.wrap(GlobalRandomGame, num_tasks=2, max_turns=10)
    )


def test_inner_truncation_ends_the_episode():
    env = trace_gym.wrap(lambda: CounterGame(goal=99, max_turns=2), num_tasks=1)
    env.reset()
    assert env.step("inc")[3] is False
    obs, r, term, trunc, info = env.step("inc")
    assert trunc and not term and info["truncation"] == "inner" and env.done


def test_registered_id_with_a_module_spec():
    env = gym.make(
        "trace/Wrapped-v0", env="trace_gym.testing:CountdownEnv", env_kwargs={"num_tasks": 4}
    )
    assert isinstance(env.unwrapped, WrappedEnv)
    check_checkpoint(env)


def test_bad_specs_are_config_errors():
    with pytest.raises(ConfigError, match="not 'gem:<id>'"):
        trace_gym.wrap("nocolon")
    with pytest.raises(ConfigError, match="cannot import"):
        trace_gym.wrap("trace_gym.testing:NoSuchEnv")
    with pytest.raises(ConfigError, match="restore="):
        trace_gym.wrap(CounterGame, restore="magic")
    with pytest.raises(ConfigError, match="get_state"):
        trace_gym.wrap(CounterGame, restore="state")


def test_checkpoint_from_another_spec_is_refused():
    a = trace_gym.wrap(CounterGame, num_tasks=3)
    a.reset(options={"task": 0})
    b = trace_gym.wrap(CounterGame, num_tasks=4)
    with pytest.raises(CheckpointError, match="task set"):
        b.restore(a.checkpoint())


def test_core_import_pulls_no_peer_package():
    code = (
        "import sys, trace_gym, gymnasium as gym; gym.make('trace/Wrapped-v0').reset(seed=0); "
        "bad = [m for m in ('gem', 'reasoning_gym') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_wrapped_env_announces_its_success_threshold():
    from trace_gym.tree import success_threshold_for

    env = trace_gym.wrap(CounterGame, num_tasks=2)
    assert success_threshold_for(env.reset(seed=0)[1]) == 1.0
    env = trace_gym.wrap(CounterGame, num_tasks=2, success_threshold=0.8)
    assert success_threshold_for(env.reset(seed=0)[1]) == 0.8
    with pytest.raises(ConfigError, match="success_threshold"):
        trace_gym.wrap(CounterGame, success_threshold=0.0)


def test_checkpointable_protocol_restores_by_handle_and_falls_back_to_replay():
    env = trace_gym.wrap(_long_handle_game, num_tasks=3, max_turns=20)
    assert env.restore_mode == "handle"
    env.reset(options={"task": 1})
    _play(env, 2, np.random.default_rng(2))
    ck = env.checkpoint()
    first = [env.step("inc") for _ in range(3)]
    env.restore(ck)
    assert [env.step("inc") for _ in range(3)] == first and replay_cost(env) == 0
    env.restore(pickle.loads(pickle.dumps(ck)))  # the handle stays in this process
    assert [env.step("inc") for _ in range(3)] == first and replay_cost(env) == 2
    env.release(ck)  # a released handle is let go: replay
    env.restore(ck)
    assert [env.step("inc") for _ in range(3)] == first and replay_cost(env) == 4
    other = trace_gym.wrap(_long_handle_game, num_tasks=3, max_turns=20)
    other.restore(env.checkpoint())  # another env's handle is never used
    assert replay_cost(other) == 5
    check_checkpoint(
        env, make_fresh=lambda: trace_gym.wrap(_long_handle_game, num_tasks=3, max_turns=20)
    )


def test_an_explicit_refusal_switches_to_replay():
    env = trace_gym.wrap(lambda: RefusingGame(goal=99, max_turns=50), num_tasks=3, max_turns=20)
    assert env.restore_mode == "handle"
    env.reset(options={"task": 0})
    env.step("inc")
    ck = env.checkpoint()
    assert env.restore_mode == "replay" and ck.local is None
    after = env.step("inc")
    env.restore(ck)
    assert env.step("inc") == after and replay_cost(env) == 1
    with pytest.raises(ConfigError, match="has no checkpoint"):
        trace_gym.wrap(CounterGame, restore="handle")
