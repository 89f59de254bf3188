"""The env contract on the tiny reference env: reset, step, limits, checkpoint, errors."""

from __future__ import annotations

import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest

import trace_gym
from trace_gym.checker import CheckpointContractError, check_checkpoint
from trace_gym.core import Checkpoint, FreeText, Transition
from trace_gym.errors import CheckpointError, InvalidAction, ResetNeeded, TaskNotFound
from trace_gym.testing import CountdownEnv


def test_free_text_space_accepts_any_string():
    space = FreeText(max_length=50)
    assert space.contains("Hello, world! (x = 1; y = {2})\n\t<search>q</search>")
    assert not space.contains(b"bytes")
    assert not space.contains("x" * 51)
    assert all(space.contains(space.sample()) for _ in range(20))


def test_reset_by_id_index_and_random(countdown_env):
    obs, info = countdown_env.reset(seed=0, options={"task": "count-2"})
    assert info["task_id"] == "count-2" and "Reach 7" in obs
    _, info = countdown_env.reset(options={"task": 3})
    assert info["task_id"] == "count-3"
    ids = {countdown_env.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert len(ids) > 1
    # same seed, same task: the env's own RNG, not the global one
    np.random.seed(123)
    a = countdown_env.reset(seed=5)[1]["task_id"]
    np.random.seed(999)
    assert countdown_env.reset(seed=5)[1]["task_id"] == a


def test_unknown_task_says_how_to_fix(countdown_env):
    with pytest.raises(TaskNotFound, match="task_ids"):
        countdown_env.reset(options={"task": "nope"})
    with pytest.raises(TaskNotFound, match="out of range"):
        countdown_env.reset(options={"task": 99})


def test_turn_limit_is_the_envs_own(countdown_env):
    countdown_env.reset(seed=0, options={"task": 0})
    flags = [countdown_env.step("add 0")[3] for _ in range(countdown_env.max_turns)]
    assert flags == [False] * (countdown_env.max_turns - 1) + [True]
    with pytest.raises(ResetNeeded, match="restore a checkpoint"):
        countdown_env.step("add 1")


def test_step_before_reset_and_non_string_action(countdown_env):
    with pytest.raises(ResetNeeded, match="reset"):
        countdown_env.step("add 1")
    countdown_env.reset(seed=0)
    with pytest.raises(InvalidAction, match="strings"):
        countdown_env.step(3)  # type: ignore[arg-type]
    # malformed text is data, not an error
    obs, reward, term, trunc, info = countdown_env.step("what?")
    assert "unknown action" in obs and info["action"] == "invalid" and not term


def test_checkpoint_is_immutable_picklable_and_restores(countdown_env):
    countdown_env.reset(seed=3, options={"task": 1})
    countdown_env.step("add 2")
    ck = countdown_env.checkpoint()
    assert isinstance(ck, Checkpoint) and ck.turn == 1 and ck.task_id == "count-1"
    with pytest.raises(AttributeError):
        ck.turn = 5  # type: ignore[misc]
    after = [countdown_env.step(a) for a in ("add 1", "add 2")]
    clone = pickle.loads(pickle.dumps(ck))
    assert clone == ck
    fresh = CountdownEnv()
    fresh.restore(clone)  # no reset needed on a fresh instance
    assert [fresh.step(a) for a in ("add 1", "add 2")] == after
    assert fresh.turn == 3


def test_restore_rejects_other_envs_and_task_sets(countdown_env):
    countdown_env.reset(seed=0)
    ck = countdown_env.checkpoint()
    with pytest.raises(CheckpointError, match="task set"):
        CountdownEnv(num_tasks=3).restore(ck)
    other = Checkpoint("trace/Other-v0", ck.task_set, ck.task_id, ck.turn, ck.payload)
    with pytest.raises(CheckpointError, match="gym.make"):
        countdown_env.restore(other)
    with pytest.raises(CheckpointError, match="Checkpoint"):
        countdown_env.restore({"turn": 0})  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="reset"):
        CountdownEnv().checkpoint()


def test_checker_passes_on_reference_env():
    for seed in range(5):
        report = check_checkpoint(CountdownEnv(), make_fresh=CountdownEnv, seed=seed)
        assert report["turns"] >= 1


class _ForgetfulEnv(CountdownEnv):
    """Breaks the contract: its RNG draws are not restored."""

    def _step(self, action: str) -> Transition:
        self._leak = getattr(self, "_leak", 0) + 1
        t = super()._step(action)
        return t._replace(observation=f"{t.observation} leak={self._leak}")


def test_checker_catches_a_broken_env():
    with pytest.raises(CheckpointContractError, match="obs differs"):
        check_checkpoint(
            _ForgetfulEnv(),
            make_fresh=_ForgetfulEnv,
            action_fn=lambda env, rng: "add 1",
            run_gym_check_env=False,
        )


def test_wrapped_env_reaches_checkpoint_through_helpers():
    env = gym.wrappers.RecordEpisodeStatistics(CountdownEnv())
    env.reset(seed=0)
    ck = trace_gym.checkpoint(env)
    env.step("add 1")
    trace_gym.restore(env, ck)
    assert trace_gym.unwrap(env).turn == 0


def test_render_ansi_shows_transcript():
    env = CountdownEnv(render_mode="ansi")
    env.reset(seed=0, options={"task": 0})
    env.step("add 1")
    text = env.render()
    assert "[assistant]\nadd 1" in text and "Reach 3" in text


def test_public_api_raises_the_project_errors():
    import gymnasium as gym

    from trace_gym.errors import ConfigError, NotATraceEnv, TraceGymError

    with pytest.raises(NotATraceEnv, match="subclass trace_gym.core.TraceEnv") as e:
        trace_gym.unwrap(gym.make("CartPole-v1"))
    assert isinstance(e.value, TraceGymError) and isinstance(e.value, TypeError)
    with pytest.raises(ConfigError, match="max_turns"):
        CountdownEnv(max_turns=0)


def test_over_long_action_is_an_observation_and_the_env_goes_on(countdown_env):
    env = countdown_env
    env.max_action_chars = 50
    env.reset(seed=0, options={"task": 0})
    ck = env.checkpoint()
    obs, reward, term, trunc, info = env.step("add 1" + " " * 100)
    assert obs.startswith("Error: your message is 105 characters long; the limit is 50.")
    assert "unknown action" in obs  # the env's own answer to a message it cannot act on
    assert (reward, term, info["error"], info["action_chars"]) == (
        0.0,
        False,
        "action_too_long",
        105,
    )
    assert env.turn == 1 and env._transcript[-2].endswith("... [105 characters, cut]")
    obs, *_ = env.step("add 1")
    assert obs.startswith("total=1")
    env.restore(ck)  # the rejected turn replays exactly
    assert env.step("add 1" + " " * 100)[0].startswith("Error: your message is 105")


def test_no_env_declares_render_modes_without_a_render_fps():
    from gymnasium.utils.env_checker import check_env

    for env_id in trace_gym.env_ids():
        env = gym.make(env_id)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                check_env(env.unwrapped, skip_render_check=False)
            assert not [w for w in caught if "render fps" in str(w.message)], env_id
        finally:
            env.close()
