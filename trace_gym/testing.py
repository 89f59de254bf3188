"""A tiny deterministic reference env and fake policies, for tests and examples.

`CountdownEnv` is the smallest env that exercises the whole restore contract: episode
state (a running total), a turn limit, and the env's own RNG (each observation carries
a random "hint" drawn from ``self.np_random``, so a restore that forgot the RNG state
shows up as a different observation).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from trace_gym.core import TraceEnv, Transition
from trace_gym.policy import Conversation, PolicyOutput

_ADD = re.compile(r"^\s*add\s+(-?\d+)\s*$", re.I)
_ANSWER = re.compile(r"^\s*answer\s+(-?\d+)\s*$", re.I)


class CountdownEnv(TraceEnv):
    """Reach a target total with ``add N`` actions, then say ``answer N``.

    Reward 1 when the answer equals the target and the running total, else 0.
    """

    env_id = "trace/Countdown-v0"
    volatile_info_keys = frozenset()

    def __init__(self, num_tasks: int = 8, max_turns: int = 6, render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self._targets = [3 + 2 * i for i in range(num_tasks)]
        self._ids = [f"count-{i}" for i in range(num_tasks)]
        self._total = 0

    @property
    def task_ids(self) -> Sequence[str]:
        return self._ids

    @property
    def task_set(self) -> str:
        return f"countdown-{len(self._ids)}"

    def _reset_task(self, task_index: int) -> tuple[str, dict[str, Any]]:
        self._total = 0
        return f"Reach {self._targets[task_index]} with 'add N' actions, then 'answer N'.", {}

    def _step(self, action: str) -> Transition:
        target = self._targets[self._task_index]  # type: ignore[index]
        hint = int(self.np_random.integers(0, 1000))
        if m := _ADD.match(action):
            self._total += int(m.group(1))
            return Transition(f"total={self._total} hint={hint}", 0.0, False, {"action": "add"})
        if m := _ANSWER.match(action):
            ok = int(m.group(1)) == target == self._total
            return Transition(
                f"answered {m.group(1)}", float(ok), True, {"action": "answer", "correct": ok}
            )
        return Transition(
            f"unknown action; use 'add N' or 'answer N' (hint={hint})",
            0.0,
            False,
            {"action": "invalid"},
        )

    def _get_state(self) -> Any:
        return {"total": self._total}

    def _set_state(self, payload: Any) -> None:
        self._total = payload["total"]

    def example_action(self, rng: np.random.Generator) -> str:
        if rng.random() < 0.2:
            return f"answer {self._total}"
        return f"add {int(rng.integers(1, 4))}"


class RandomCountdownPolicy:
    """A seeded stochastic policy for `CountdownEnv`: the same seed gives the same turn.

    Adds 1-3 until the target is reached or overshot, then answers the running total.
    `fail_on_call` makes the k-th `generate` call (1-based) raise, for fault tests.
    """

    def __init__(self, fail_on_call: int | None = None, answer_prob: float = 0.15):
        self.calls = 0
        self.fail_on_call = fail_on_call
        self.answer_prob = answer_prob

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        self.calls += 1
        if self.fail_on_call is not None and self.calls == self.fail_on_call:
            raise RuntimeError(f"injected policy failure on call {self.calls}")
        out = []
        for conv in conversations:
            rng = np.random.default_rng(conv.seed)
            target = int(re.search(r"Reach (\d+)", conv.prompt).group(1))  # type: ignore[union-attr]
            total = 0
            for t in conv.turns:
                if m := re.search(r"total=(-?\d+)", t.observation):
                    total = int(m.group(1))
            if total >= target or rng.random() < self.answer_prob:
                text = f"answer {total}"
            else:
                text = f"add {int(rng.integers(1, 4))}"
            ids = [ord(c) for c in text]
            out.append(PolicyOutput(text=text, token_ids=ids, logprobs=[-1.0] * len(ids)))
        return out


class VersionedCountdownPolicy(RandomCountdownPolicy):
    """`RandomCountdownPolicy` whose "weights" (``answer_prob``) move with its ``version``, as
    a trainer's do: version v answers with probability 0.1 + 0.1 v (tests of weight pushes
    and of asynchronous rollouts)."""

    def __init__(self, version: int = 0):
        super().__init__(answer_prob=0.1)
        self.set(version)

    def set(self, version: int) -> None:
        self.version, self.answer_prob = version, 0.1 + 0.1 * version
