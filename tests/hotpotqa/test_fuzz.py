"""Seeded fuzzing of trace/HotpotQA-v0: random actions never raise, the env stays usable,
and nothing is left running (a short run here, 10,000 actions in the slow set)."""

from __future__ import annotations

import multiprocessing
import os
import random
import threading

import gymnasium as gym
import pytest
from trace_gym.envs.hotpotqa import scripted

_PIECES = [
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "<SEARCH>",
    "</Answer>",
    "<information>",
    "Doc 1(Title: x) ",
    "who",
    " directed ",
    "Ostra",
    "?",
    "\n",
    "\x00",
    "\ud800",
    "٣",
    "🙂",
    "é",
    "<",
    ">",
    "/",
    "\\",
    '"',
    "{}",
    "(",
    ")",
    " " * 50,
]


def _action(rng: random.Random, cap: int) -> str:
    u = rng.random()
    if u < 0.05:  # longer than the cap
        return rng.choice(_PIECES) * (cap // max(1, len(_PIECES[0])) + 10)
    if u < 0.10:  # a flood of unclosed tags, just under the cap
        return "<search>" * (cap // 8 - 1)
    if u < 0.15:
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randint(0, 40)))
    return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 30)))


def _threads() -> int:
    return (
        len(os.listdir("/proc/self/task"))
        if os.path.isdir("/proc/self/task")
        else threading.active_count()
    )


def fuzz(n: int, seed: int) -> dict[str, int]:
    cap = 4096
    env = gym.make("trace/HotpotQA-v0", max_action_chars=cap, max_turns=6)
    rng = random.Random(seed)
    env.reset(seed=seed, options={"task": 0})
    env.step("<search>Ostra</search>")  # the index's worker pool starts on the first search
    children, threads = len(multiprocessing.active_children()), _threads()
    seen: dict[str, int] = {}
    for i in range(n):
        obs, reward, term, trunc, info = env.step(_action(rng, cap))
        assert isinstance(obs, str) and reward in (0.0, 1.0)
        kind = info.get("error") or info.get("action", "?")
        seen[kind] = seen.get(kind, 0) + 1
        if term or trunc:
            env.reset(options={"task": (i * 7) % len(env.unwrapped.task_ids)})
    # still usable: the scripted searcher solves a question after all that
    env.reset(options={"task": 0})
    observations: list[str] = []
    base = env.unwrapped
    for _ in range(6):
        obs, reward, term, trunc, _ = env.step(
            scripted.next_action(base.current_task.question, observations)
        )
        observations.append(obs)
        if term or trunc:
            break
    assert term and reward == 1.0
    assert len(multiprocessing.active_children()) == children and _threads() <= threads
    env.close()
    return seen


def test_fuzz_short():
    seen = fuzz(300, seed=0)
    assert (
        seen.get("action_too_long", 0) > 0
        and seen.get("unclosed_tag", 0) > 0
        and seen.get("search", 0) > 0
    )


@pytest.mark.slow
def test_fuzz_10000_actions():
    seen = fuzz(10_000, seed=1)
    assert sum(seen.values()) == 10_000
