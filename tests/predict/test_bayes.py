"""The `bayes` predictor: text prior x visit counts, uncertainty-aware prompt values."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.errors import ConfigError
from trace_gym.predict import State, make_predictor


def _s(pid: str, depth: int = 0) -> State:
    return State(pid, f"task {pid}", tuple((f"a{i}", f"o{i}") for i in range(depth)))


def test_unvisited_prompts_are_valued_away_from_one_half():
    pred = make_predictor("bayes", prior_strength=2.0)
    v = pred.predict([_s("x")])[0]
    # text prior 0.5 with 2 pseudo-counts: E[p(1-p)] = 1/6 -> v(1-v) = 1/6
    assert v * (1 - v) == pytest.approx(1 / 6)
    mean = make_predictor("bayes", mixing=False).predict([_s("x")])[0]
    assert mean == pytest.approx(0.5)


def test_visits_move_the_posterior_and_mixed_prompts_gain_value():
    pred = make_predictor("bayes", prior_strength=2.0, mixing=True)
    before = pred.predict([_s("mixed"), _s("easy")])
    pred.update([_s("mixed"), _s("easy")], np.array([0.5, 1.0]), np.array([16.0, 16.0]))
    after = pred.predict([_s("mixed"), _s("easy")])
    # a prompt seen half-successful over 16 leaves is now a better candidate than before
    assert abs(after[0] - 0.5) < abs(before[0] - 0.5)
    # an all-success prompt is pushed toward 1 (skipped by TRACE)
    assert after[1] > 0.9
    means = make_predictor("bayes", mixing=False)
    means.update([_s("easy")], np.array([1.0]), np.array([16.0]))
    assert means.predict([_s("easy")])[0] > 0.85


def test_prefix_values_come_from_the_text_model():
    pred = make_predictor("bayes")
    p = pred.predict([_s("x", depth=2)])
    assert p == pytest.approx(pred.text.predict([_s("x", depth=2)]))


def test_bad_options_fail_at_construction():
    with pytest.raises(ConfigError):
        make_predictor("bayes", prior_strength=0)
    with pytest.raises(ConfigError):
        make_predictor("bayes", decay=1.5)
