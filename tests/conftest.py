"""Shared fixtures: the tiny reference env and a seeded fake policy."""

from __future__ import annotations

import pytest

from trace_gym.testing import CountdownEnv, RandomCountdownPolicy


@pytest.fixture
def countdown_env():
    env = CountdownEnv()
    yield env
    env.close()


@pytest.fixture
def countdown_policy():
    return RandomCountdownPolicy()
