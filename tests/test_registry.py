"""Registry-wide contract test: every `trace/` id is made, checked and restored."""

from __future__ import annotations

import pickle
import subprocess
import sys

import gymnasium as gym
import pytest

import trace_gym
from trace_gym.checker import check_checkpoint

IDS = trace_gym.env_ids()


@pytest.mark.parametrize("env_id", IDS)
def test_make_and_checkpoint_contract(env_id):
    env = gym.make(env_id)
    try:
        # gym.make returns the env itself: the public checkpoint path works on it
        assert isinstance(env.unwrapped, trace_gym.TraceEnv)
        report = check_checkpoint(env)
        assert report["turns"] >= 1
        env.reset(seed=1)
        ck = trace_gym.checkpoint(env)
        assert pickle.loads(pickle.dumps(ck)) == ck.without_local()
    finally:
        env.close()


@pytest.mark.parametrize("env_id", IDS)
def test_make_in_a_fresh_interpreter(env_id):
    code = (
        f"import gymnasium as gym, trace_gym; e = gym.make({env_id!r}); e.reset(seed=0); e.close()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_every_registered_id_is_listed_by_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "envs"], check=True, capture_output=True, text=True
    ).stdout
    assert [line.split()[0] for line in out.strip().splitlines()] == IDS
