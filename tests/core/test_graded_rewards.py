"""Graded rewards in [0, 1]: the success event, mixed groups and the effective ratio."""

from __future__ import annotations

import math

import pytest

from trace_gym.errors import TreeError
from trace_gym.tree import (
    EXACT_SUCCESS,
    RolloutTree,
    Turn,
    batch_metrics,
    effective_ratio,
    success_threshold_for,
)


def _tree(rewards_by_branch, threshold=EXACT_SUCCESS, pid="p"):
    """Root -> one child per branch -> one leaf per reward under it."""
    t = RolloutTree(pid, "prompt", success_threshold=threshold)
    for b, rewards in enumerate(rewards_by_branch):
        mid = t.add_child(0, Turn(f"a{b}", "o"))
        for i, r in enumerate(rewards):
            leaf = t.add_child(mid.id, Turn(f"a{b}.{i}", "o"))
            t.finish(leaf.id, reward=r, terminated=True)
    return t


def test_graded_group_is_mixed_without_a_success():
    t = _tree([[0.2, 0.7], [0.2]])
    m = t.metrics()
    assert m.mixed and not m.success_mixed  # rewards differ; no exact success
    assert (m.successes, m.failures, m.contrastive_pairs) == (0, 3, 0)
    assert t.root.target == 0.0  # allocation's target counts successes only
    assert math.isclose(m.mean_reward, 1.1 / 3)
    assert m.mixed_anchors == 2  # the root and branch 0 (0.2 vs 0.7); branch 1 has one leaf


def test_threshold_decides_success_and_pairs_not_mixedness():
    rewards = [[1.0, 0.6], [0.6, 0.6]]
    exact, half = _tree(rewards), _tree(rewards, threshold=0.5)
    me, mh = exact.metrics(), half.metrics()
    assert me.mixed and mh.mixed  # raw rewards differ either way
    assert me.success_mixed and not mh.success_mixed  # at 0.5 every leaf is a success
    assert (me.successes, mh.successes) == (1, 4)
    assert exact.root.target == 0.25 and half.root.target == 1.0
    assert (me.contrastive_pairs, mh.contrastive_pairs) == (3, 0)  # S * F


def test_equal_graded_rewards_are_not_mixed():
    t = _tree([[0.5, 0.5], [0.5]])
    m = t.metrics()
    assert not m.mixed and not m.success_mixed and m.mixed_anchors == 0


def test_binary_rewards_keep_their_meaning_at_any_threshold():
    for threshold in (0.5, 1.0, 0.01):
        t = _tree([[1.0, 0.0], [0.0]], threshold=threshold)
        m = t.metrics()
        assert m.mixed == m.success_mixed is True
        assert (m.successes, m.contrastive_pairs, m.mixed_anchors) == (1, 2, 2)
        assert math.isclose(t.root.target, 1 / 3)


def test_effective_ratio_counts_raw_reward_spread():
    trees = [
        _tree([[0.3, 0.9]], pid="a"),
        _tree([[1.0, 1.0]], pid="b"),
        _tree([[0.0], [1.0]], pid="c"),
    ]
    assert effective_ratio(trees) == pytest.approx(2 / 3)
    bm = batch_metrics(trees)
    assert bm["mixed_groups"] == 2 and bm["success_mixed_groups"] == 1
    assert bm["success_rate"] == pytest.approx(3 / 6)


def test_failed_branches_are_not_rewards():
    t = _tree([[0.4]])
    leaf = t.add_child(1, Turn("x", "o"))
    t.finish(leaf.id, error="PolicyError: boom")
    assert not t.metrics().mixed  # one scored reward only


def test_success_threshold_from_reset_info():
    assert success_threshold_for({}) == 0.5
    assert success_threshold_for(None) == 0.5
    assert success_threshold_for({"success_threshold": 1.0}) == 1.0
    with pytest.raises(TreeError, match=r"\(0, 1\]"):
        success_threshold_for({"success_threshold": 0.0})


def test_threshold_survives_json_roundtrip():
    t = _tree([[0.3, 1.0]])
    back = RolloutTree.from_dict(t.to_dict())
    assert back.success_threshold == 1.0 and back.metrics() == t.metrics()
