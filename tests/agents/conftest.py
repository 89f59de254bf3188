"""Fixtures of the agents tests: one tiny warm-started model, built once and cached."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def countdown_model_dir():
    """The smallest tiny model: Countdown-only data, a short warm start (cached on disk)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trace_gym.agents.tiny import default_test_config, tiny_model_dir

    return tiny_model_dir(default_test_config(envs=("trace/Countdown-v0",), sft_steps=60))


@pytest.fixture(scope="session")
def countdown_policy_factory(countdown_model_dir):
    from trace_gym.agents.hf import HFPolicy

    def make(**sampling):
        return HFPolicy.from_pretrained(str(countdown_model_dir), **sampling)

    return make
