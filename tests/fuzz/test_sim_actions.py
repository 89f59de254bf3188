"""The simulator's action parser on hostile text, and its action length cap."""

from __future__ import annotations

import gymnasium as gym
import pytest

import trace_gym
from trace_gym.sim.model import ANSWER, WASTE, parse_action


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("action 3", 3),
        ("Thinking...\nAction 2.", 2),
        ("action\t1", 1),
        ("ANSWER", ANSWER),
        ("action " + "9" * 5000, WASTE),  # raised ValueError (int() of 5000 digits)
        ("action 0" + "0" * 60, WASTE),  # longer than any valid action line
        ("action \u0663", WASTE),  # an Arabic-Indic 3 was accepted as move 3
        ("action \uff13", WASTE),  # a fullwidth 3
        ("action 3\u0663", WASTE),
        ("action \u20073", WASTE),  # a figure space is not a separator
        ("action 99", WASTE),  # out of range
        ("\ud800", WASTE),
        ("", WASTE),
    ],
)
def test_parse_action_takes_ascii_digits_of_bounded_length(text, code):
    assert parse_action(text, num_actions=4) == code


def test_sim_answers_over_long_actions_and_still_ends_on_time():
    env = gym.make("trace/Sim-v0")
    env.unwrapped.max_action_chars = 30
    env.reset(seed=0, options={"task": 0})
    turns = env.unwrapped.task.turns
    for t in range(turns):  # noqa: B007 - t is checked after the loop
        obs, reward, term, trunc, info = env.step("action 1" + " " * 40)
        assert obs.startswith("Error: your message is 48 characters long; the limit is 30.")
        assert "Could not parse an action" in obs and info["error"] == "action_too_long"
        if term or trunc:
            break
    assert t == turns - 1 and (term or trunc)  # the sim's own turn count still ends the episode
    env.reset(seed=0, options={"task": 0})
    ck = trace_gym.checkpoint(env)
    first = env.step("x" * 31)[:4]
    trace_gym.restore(env, ck)
    assert env.step("x" * 31)[:4] == first
