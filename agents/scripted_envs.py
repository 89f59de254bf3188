"""Scripted policies of the real envs (math, HotpotQA, BFCL), on their reference data.

Each reads the task's reference data through the env it was given (by task id), never
through the conversation, and decides with ``np.random.default_rng(conversation.seed)``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from trace_gym.agents.scripted import ScriptedPolicy

from trace_gym.policy import Conversation

__all__ = ["POLICIES", "BFCLScripted", "HotpotQAScripted", "MathScripted"]


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
            pool = [t for t, _ in task.context if t not in titles] or re.findall(r"\w+", task.question) or ["unknown"]
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
        lines = [ln.strip() for ln in last.splitlines() if ln.strip() and not ln.strip().startswith("```")]
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


#: env id -> scripted policy class
POLICIES: dict[str, type] = {
    "trace/HotpotQA-v0": HotpotQAScripted,
    "trace/BFCL-v0": BFCLScripted,
    "trace/Math-v0": MathScripted,
}
