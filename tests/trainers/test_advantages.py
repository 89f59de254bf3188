"""Advantage functions on hand-built trees with answers worked out by hand."""

from __future__ import annotations

import math

import pytest
from trace_gym.trainers.advantages import ADVANTAGES, compute_advantages

from trace_gym.errors import UnknownNameError

S3 = math.sqrt(1 / 3)  # unbiased std of (0, 1, 1) and of (1, 0, 0, 1)
R2 = math.sqrt(0.5)  # 1 / unbiased std of (0, 1) ... (0,1) has std sqrt(0.5)


def by_nodes(units):
    return {u.nodes: u for u in units}


def test_grpo_flat_tree_is_plain_grpo(make_flat_tree):
    units = compute_advantages("grpo", [make_flat_tree()], eps=0.0)
    assert [u.advantage for u in units] == pytest.approx([0.5 / S3, -0.5 / S3, -0.5 / S3, 0.5 / S3])
    assert [u.weight for u in units] == [1.0] * 4
    assert [u.nodes for u in units] == [(1,), (2,), (3,), (4,)]
    dr = compute_advantages("dr_grpo", [make_flat_tree()])
    assert [u.advantage for u in dr] == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_grpo_on_trace_tree_uses_all_leaves_and_root_weights(make_trace_tree):
    units = by_nodes(compute_advantages("grpo", [make_trace_tree(failed_branch=True)], eps=0.0))
    # leaves 3 (r=0), 5 (r=1), 6 (r=1); the failed replay 7 is never trained
    assert set(units) == {(1, 2, 3), (4, 5), (1, 6)}
    mean = 2 / 3
    assert units[(1, 2, 3)].advantage == pytest.approx((0 - mean) / S3)
    assert units[(4, 5)].advantage == pytest.approx((1 - mean) / S3)
    # 2 root rollouts, 3 units: weight 2/3 each (shared prefix node 1 counted per leaf path)
    assert all(u.weight == pytest.approx(2 / 3) for u in units.values())
    none = compute_advantages("grpo", [make_trace_tree()], prompt_weight="none")
    assert all(u.weight == 1.0 for u in none)


def test_treerpo_sibling_relative_on_compressed_segments(make_trace_tree):
    units = by_nodes(compute_advantages("treerpo", [make_trace_tree(failed_branch=True)], eps=0.0))
    # segments: under root: [1] (V=.5), [4,5] (V=1); under node 1: [2,3] (V=0), [6] (V=1);
    # the failed segment [7] has no value and is left out
    assert set(units) == {(1,), (4, 5), (2, 3), (6,)}
    assert units[(1,)].advantage == pytest.approx(-0.25 / math.sqrt(0.125))
    assert units[(4, 5)].advantage == pytest.approx(0.25 / math.sqrt(0.125))
    assert units[(2, 3)].advantage == pytest.approx(-0.5 / R2)
    assert units[(6,)].advantage == pytest.approx(0.5 / R2)
    # every token once, in its own segment; 2 roots / 4 units
    assert all(u.weight == pytest.approx(0.5) for u in units.values())
    nostd = by_nodes(compute_advantages("treerpo", [make_trace_tree()], std=False))
    assert [nostd[k].advantage for k in [(1,), (4, 5), (2, 3), (6,)]] == pytest.approx(
        [-0.25, 0.25, -0.5, 0.5]
    )


def test_treerpo_flat_tree_equals_grpo(make_flat_tree):
    a = [u.advantage for u in compute_advantages("treerpo", [make_flat_tree()])]
    b = [u.advantage for u in compute_advantages("grpo", [make_flat_tree()])]
    assert a == pytest.approx(b)


def test_tree_grpo_inter_plus_intra(make_trace_tree):
    units = by_nodes(compute_advantages("tree_grpo", [make_trace_tree()], eps=0.0))
    mean = 2 / 3
    # subtree of root rollout 1 = leaves {3, 6} (rewards 0, 1): intra -/+ 0.5 / sqrt(.5)
    assert units[(1, 2, 3)].advantage == pytest.approx((0 - mean) / S3 - 0.5 / R2)
    assert units[(1, 6)].advantage == pytest.approx((1 - mean) / S3 + 0.5 / R2)
    # subtree of root rollout 2 has one leaf: intra term 0
    assert units[(4, 5)].advantage == pytest.approx((1 - mean) / S3)


def test_treepo_subgroup_average_then_whiten(make_trace_tree):
    units = by_nodes(compute_advantages("treepo", [make_trace_tree()], eps=0.0))
    # leaf 3: root term 0 - 2/3, anchor 1 term 0 - 1/2; leaf 5: root term 1/3 only;
    # leaf 6: root 1/3, anchor 1 +1/2
    raw = {(1, 2, 3): (-2 / 3 - 0.5) / 2, (4, 5): 1 / 3, (1, 6): (1 / 3 + 0.5) / 2}
    m = sum(raw.values()) / 3
    sd = math.sqrt(sum((v - m) ** 2 for v in raw.values()) / 3)
    for k, v in raw.items():
        assert units[k].advantage == pytest.approx((v - m) / sd)


def test_all_mixed_free_groups_give_zero(make_flat_tree):
    for name in ADVANTAGES:
        units = compute_advantages(name, [make_flat_tree((1.0, 1.0, 1.0))])
        assert all(u.advantage == pytest.approx(0.0) for u in units), name


def test_tree_index_refers_to_batch_position(make_flat_tree, make_trace_tree):
    units = compute_advantages("treerpo", [make_flat_tree(), make_trace_tree()])
    assert {u.tree for u in units} == {0, 1}
    assert sum(u.weight for u in units if u.tree == 1) == pytest.approx(2.0)


def test_unknown_optimiser_fails():
    with pytest.raises(UnknownNameError, match="treerpo"):
        compute_advantages("nope", [])
