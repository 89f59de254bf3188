"""The simulator's model: parsing, task ids, exact values against brute force and Monte-Carlo."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.errors import ConfigError, UnknownNameError
from trace_gym.sim import PRESETS, SimPreset, get_preset, make_task, skill_at, true_value
from trace_gym.sim.model import (
    ANSWER,
    WASTE,
    answer_prob,
    move_probs,
    parse_action,
    parse_task_id,
    sigmoid,
    state_of,
    value_table,
)


def test_parse_action_reads_the_last_line():
    assert parse_action("action 2", 3) == 2
    assert parse_action("Thought: hmm, option 1.\nACTION 1.", 3) == 1
    assert parse_action("Thought: done\n answer ", 3) == ANSWER
    assert parse_action("action 3", 3) == WASTE  # out of range
    assert parse_action("action 1\nI changed my mind", 3) == WASTE
    assert parse_action("", 3) == WASTE
    assert parse_action("action -1", 3) == WASTE


def test_task_ids_round_trip_and_tasks_are_pure():
    p = PRESETS["math-luck"]
    t = make_task(p, 3, 17)
    assert t.id == "sim-math-3-17" and parse_task_id(t.id) == ("math", 3, 17)
    make_task.cache_clear()
    again = make_task(p, 3, 17)
    assert again is not t and again.base == t.base and np.array_equal(again.shifts, t.shifts)
    assert p.turns_min <= t.turns <= p.turns_max
    with pytest.raises(ConfigError):
        parse_task_id("count-3")
    with pytest.raises(UnknownNameError):
        get_preset("chess")
    with pytest.raises(ConfigError):
        SimPreset(name="Bad Name")
    with pytest.raises(ConfigError):
        SimPreset(name="x", turns_min=3, turns_max=2)


def _brute(task, t, k, skill):
    """Independent scalar recursion over every history (no grid table)."""
    p = task.preset
    L = task.base + p.grid * k
    if t == task.turns:
        return float(sigmoid(L))
    pa = float(answer_prob(p, t, L))
    pm = move_probs(task, t, skill)
    v = pa * float(sigmoid(L)) + p.malformed_prob * _brute(task, t + 1, k, skill)
    for a in range(p.num_actions):
        v += (
            (1 - p.malformed_prob - pa)
            * pm[a]
            * _brute(task, t + 1, k + int(task.shifts[t, a]), skill)
        )
    return v


@pytest.mark.parametrize("preset", ["math-luck", "math", "hotpotqa-r08"])
@pytest.mark.parametrize("index", range(6))
def test_value_table_matches_brute_force_enumeration(preset, index):
    task = make_task(PRESETS[preset], 0, index)
    for skill in (0.0, 1.0, 2.5):
        table = value_table(task, skill)
        assert table[0, task.reach] == pytest.approx(_brute(task, 0, 0, skill), abs=1e-12)
        # a state deeper in the episode
        t, k, _ = state_of(task, [0, 1][: task.turns - 1])
        assert table[t, k + task.reach] == pytest.approx(_brute(task, t, k, skill), abs=1e-12)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_one_step_martingale_is_exact(preset):
    """E[Z_{t+1} | H_t] = Z_t over the policy's choices, including the answer (final jump)."""
    p = PRESETS[preset]
    rng = np.random.default_rng(0)
    for index in range(5):
        task = make_task(p, 0, index)
        skill = skill_at(p, 0)
        history: list[int] = [
            int(a) for a in rng.integers(p.num_actions, size=rng.integers(task.turns))
        ]
        t, k, ended = state_of(task, history)
        assert not ended
        z = true_value(task.id, history, preset=p)
        L = task.logit(k)
        pa = float(answer_prob(p, t, L))
        pm = (1 - p.malformed_prob - pa) * move_probs(task, t, skill)
        nxt = p.malformed_prob * true_value(task.id, [*history, WASTE], preset=p)
        nxt += sum(
            pm[a] * true_value(task.id, [*history, a], preset=p) for a in range(p.num_actions)
        )
        if t >= 1:
            # after an answer the value is sigmoid(L); the reward then jumps with mean sigmoid(L)
            nxt += pa * true_value(task.id, [*history, ANSWER], preset=p)
        assert nxt == pytest.approx(z, abs=1e-12)


def test_true_value_accepts_texts_and_skill():
    task = make_task(PRESETS["math-luck"], 0, 4)
    texts = ["Thought: x\naction 1"]
    assert true_value(task.id, texts) == true_value(task.id, [1])
    # answering before the first turn is refused by the env: a wasted turn
    assert true_value(task.id, ["answer"]) == true_value(task.id, [WASTE])
    lo, hi = (true_value(task.id, [], skill=s) for s in (0.0, 3.0))
    assert lo != hi
    with pytest.raises(ConfigError):
        true_value(task.id, [], preset="bfcl")


def test_skill_drift():
    p = PRESETS["math"]
    assert skill_at(p, 10) == p.skill
    assert skill_at(p, 5, drift=True) == pytest.approx(p.skill + 5 * p.drift_per_step)
    assert skill_at(p, 10_000, drift=True) == p.skill_max
    with pytest.raises(ConfigError):
        skill_at(p, 1, drift=-0.1)
