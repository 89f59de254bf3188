"""Without bfcl-eval, making the env says exactly how to install it."""

from __future__ import annotations

import sys

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401  (registers the ids)
from trace_gym.errors import DependencyNotInstalled


def test_make_without_bfcl_eval_gives_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # import bfcl_eval now raises ImportError
    with pytest.raises(DependencyNotInstalled) as err:
        gym.make("trace/BFCL-v0")
    assert "pip install --no-deps bfcl-eval==2026.3.23 && pip install mpmath" in str(err.value)
