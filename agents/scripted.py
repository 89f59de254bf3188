"""Scripted policies: noisy oracles with a tunable skill, one per environment.

Each is a `Policy` (batched ``generate``) seeded only by ``Conversation.seed``: the same
conversation always gives the same turn. ``skill`` in [0, 1] is the chance that a
decision is the oracle's; otherwise the policy errs in an env-typical way (a vague
search, a wrong answer, a malformed tool call, a code cell with a bug), so trees mix
successes and failures and allocation has something to do.

- ``trace/Sim-v0``: the simulator's own `SimPolicy` (its skill is the preset's, so that
  ``env.true_value()`` describes it; ``skill`` is not applied);
- ``trace/HotpotQA-v0``: searches the supporting-fact titles, then answers (the gold
  answer with probability ``skill``);
- ``trace/BFCL-v0``: replays the ground-truth calls, each corrupted with
  probability ``1 - skill``;
- ``trace/Math-v0``: writes a code cell that prints the reference answer, then boxes
  what the interpreter printed (a perturbed answer with probability ``1 - skill``).

The real envs' policies read the task's reference data through the env they were given
(by task id), never through the conversation.

This module is the one registry of scripted policies: `SCRIPTED[env_id]` names each
policy class by its "module:Class" string, and `make_scripted(env_id, skill=..., env=...)`
builds one (the env, or a fresh one, gives access to the task's reference data). What an
env needs to play itself (its `example_action`, its benchmark's player) stays with the env
in ``envs/<env>/scripted.py``; these policies may build on it (BFCL's does), and the
simulator's agent is the simulator's own `trace_gym.sim.SimPolicy`.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from trace_gym.errors import ConfigError, unknown
from trace_gym.policy import Conversation, PolicyOutput

__all__ = [
    "SCRIPTED",
    "BFCLScripted",
    "HotpotQAScripted",
    "MathScripted",
    "ScriptedPolicy",
    "make_env",
    "make_scripted",
]


def make_env(env_id: str, **kwargs: Any) -> Any:
    """`gym.make(env_id)` for registered ids, plus the test env ``trace/Countdown-v0``."""
    if env_id == "trace/Countdown-v0":
        from trace_gym.testing import CountdownEnv

        return CountdownEnv(**kwargs)
    import gymnasium as gym

    import trace_gym  # noqa: F401  (registers the ids)

    return gym.make(env_id, **kwargs)


class ScriptedPolicy:
    """Base: per-conversation seeded decisions; subclasses write one turn's text."""

    env_id = ""

    def __init__(self, env: Any = None, skill: float = 0.8, **kwargs: Any):
        if not 0.0 <= skill <= 1.0:
            raise ConfigError(f"skill must be in [0, 1], got {skill}")
        self.skill = float(skill)
        self.env = env if env is not None else make_env(self.env_id, **kwargs)
        self.calls = 0

    @property
    def unwrapped(self) -> Any:
        return self.env.unwrapped

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        self.calls += 1
        out = []
        for conv in conversations:
            rng = np.random.default_rng(conv.seed)
            try:
                out.append(PolicyOutput(text=self.turn(conv, rng)))
            except Exception as e:  # a scripted bug must not take the batch down
                out.append(PolicyOutput(text="", error=f"scripted: {e!r}"))
        return out

    def ok(self, rng: np.random.Generator) -> bool:
        """One decision: the oracle's with probability `skill`."""
        return bool(rng.random() < self.skill)

    def turn(self, conv: Conversation, rng: np.random.Generator) -> str:
        raise NotImplementedError


class CountdownScripted(ScriptedPolicy):
    """`CountdownEnv` (tests): adds toward the target, answers the total."""

    env_id = "trace/Countdown-v0"

    def turn(self, conv: Conversation, rng: np.random.Generator) -> str:
        target = int(re.search(r"Reach (\d+)", conv.prompt).group(1))  # type: ignore[union-attr]
        total = 0
        for t in conv.turns:
            if m := re.search(r"total=(-?\d+)", t.observation):
                total = int(m.group(1))
        if total >= target:
            return f"answer {total}"
        step = min(3, target - total) if self.ok(rng) else int(rng.integers(1, 4))
        return f"add {step}"


class SimScripted:
    """`trace/Sim-v0` through the simulator's own `SimPolicy` (the preset's skill; `skill` is recorded only)."""

    env_id = "trace/Sim-v0"

    def __init__(self, env: Any = None, skill: float = 0.8, **kwargs: Any):
        from trace_gym.sim import SimPolicy

        preset = kwargs.get("preset")
        if env is not None:
            preset = getattr(env.unwrapped, "preset", preset)
        self.skill = float(skill)
        self.inner = SimPolicy(preset)

    def set_step(self, step: int) -> None:
        self.inner.set_step(step)

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        # token ids of SimPolicy are fake (word hashes): drop them so token backends
        # downstream (SFT, critics) tokenise the text themselves
        return [
            PolicyOutput(text=o.text, error=o.error) for o in self.inner.generate(conversations)
        ]


