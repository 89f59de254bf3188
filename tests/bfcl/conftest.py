"""Fixtures for the BFCL tests (bfcl-eval is part of the set-up: `make setup`)."""

from __future__ import annotations

import itertools

import pytest

_RUN = itertools.count()


@pytest.fixture(scope="session")
def bfcl_env():
    from trace_gym.envs.bfcl.env import BFCLEnv

    env = BFCLEnv()
    yield env
    env.close()


@pytest.fixture(scope="session")
def bfcl_verdict():
    """bfcl-eval's own multi-turn verdict (accuracy checker, then irrelevance checker)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
        multi_turn_checker,
        multi_turn_irrelevance_checker,
    )

    def verdict(entry, decoded):
        test_entry = {
            "id": entry.id,
            "initial_config": entry.initial_config,
            "involved_classes": list(entry.involved_classes),
        }
        truth = [list(t) for t in entry.ground_truth]
        # a fresh model name per run: bfcl-eval caches backend instances under it
        result = multi_turn_checker(
            decoded, truth, test_entry, entry.category, f"trace_gym_test_{next(_RUN)}"
        )
        if not result["valid"]:
            return result["error_type"]
        result = multi_turn_irrelevance_checker(decoded, truth)
        return None if result["valid"] else result["error_type"]

    return verdict
