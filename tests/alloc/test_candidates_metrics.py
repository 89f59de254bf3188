"""Prefix records from rollout trees, expected-value metrics and costs of an allocation."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.alloc import (
    Candidate,
    PrefixCandidate,
    accounted_cost,
    expected_flips,
    expected_mixed_groups,
    measured_cost,
    prefix_candidates,
    remaining_turn_cost,
    root_value,
)
from trace_gym.errors import AllocationError
from trace_gym.tree import RolloutTree, Turn


def _chain(
    tree: RolloutTree,
    turns: int,
    reward: float | None,
    *,
    origin: str = "rollout",
    parent: int = 0,
    error: str | None = None,
) -> int:
    node = parent
    for t in range(turns):
        node = tree.add_child(
            node, Turn(f"a{t}", f"o{t}", token_ids=[1] * (t + 1)), origin=origin
        ).id
        tree.nodes[node].value = 0.1 * (t + 1)
    tree.finish(node, reward=reward, error=error)
    return node


def make_tree() -> tuple[RolloutTree, list[int]]:
    tree = RolloutTree("p0", "prompt")
    leaves = [
        _chain(tree, 4, 1.0),  # nodes 1..4: prefixes 1, 2, 3
        _chain(tree, 1, 0.0),  # node 5: one turn, no prefix
        _chain(tree, 3, None, error="boom"),  # nodes 6..8: failed, skipped
        _chain(tree, 3, 0.0),  # nodes 9..11: prefixes 9, 10
    ]
    return tree, leaves


def test_prefixes_are_the_interior_turn_boundaries():
    tree, leaves = make_tree()
    cands = prefix_candidates(tree, leaves)
    assert [c.node for c in cands] == [1, 2, 3, 9, 10]
    assert [c.depth for c in cands] == [1, 2, 3, 1, 2]
    assert [c.rollout for c in cands] == [0, 0, 0, 3, 3]
    assert [c.reward for c in cands] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [c.rollout_turns for c in cands] == [4, 4, 4, 3, 3]
    assert [c.value for c in cands] == pytest.approx([0.1, 0.2, 0.3, 0.1, 0.2])
    assert [c.cost for c in cands] == pytest.approx([0.75, 0.5, 0.25, 2 / 3, 1 / 3])
    assert remaining_turn_cost(1, 4) == 0.75
    # default: every scored leaf of the tree
    assert [c.node for c in prefix_candidates(tree)] == [1, 2, 3, 9, 10]


def test_prefix_values_costs_and_sharing():
    tree, leaves = make_tree()
    cands = prefix_candidates(tree, leaves, values={1: 0.9}, cost=0.5)
    assert cands[0].value == 0.9 and cands[1].value == pytest.approx(0.2)
    assert {c.cost for c in cands} == {0.5}
    assert [c.cost for c in prefix_candidates(tree, leaves, cost=None)] == [0.5] * 5
    assert prefix_candidates(tree, leaves, values=lambda n: 0.4)[0].value == 0.4
    # a replay from node 2 shares nodes 1 and 2 with rollout 0: listed once
    replay_leaf = _chain(tree, 2, 0.0, origin="replay", parent=2)
    cands = prefix_candidates(tree, [leaves[0], replay_leaf])
    assert [c.node for c in cands] == [1, 2, 3, 12]
    tree.nodes[9].value = None
    with pytest.raises(AllocationError, match="no predicted value"):
        prefix_candidates(tree, leaves)
    with pytest.raises(AllocationError, match="not a finished rollout"):
        prefix_candidates(tree, [1])


def test_expected_mixed_groups_predicted_and_true():
    cands = [
        Candidate("a", 0.5, true_value=0.9),
        Candidate("b", 0.2, true_value=0.2),
        Candidate("c", 0.0),
    ]
    gain = expected_mixed_groups(cands[:2], np.array([4, 0]))
    assert gain.predicted == pytest.approx(root_value(0.5, 4))
    assert gain.true == pytest.approx(root_value(0.9, 4))
    assert expected_mixed_groups(cands, np.array([2, 2, 0])).true is None
    assert (
        expected_mixed_groups(cands, np.zeros(3, dtype=int)).predicted == 0.0
    )  # skipping is 0, not -1
    with pytest.raises(AllocationError, match="counts"):
        expected_mixed_groups(cands, [1.5, 0, 0])


def test_expected_flips():
    pref = [
        PrefixCandidate(0, 1, 1, reward=1.0, value=0.8, true_value=0.5),
        PrefixCandidate(0, 2, 2, reward=0.0, value=0.8, true_value=0.5),
    ]
    gain = expected_flips(pref, np.array([2, 1]))
    assert gain.predicted == pytest.approx((1 - 0.8**2) + (1 - 0.2))  # reward 0: repeat w.p. 1 - V
    assert gain.true == pytest.approx((1 - 0.5**2) + (1 - 0.5))


def test_accounted_and_measured_cost():
    assert accounted_cost([8, 0, 8], [2, 2, 4]) == 16 + 0.5 * 8
    assert accounted_cost(1024, 2048) == 1024 * (1 + 2 / 2)  # M (1 + N/2) with N = 2
    assert accounted_cost(10, 4, replay_cost=1.0) == 14
    with pytest.raises(AllocationError):
        accounted_cost(1, 1, replay_cost=-1)
    tree, _ = make_tree()
    _chain(tree, 2, 1.0, origin="replay", parent=2)
    cost = measured_cost([tree])
    assert (cost.root_turns, cost.replay_turns, cost.turns) == (11, 2, 13)
    assert cost.root_tokens == (1 + 2 + 3 + 4) + 1 + (1 + 2 + 3) * 2
    assert cost.replay_tokens == 3 and cost.tokens == cost.root_tokens + 3