class HotpotQAScripted(ScriptedPolicy):
    """Searches the supporting-fact titles in order, then answers.

    Each search is the gold title with probability ``skill`` (else a few words of the
    question); the answer is the gold one with probability ``skill`` (else a wrong
    entity: a distractor title or a word of the question).
    """

    env_id = "trace/HotpotQA-v0"

    def __init__(self, env: Any = None, skill: float = 0.8, **kwargs: Any):
        super().__init__(env, skill, **kwargs)
        self._tasks = {t.id: t for t in self.unwrapped.tasks}

    def turn(self, conv: Conversation, rng: np.random.Generator) -> str:
        task = self._tasks[conv.task_id]
        titles = list(task.supporting_titles) or [task.question]
        searches = sum("<search>" in t.action for t in conv.turns)
        if searches < len(titles):
            if self.ok(rng):
                query = titles[searches]
            else:
                words = re.findall(r"\w+", task.question)
                k = max(1, min(len(words), 3))
                start = int(rng.integers(0, max(1, len(words) - k + 1)))
                query = " ".join(words[start : start + k]) or "wikipedia"
            return f"<think>I need to look up {query}.</think>\n<search>{query}</search>"
        if self.ok(rng):
            answer = task.answer
        else:
            pool = (
                [t for t, _ in task.context if t not in titles]
                or re.findall(r"\w+", task.question)
                or ["unknown"]
            )
            answer = pool[int(rng.integers(len(pool)))]
        return f"<think>The passages give the answer.</think>\n<answer>{answer}</answer>"


class BFCLScripted(ScriptedPolicy):
    """Replays the BFCL ground truth (Hermes ``<tool_call>`` syntax); errs with 1 - skill."""

    env_id = "trace/BFCL-v0"

    def __init__(self, env: Any = None, skill: float = 0.8, **kwargs: Any):
        super().__init__(env, skill, **kwargs)
        from trace_gym.envs.bfcl.scripted import ScriptedBFCL

        self._oracle = ScriptedBFCL(error_rate=1.0 - self.skill, syntax="hermes")
        self._entries = {e.id: e for e in self.unwrapped.entries}

    def turn(self, conv: Conversation, rng: np.random.Generator) -> str:
        entry = self._entries[conv.task_id]
        return self._oracle.act(entry, [t.action for t in conv.turns], rng)


class MathScripted(ScriptedPolicy):
    """Writes a code cell printing the reference answer, then boxes what it printed.

    The cell is correct with probability ``skill`` (else it prints a perturbed answer or
    raises); after a cell that printed something, the policy boxes the printed value
    (or, with probability ``1 - skill``, a perturbed one); after a failed cell it retries.
    """

    env_id = "trace/Math-v0"

    def __init__(self, env: Any = None, skill: float = 0.8, **kwargs: Any):
        super().__init__(env, skill, **kwargs)
        self._answers = _math_answers(self.unwrapped)

    def turn(self, conv: Conversation, rng: np.random.Generator) -> str:
        answer = self._answers[conv.task_id]
        last = conv.turns[-1].observation if conv.turns else ""
        lines = [
            ln.strip()
            for ln in last.splitlines()
            if ln.strip() and not ln.strip().startswith("```")
        ]
        printed = lines[-1] if lines and "Error" not in last else ""
        if printed and len(conv.turns) >= 1:
            value = printed if self.ok(rng) else _perturb(printed, rng)
            return f"The computation gives {value}.\n\\boxed{{{value}}}"
        if self.ok(rng):
            body = f"answer = {answer!r}\nprint(answer)"
        elif rng.random() < 0.5:
            body = f"answer = {_perturb(answer, rng)!r}\nprint(answer)"
        else:
            body = "answer = undefined_name + 1\nprint(answer)"
        return f"Let me compute it.\n<python>\n{body}\n</python>"


def _perturb(value: str, rng: np.random.Generator) -> str:
    """A plausible wrong answer: an integer moved by 1-3, else a digit appended."""
    try:
        return str(int(value) + int(rng.integers(1, 4)) * (1 if rng.random() < 0.5 else -1))
    except ValueError:
        return f"{value}{int(rng.integers(1, 10))}"


def _math_answers(env: Any) -> dict[str, str]:
    """task id -> reference answer of a math env (its tasks carry `answer`)."""
    tasks = getattr(env, "tasks", None) or getattr(getattr(env, "_tasks", None), "tasks", None)
    if tasks is None:
        raise AttributeError("the math env exposes no `tasks`; cannot read reference answers")
    out = {}
    for tid, t in zip(env.task_ids, tasks, strict=True):
        out[tid] = str(t["answer"] if isinstance(t, dict) else t.answer)
    return out


#: env id -> "module:Class" of its scripted policy, imported on first use (the real envs'
#: policies pull their env modules); another package registers its env's the same way
SCRIPTED: dict[str, str] = {
    "trace/Countdown-v0": "trace_gym.agents.scripted:CountdownScripted",
    "trace/Sim-v0": "trace_gym.agents.scripted:SimScripted",
    "trace/HotpotQA-v0": "trace_gym.agents.scripted:HotpotQAScripted",
    "trace/BFCL-v0": "trace_gym.agents.scripted:BFCLScripted",
    "trace/Math-v0": "trace_gym.agents.scripted:MathScripted",
    "trace/Wrapped-v0": "trace_gym.wrap:WrappedScripted",
}


def make_scripted(env_id: str, *, skill: float = 0.8, env: Any = None, **kwargs: Any) -> Any:
    """A scripted policy for `env_id` (`env` gives it the task data; else it makes one)."""
    if env_id not in SCRIPTED:
        raise unknown("scripted policy (env id)", env_id, SCRIPTED)
    module, name = SCRIPTED[env_id].split(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(env=env, skill=skill, **kwargs)
