"""The `clue` predictor: learns a planted clue->success map in a few updates, widens its
belief only where data is thin, forgets under decay, never reads the prompt id."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.errors import ConfigError
from trace_gym.predict import State, make_predictor, spearman
from trace_gym.predict.base import UncertainPredictor
from trace_gym.predict.health import ece, gain_rank

LEVELS = ("brutal", "hard", "tricky", "fair", "easy", "trivial")
#: the planted map: success probability of each clue word
TRUE_P = dict(zip(LEVELS, (0.03, 0.15, 0.4, 0.6, 0.85, 0.97), strict=True))


def _prompt(rng: np.random.Generator, i: int, tag: str) -> tuple[State, float]:
    level = LEVELS[rng.integers(len(LEVELS))]
    topic = ("geometry", "algebra", "counting")[rng.integers(3)]
    text = f"Task {tag}-{i}. Topic: {topic}. Initial assessment: {level}. Reply 'answer'."
    return State(f"{tag}-{i}", text), TRUE_P[level]


def _batch(rng: np.random.Generator, n: int, tag: str, leaves: int = 8):
    states, p = zip(*[_prompt(rng, i, tag) for i in range(n)], strict=True)
    rates = rng.binomial(leaves, np.array(p)) / leaves
    return list(states), np.array(p), rates, np.full(n, float(leaves))


def test_learns_a_planted_clue_map_within_a_few_updates():
    rng = np.random.default_rng(0)
    pred = make_predictor("clue")
    assert isinstance(pred, UncertainPredictor) and not pred.has_data
    for step in range(3):  # 3 updates of 48 prompts, 8 outcomes each
        states, _, rates, n = _batch(rng, 48, f"train{step}")
        pred.update(states, rates, n)
    assert pred.has_data
    held, p, _, _ = _batch(rng, 300, "held-out")  # prompts never seen
    v = pred.predict(held)
    assert gain_rank(v, p) > 0.8
    assert spearman(v, p) > 0.9
    assert ece(v, p) < 0.08


def test_concentration_grows_with_data_and_stays_low_where_thin():
    rng = np.random.default_rng(2)
    pred = make_predictor("clue")
    probe = [State("q", "Task q. Topic: algebra. Initial assessment: fair. Reply 'answer'.")]
    rare = [State("r", "Task r. Topic: poetry. Initial assessment: fair. Reply 'answer'.")]
    before = pred.concentration(probe)[0]
    seen = []
    for step in range(3):
        states, _, rates, n = _batch(rng, 48, f"c{step}")
        pred.update(states, rates, n)
        seen.append(pred.concentration(probe)[0])
    assert before < seen[0] < seen[-1]
    # a word never seen in training ("poetry") adds nothing, but the prompt is no better
    # known than the probe whose words were all seen
    assert pred.concentration(rare)[0] <= seen[-1] * 1.001
    # a state whose words were seen in few labels is less certain than a common one
    few = [State("f", "Task f. Topic: algebra. Initial assessment: fair. Bonus clue zebra.")]
    pred.update(few, np.array([1.0]), np.array([1.0]))
    assert pred.concentration(few)[0] < pred.concentration(probe)[0]


def test_decay_forgets_old_labels_under_drift():
    def fit(decay: float) -> float:
        rng = np.random.default_rng(3)
        pred = make_predictor("clue", decay=decay)
        for step in range(6):
            states, _, _, n = _batch(rng, 48, f"d{step}")
            target = 0.1 if step < 3 else 0.9  # the map drifts: every prompt flips
            pred.update(states, np.full(len(states), target), n)
        held, _, _, _ = _batch(rng, 50, "h")
        return float(np.mean(pred.predict(held)))

    assert fit(0.3) > fit(1.0) + 0.1
    assert fit(0.3) > 0.65


def test_the_prompt_id_is_never_read():
    rng = np.random.default_rng(4)
    pred = make_predictor("clue")
    states, _, rates, n = _batch(rng, 48, "id")
    pred.update(states, rates, n)
    renamed = [State(f"other-{i}", s.prompt, s.turns, s.env_id) for i, s in enumerate(states)]
    assert np.array_equal(pred.predict(states), pred.predict(renamed))
    assert np.array_equal(pred.concentration(states), pred.concentration(renamed))


def test_prefix_labels_train_the_history_features():
    pred = make_predictor("clue")
    good = [
        State(f"g{i}", "Task. Topic: x.", (("action 1", "gauge 8/9 promising"),)) for i in range(20)
    ]
    bad = [State(f"b{i}", "Task. Topic: x.", (("action 0", "gauge 1/9 bleak"),)) for i in range(20)]
    pred.update(good + bad, np.array([1.0] * 20 + [0.0] * 20), np.full(40, 4.0))
    probe = [
        State("p", "Task. Topic: x.", (("action 2", "gauge 7/9 promising"),)),
        State("q", "Task. Topic: x.", (("action 2", "gauge 2/9 bleak"),)),
    ]
    hi, lo = pred.predict(probe)
    assert hi > 0.6 and lo < 0.4 and hi - lo > 0.3


def test_state_dict_round_trip_and_bad_options():
    rng = np.random.default_rng(5)
    a = make_predictor("clue")
    states, _, rates, n = _batch(rng, 30, "s")
    a.update(states, rates, n)
    b = make_predictor("clue")
    b.load_state_dict(a.state_dict())
    assert np.array_equal(a.predict(states), b.predict(states))
    more, _, r2, n2 = _batch(rng, 30, "t")
    a.update(more, r2, n2)
    b.update(more, r2, n2)
    assert np.allclose(a.predict(states), b.predict(states))
    for bad in ({"decay": 0.0}, {"prior_var": -1.0}, {"newton": 0}, {"prefix_weight": -1}):
        with pytest.raises(ConfigError):
            make_predictor("clue", **bad)
    with pytest.raises(ConfigError):
        a.update(states, rates[:3], n)
