"""The versioned checkpoint envelope: foreign and stale checkpoints, pickling, `reseed`."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from trace_gym.core import CHECKPOINT_VERSION, Checkpoint, EnvSnapshot, _rebuild
from trace_gym.errors import CheckpointError, TraceGymError
from trace_gym.testing import CountdownEnv

ACTIONS = ("add 1", "add 2", "add 3")


class OtherCountdown(CountdownEnv):
    """The same env id and task set as `CountdownEnv`, another class."""


def _taken(seed: int = 3) -> tuple[CountdownEnv, Checkpoint]:
    env = CountdownEnv()
    env.reset(seed=seed, options={"task": 2})
    env.step("add 2")
    return env, env.checkpoint()


def test_a_checkpoint_is_a_typed_versioned_envelope():
    env, ck = _taken()
    assert ck.version == CHECKPOINT_VERSION
    assert ck.env_class == "trace_gym.testing.CountdownEnv"
    assert isinstance(ck.payload, EnvSnapshot) and ck.payload.max_turns == env.max_turns
    assert ck.payload["state"] == ck.payload.state  # version-1 style reads still work
    with pytest.raises(KeyError):
        ck.payload["nothing"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ck.payload.done = True  # type: ignore[misc]
    clone = pickle.loads(pickle.dumps(ck))
    assert clone == ck and (clone.version, clone.env_class) == (ck.version, ck.env_class)
    assert clone.local is None and ck.without_local() == ck


def test_restore_refuses_another_env_class_with_a_clear_message():
    _, ck = _taken()
    with pytest.raises(CheckpointError, match="env class 'trace_gym.testing.CountdownEnv'"):
        OtherCountdown().restore(ck)
    unnamed = dataclasses.replace(ck, env_class="")
    with pytest.raises(CheckpointError, match="unknown"):
        CountdownEnv().restore(unnamed)
    assert issubclass(CheckpointError, TraceGymError)


def test_restore_refuses_stale_checkpoints():
    _, ck = _taken()
    with pytest.raises(
        CheckpointError, match=f"stale checkpoint: format version 1.*{CHECKPOINT_VERSION}"
    ):
        CountdownEnv().restore(dataclasses.replace(ck, version=1))
    # what release 1 pickled: five fields and a plain dict payload
    old = _rebuild(ck.env_id, ck.task_set, ck.task_id, ck.turn, dataclasses.asdict(ck.payload))
    assert old.version == 1
    with pytest.raises(CheckpointError, match="stale"):
        CountdownEnv().restore(old)
    dict_payload = Checkpoint(ck.env_id, ck.task_set, ck.task_id, ck.turn, {"rng": {}})
    with pytest.raises(CheckpointError, match="payload dict"):
        CountdownEnv().restore(dict_payload)


_CHILD = """
import pickle, sys
from trace_gym.testing import CountdownEnv
ck = pickle.loads(sys.stdin.buffer.read())
env = CountdownEnv()
env.restore(ck)
print(repr([env.step(a)[:4] for a in {actions!r}]))
"""


def test_a_checkpoint_crosses_a_process_boundary():
    env, ck = _taken(seed=11)
    here = [env.step(a)[:4] for a in ACTIONS]
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(actions=ACTIONS)],
        input=pickle.dumps(ck),
        capture_output=True,
        check=True,
    )
    assert child.stdout.decode().strip() == repr(here)


def test_reseed_gives_a_fresh_rng_and_keeps_the_episode():
    _, ck = _taken()
    a, b, c = CountdownEnv(), CountdownEnv(), CountdownEnv()
    for env in (a, b, c):
        env.restore(ck)
    a.reseed(5)
    b.reseed(5)
    c.reseed(6)
    assert (a.turn, a.task_id) == (1, "count-2")
    draw = lambda e: e.np_random.integers(1 << 30, size=4).tolist()  # noqa: E731
    expected = np.random.Generator(np.random.PCG64(5)).integers(1 << 30, size=4).tolist()
    assert draw(a) == draw(b) != draw(c)
    fresh = CountdownEnv()
    fresh.restore(ck)
    fresh.reseed(5)
    assert draw(fresh) == expected


def test_the_mixture_reseeds_and_validates_through_its_member():
    env = gym.make("trace/Mixture-v0", members={"trace/Sim-v0": {"num_tasks": 4}}).unwrapped
    env.reset(seed=0, options={"task": env.task_ids[1]})
    env.step("action 1")
    ck = env.checkpoint()
    assert ck.env_id == "trace/Sim-v0" and ck.env_class == "trace_gym.sim.env.SimEnv"
    env.reseed(9)
    expected = np.random.Generator(np.random.PCG64(9)).random()
    assert env.active.np_random.random() == expected
    _, foreign = _taken()
    with pytest.raises(CheckpointError, match="one of its members"):
        env.restore(foreign)
    with pytest.raises(CheckpointError, match="stale"):
        env.restore(dataclasses.replace(ck, version=CHECKPOINT_VERSION + 1))
