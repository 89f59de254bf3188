"""Predictor health figures: gain_rank, ECE, Brier, distinct values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_gym.predict.health import brier, distinct, ece, gain_rank, health


def test_gain_rank_is_high_for_a_good_predictor_and_near_zero_for_a_shuffled_one():
    rng = np.random.default_rng(0)
    z = rng.beta(0.4, 0.4, size=2000)
    good = np.clip(z + rng.normal(0, 0.05, z.size), 0, 1)
    assert gain_rank(good, z) > 0.9
    shuffled = rng.permutation(good)
    assert abs(gain_rank(shuffled, z)) < 0.1


def test_gain_rank_sees_what_spearman_of_v_hides():
    # orders success perfectly but squeezes every value below 0.5: the surest successes
    # then look like the most mixed prompts
    z = np.linspace(0.01, 0.99, 99)
    v = z / 2.0
    from trace_gym.predict.training import spearman

    assert spearman(v, z) > 0.99
    assert abs(gain_rank(v, z)) < 0.1
    assert math.isnan(gain_rank(np.full(5, 0.3), z[:5]))


def test_ece_is_zero_when_calibrated_and_the_gap_when_not():
    v = np.array([0.05, 0.05, 0.95, 0.95])
    assert ece(v, [0.05, 0.05, 0.95, 0.95]) == pytest.approx(0.0)
    assert ece([0.2, 0.2], [1.0, 0.0]) == pytest.approx(0.3)
    # weights: a bin's gap counts by its outcomes
    assert ece([0.1, 0.9], [0.1, 0.5], weights=[3, 1]) == pytest.approx(0.1)


def test_brier_of_a_group_equals_the_brier_of_its_outcomes():
    outcomes = np.array([1, 0, 0, 1, 1, 0, 0, 0], float)
    v = 0.3
    per_outcome = float(np.mean((v - outcomes) ** 2))
    assert brier([v], [outcomes.mean()], [outcomes.size]) == pytest.approx(per_outcome)


def test_distinct_and_health_together():
    assert distinct([0.5, 0.5, 0.5000000001, 0.2]) == 2
    h = health([0.1, 0.5, 0.9], [0.0, 0.5, 1.0])
    assert set(h) == {"gain_rank", "ece", "brier", "distinct", "n"} and h["n"] == 3.0
    with pytest.raises(ValueError):
        health([0.1], [0.1, 0.2])
