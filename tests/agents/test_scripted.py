"""Scripted policies: every env, seeded by the conversation only, skill matters."""

from __future__ import annotations

import pytest
from trace_gym.agents.scripted import SCRIPTED, make_env, make_scripted
from trace_gym.agents.sft import play_episode

from trace_gym.errors import ConfigError, UnknownNameError
from trace_gym.policy import Conversation

ENVS = {
    "trace/Sim-v0": {"preset": "hotpotqa", "num_tasks": 16},
    "trace/HotpotQA-v0": {},
    "trace/BFCL-v0": {"categories": ["base"]},
    "trace/Math-v0": {"limit": 4},
}


def _make(env_id):
    return make_env(env_id, **ENVS[env_id])


@pytest.mark.parametrize("env_id", list(ENVS))
def test_seeded_by_the_conversation_only(env_id):
    env = _make(env_id)
    pol = make_scripted(env_id, skill=0.5, env=env)
    prompt, info = env.reset(seed=0, options={"task": 0})
    conv = Conversation(env_id, info["task_id"], prompt, (), seed=123, reset_info=info)
    a = [pol.generate([conv])[0].text for _ in range(3)]
    b = pol.generate(
        [Conversation(env_id, info["task_id"], prompt, (), seed=124, reset_info=info), conv]
    )[1].text
    assert a[0] == a[1] == a[2] == b and a[0]
    env.close()


@pytest.mark.parametrize("env_id", ["trace/HotpotQA-v0", "trace/BFCL-v0", "trace/Math-v0"])
def test_skill_controls_success(env_id):
    env = _make(env_id)
    n = 4 if env_id == "trace/Math-v0" else 10
    ids = list(env.unwrapped.task_ids)
    wins = {}
    for skill in (0.0, 1.0):
        pol = make_scripted(env_id, skill=skill, env=env)
        wins[skill] = sum(
            play_episode(env, pol, env_id, ids[i % len(ids)], seed=i).reward >= 0.5
            for i in range(n)
        )
    assert wins[1.0] >= n - 1  # the oracle solves (nearly) everything
    assert wins[0.0] < wins[1.0]
    env.close()


def test_registry_and_validation():
    with pytest.raises(UnknownNameError):
        make_scripted("trace/Nope-v0")
    with pytest.raises(ConfigError):
        make_scripted("trace/Countdown-v0", skill=1.5)
    make_scripted("trace/Countdown-v0")
    assert {"trace/Sim-v0", "trace/HotpotQA-v0", "trace/BFCL-v0", "trace/Math-v0"} <= set(SCRIPTED)
