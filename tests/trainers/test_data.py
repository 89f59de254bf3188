"""Samples from units: context from recorded token ids, mask only on trained generated tokens."""

from __future__ import annotations

import pytest
from trace_gym.trainers.advantages import TrainUnit, compute_advantages
from trace_gym.trainers.data import collate, sample_from_unit

from trace_gym.errors import TreeFormatError


def test_segment_context_and_mask(make_trace_tree):
    tree = make_trace_tree()
    s = sample_from_unit(tree, TrainUnit(0, (2, 3), -1.0, 0.5))
    # prompt [1,2] | turn1 [10,11] obs [20] | turn2 [12] obs [21,22] | turn3 [13,14]
    assert s.input_ids == [1, 2, 10, 11, 20, 12, 21, 22, 13, 14]
    assert s.loss_mask == [0, 0, 0, 0, 0, 1, 0, 0, 1, 1]
    assert s.gen_logprobs == [0, 0, -0.5, -0.5, 0, -0.5, 0, 0, -0.5, -0.5]
    assert s.gen_known == [0, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    assert (s.advantage, s.weight) == (-1.0, 0.5)


def test_leaf_path_trains_every_turn(make_trace_tree):
    s = sample_from_unit(make_trace_tree(), TrainUnit(0, (1, 6), 1.0))
    assert s.input_ids == [1, 2, 10, 11, 20, 40, 41]
    assert s.loss_mask == [0, 0, 1, 1, 0, 1, 1]


def test_overflowed_turn_is_masked(make_trace_tree):
    tree = make_trace_tree()
    tree[3].info["overflow"] = True
    s = sample_from_unit(tree, TrainUnit(0, (1, 2, 3), 1.0))
    assert s.loss_mask == [0, 0, 1, 1, 0, 1, 0, 0, 0, 0]


def test_missing_tokens_is_a_clear_error(make_trace_tree):
    tree = make_trace_tree()
    tree[1].turn.obs_token_ids = None
    with pytest.raises(TreeFormatError, match="obs_token_ids"):
        sample_from_unit(tree, TrainUnit(0, (2, 3), 1.0))
    tree.prompt_token_ids = None
    with pytest.raises(TreeFormatError, match="prompt_token_ids"):
        sample_from_unit(tree, TrainUnit(0, (4, 5), 1.0))


def test_collate_pads_right(make_trace_tree):
    tree = make_trace_tree()
    samples = [sample_from_unit(tree, u) for u in compute_advantages("treerpo", [tree])]
    b = collate(samples, pad_id=0)
    assert b.input_ids.shape == (4, max(len(s.input_ids) for s in samples))
    assert (
        int(b.loss_mask.sum()) == sum(s.num_trained for s in samples) == 9
    )  # each generated token once
    assert b.attention_mask.sum(1).tolist() == [len(s.input_ids) for s in samples]
    assert b.advantages[:, 0].tolist() == pytest.approx([s.advantage for s in samples])


def test_a_near_certain_token_keeps_its_known_logprob(make_trace_tree):
    """A logprob of 0.0 (probability ~1) is a recorded value, not "unknown"; a turn without
    logprobs is unknown whatever its zeros."""
    tree = make_trace_tree()
    tree[2].turn.logprobs = [0.0]
    tree[3].turn.logprobs = None
    s = sample_from_unit(tree, TrainUnit(0, (2, 3), 1.0))
    assert s.gen_logprobs == [0, 0, -0.5, -0.5, 0, 0.0, 0, 0, 0, 0]
    assert s.gen_known == [0, 0, 1, 1, 0, 1, 0, 0, 0, 0]
    b = collate([s, sample_from_unit(tree, TrainUnit(0, (1,), 1.0))])
    assert b.gen_known.tolist() == [[0, 0, 1, 1, 0, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0, 0, 0]]
