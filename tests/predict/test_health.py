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


def _tree(prompt_id, value, rewards, true_value=None, prefix_value=None):
    """A root with one single-turn-then-leaf rollout per reward; the first prefix scored."""
    from trace_gym.tree import RolloutTree, Turn

    t = RolloutTree(prompt_id, "p")
    t.root.value, t.root.true_value = value, true_value
    for i, r in enumerate(rewards):
        mid = t.add_child(0, Turn(action=f"a{i}", observation="o"))
        if i == 0:
            mid.value, mid.true_value = prefix_value, true_value
        leaf = t.add_child(mid.id, Turn(action="b", observation="end"))
        t.finish(leaf.id, reward=r, terminated=True)
    return t


def test_depth_health_from_trees_realised_and_exact():
    from trace_gym.predict.health import depth_health, health_metrics, tree_rows

    trees = [
        _tree("a", 0.5, [1.0, 0.0], prefix_value=0.9),
        _tree("b", 0.9, [1.0, 1.0, 1.0], prefix_value=0.8),
        _tree("c", 0.1, [0.0, 0.0], prefix_value=0.2),
        _tree("d", 0.4, [1.0, 0.0, 0.0, 1.0], prefix_value=0.5),
    ]
    ranked, calibrated = tree_rows(trees)  # no true values: realised rates
    assert sorted(r[1] for r in ranked if r[0] == 0) == [0.1, 0.4, 0.5, 0.9]
    h = depth_health(ranked, calibrated)
    assert set(h) == {0, 1}
    # the mixed prompts (a, d) have the largest v (1 - v): a perfect gain ranking
    assert h[0]["gain_rank"] == pytest.approx(gain_rank([0.5, 0.9, 0.1, 0.4], [0.5, 1, 0, 0.5]))
    assert h[0]["gain_rank"] > 0.8
    assert h[0]["outcomes"] == 11 and h[0]["n"] == 4 and h[0]["distinct"] == 4
    # calibration is weighted by the leaves behind each node
    rates, leaves = [0.5, 1.0, 0.0, 0.5], [2, 3, 2, 4]
    assert h[0]["brier"] == pytest.approx(brier([0.5, 0.9, 0.1, 0.4], rates, leaves))
    assert h[0]["ece"] == pytest.approx(ece([0.5, 0.9, 0.1, 0.4], rates, leaves))
    assert h[1]["n"] == 4  # the scored prefixes; the unscored ones are left out
    m = health_metrics(trees)
    assert m["health_d0_gain_rank"] == h[0]["gain_rank"] and "health_d1_ece" in m
    # with true values on every scored node, gain_rank ranks against them
    exact = [_tree("e", 0.5, [1.0, 0.0], true_value=0.5, prefix_value=0.5)]
    exact.append(_tree("f", 0.9, [1.0, 0.0], true_value=0.97, prefix_value=0.5))
    exact.append(_tree("g", 0.7, [1.0, 1.0], true_value=0.2, prefix_value=0.5))
    ranked, _ = tree_rows(exact)
    assert [z for d, _, z in ranked if d == 0] == [0.5, 0.97, 0.2]
    ranked, _ = tree_rows(exact, exact=False)
    assert [z for d, _, z in ranked if d == 0] == [0.5, 0.5, 1.0]


def test_depth_health_with_skipped_candidates_and_empty_depths():
    from trace_gym.predict.health import depth_health

    rng = np.random.default_rng(0)
    z = rng.random(300)
    ranked = [(0, float(x), float(x)) for x in z]  # every candidate, skipped ones included
    h = depth_health(ranked, [])
    assert h[0]["gain_rank"] == pytest.approx(1.0)
    assert math.isnan(h[0]["ece"]) and h[0]["outcomes"] == 0
    shuffled = depth_health(
        [(0, float(v), float(x)) for v, x in zip(rng.permutation(z), z, strict=True)]
    )
    assert abs(shuffled[0]["gain_rank"]) < 0.15
    assert depth_health([]) == {}
