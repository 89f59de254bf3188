"""Hostile input to the BFCL env: calls the scripted player cannot parse back, over-long
messages, and memory that must not grow per step."""

from __future__ import annotations

import gc
import tracemalloc

import gymnasium as gym
import numpy as np
import pytest

import trace_gym
from trace_gym.errors import ConfigError


@pytest.mark.parametrize(
    "call",
    [
        '{"name": "\\ud800x", "arguments": {}}',  # a lone surrogate in the name (ast cannot encode it)
        '{"name": "cd", "arguments": {"\\udfff": 1}}',  # ... in an argument name
        '{"name": "a b", "arguments": {}}',  # a name that is not an identifier
        '{"name": "ls(", "arguments": {}}',
    ],
)
def test_example_action_after_a_call_that_does_not_parse_back(call):
    env = gym.make("trace/BFCL-v0", categories=("base",))
    env.reset(options={"task": "multi_turn_base_0"})
    obs, _, term, _, info = env.step(call)
    assert obs.startswith("Error during execution: ") and not term
    assert info["calls"][0]["status"] != "ok"
    action = env.unwrapped.example_action(np.random.default_rng(0))
    assert isinstance(action, str) and action  # the ground truth's next call, as before
    env.step(action)


@pytest.mark.parametrize(
    ("on_malformed", "event", "user_turn"), [("error", "calls", 0), ("end_turn", "end_of_turn", 1)]
)
def test_over_long_message_is_a_malformed_call(on_malformed, event, user_turn):
    env = gym.make(
        "trace/BFCL-v0", categories=("base",), max_action_chars=200, on_malformed=on_malformed
    )
    env.reset(options={"task": "multi_turn_base_0"})
    ck = trace_gym.checkpoint(env)
    long_call = "[cd(folder='" + "d" * 300 + "')]"
    obs, reward, term, trunc, info = env.step(long_call)
    assert (
        info["event"] == event
        and info["user_turn"] == user_turn
        and info["error"] == "action_too_long"
    )
    assert info["malformed"] == [
        "Error during execution: your message is 315 characters long; the limit is 200. Send a shorter message."
    ]
    if on_malformed == "error":
        assert obs == info["malformed"][0] and info["calls"] == []
    trace_gym.restore(env, ck)
    assert env.step(long_call)[0] == obs
    assert (
        env.step("[cd(folder='document')]")[4]["calls"][0]["status"] == "ok"
    )  # short ones still run
    with pytest.raises(ConfigError, match="max_action_chars"):
        gym.make("trace/BFCL-v0", categories=("base",), max_action_chars=0)


def test_memory_does_not_grow_with_steps_on_one_entry():
    # RSS grows while the per-entry ground-truth cache fills (bounded: one trace per
    # entry, about 100 MB for all 800); replaying one entry must not grow at all
    env = gym.make("trace/BFCL-v0", categories=("base",))
    rng = np.random.default_rng(0)

    def episodes(n: int) -> None:
        for _ in range(n):
            env.reset(options={"task": "multi_turn_base_3"})
            for _ in range(200):
                *_, term, trunc, _ = env.step(env.unwrapped.example_action(rng))
                if term or trunc:
                    break

    episodes(5)  # warm the caches
    tracemalloc.start()
    try:
        gc.collect()
        first = tracemalloc.get_traced_memory()[0]
        episodes(60)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - first
    finally:
        tracemalloc.stop()
    assert grown < 256 * 1024, f"{grown / 1024:.0f} KB kept after 60 episodes on one entry"
