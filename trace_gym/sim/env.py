"""`trace/Sim-v0`: the tree-branching simulator as a restorable text env.

The env applies the moves the assistant writes (``action N``), ends the episode on
``answer`` or after the task's turn count, and draws the reward Bernoulli(sigmoid(
logit)). Observations are text with *noisy* clues about the latent logit (a progress
word and gauge, whether the last move seemed to help), so a text predictor has real
but imperfect signal. Every draw comes from the env RNG mixed with a hash of the
assistant text (see `SimEnv._turn_rng`). The exact value
``true_value()`` is available for the oracle and for measuring predictors; it is
computed under the simulated policy (`trace_gym.sim.SimPolicy`) at the env's current
skill (`set_step` under drift).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from trace_gym.core import TraceEnv, Transition
from trace_gym.errors import ResetNeeded
from trace_gym.sim.model import (
    ANSWER,
    HINTS,
    WASTE,
    make_task,
    parse_action,
    sigmoid,
    task_id,
    value_at,
)
from trace_gym.sim.presets import SimPreset, get_preset, skill_at

__all__ = ["SimEnv"]

_DIFFICULTY = ("brutal", "hard", "tricky", "fair", "easy", "trivial")
_PROGRESS = ("stuck", "struggling", "unsure", "promising", "solid")


def _hint_text(task, t: int) -> str:
    """v2: what the observation before turn t says (the shared move effects key on it)."""
    if not task.hints:
        return ""
    flag = " This step looks decisive." if t in task.knife else ""
    return f" Next: you notice {HINTS[task.hints[t]]}.{flag}"


class SimEnv(TraceEnv):
    """Synthetic tasks with a known success martingale (presets ``math``, ``hotpotqa``, ``bfcl``).

    Args:
        preset: a name in `trace_gym.sim.PRESETS` or a `SimPreset`.
        num_tasks: size of the task pool (default: the preset's).
        seed: seed of the task pool (task parameters are a pure function of it).
        drift: False, True (the preset's per-step skill gain) or a per-step gain; only
            `true_value` depends on it, through `set_step`.
    """

    env_id = "trace/Sim-v0"
    volatile_info_keys = frozenset()

    def __init__(
        self,
        preset: str | SimPreset = "math",
        num_tasks: int | None = None,
        seed: int = 0,
        drift: bool | float = False,
        render_mode: str | None = None,
    ):
        self.preset = get_preset(preset)
        super().__init__(max_turns=self.preset.turns_max, render_mode=render_mode)
        self.pool_seed = int(seed)
        n = self.preset.num_tasks if num_tasks is None else int(num_tasks)
        self._ids = [task_id(self.preset, self.pool_seed, i) for i in range(n)]
        fingerprint = zlib.crc32(repr(self.preset).encode())
        self._task_set = f"sim-{self.preset.name}-{self.pool_seed}-{n}-{fingerprint:08x}"
        self.drift = drift
        self.skill = skill_at(self.preset, 0, drift)
        self._k = 0
        self._reward: float | None = None

    # ------------------------------------------------------------------ contract
    @property
    def task_ids(self) -> Sequence[str]:
        return self._ids

    @property
    def task_set(self) -> str:
        return self._task_set

    @property
    def task(self):
        """Hidden parameters of the current task."""
        return make_task(self.preset, self.pool_seed, self._task_index)

    def _reset_task(self, task_index: int) -> tuple[str, dict[str, Any]]:
        self._k, self._reward = 0, None
        task = make_task(self.preset, self.pool_seed, task_index)
        K = self.preset.num_actions
        prompt = (
            f"Task {task.id}. Topic: {task.topic}. Initial assessment: {_DIFFICULTY[task.clue]} "
            f"(level {task.clue}/5). You have {task.turns} turns. Each turn reply with "
            f"'action N' for N in 0..{K - 1}, or 'answer' to finish early."
        ) + _hint_text(task, 0)
        return prompt, {"topic": task.topic, "turns": task.turns, "num_actions": K}

    def _step(self, action: str) -> Transition:
        task = self.task
        t = self._turn  # turns completed before this one
        code = parse_action(action, self.preset.num_actions)
        rng = self._turn_rng(action)
        head = f"[turn {t + 1}/{task.turns}]"
        if code == ANSWER and t >= 1:
            return self._finish(f"{head} Answer submitted.", {"action": "answer"}, rng)
        if code == ANSWER or code == WASTE:
            why = (
                "answering needs at least one completed turn"
                if code == ANSWER
                else "could not parse an action"
            )
            obs = f"{head} {why[0].upper()}{why[1:]}; reply with 'action N' (N in 0..{self.preset.num_actions - 1}) or 'answer'."
            info: dict[str, Any] = {"action": "malformed"}
        else:
            shift = int(task.shifts[t, code])
            self._k += shift
            felt = self.preset.grid * shift + 0.5 * self.preset.obs_noise * rng.normal()
            effect = (
                "that seemed to help"
                if felt > 0.25
                else "that seemed to hurt"
                if felt < -0.25
                else "no clear effect"
            )
            noise = self.preset.obs_noise * self.preset.obs_decay ** (t + 1)
            reading = float(sigmoid(task.logit(self._k) + noise * rng.normal()))
            word = _PROGRESS[int(np.searchsorted([0.2, 0.4, 0.6, 0.8], reading))]
            gauge = min(9, int(reading * 10))
            obs = f"{head} You tried action {code}; {effect}. Progress check: {word} (gauge {gauge}/9)."
            info = {"action": "move", "move": code}
        if t + 1 >= task.turns:
            return self._finish(f"{obs} Out of turns.", info, rng)
        return Transition(obs + _hint_text(task, t + 1), 0.0, False, info)

    def _turn_rng(self, action: str) -> np.random.Generator:
        # The env's draws mix its own RNG with a hash of the assistant text: the restore
        # contract holds (same state + same text -> same draws), and two replays from one
        # prefix that write different text get independent noise and reward draws.
        digest = hashlib.blake2b(action.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return np.random.default_rng(
            [int(self.np_random.integers(2**63)), int.from_bytes(digest, "little")]
        )

    def _finish(self, obs: str, info: dict[str, Any], rng: np.random.Generator) -> Transition:
        p = float(sigmoid(self.task.logit(self._k)))
        self._reward = float(rng.random() < p)
        verdict = "correct" if self._reward else "incorrect"
        return Transition(
            f"{obs} Final result: {verdict}.",
            self._reward,
            True,
            {**info, "correct": bool(self._reward)},
        )

    def _get_state(self) -> Any:
        return {"k": self._k, "reward": self._reward}

    def _set_state(self, payload: Any) -> None:
        self._k, self._reward = int(payload["k"]), payload["reward"]

    def example_action(self, rng: np.random.Generator) -> str:
        """A valid action: a random move, or (after the first turn, 10%) an answer."""
        if self._turn >= 1 and rng.random() < 0.1:
            return "answer"
        return f"action {int(rng.integers(self.preset.num_actions))}"

    # ------------------------------------------------------------------ simulator extras
    def set_step(self, step: int) -> None:
        """Set the training step, which sets the simulated policy's skill under drift."""
        self.skill = skill_at(self.preset, step, self.drift)

    def true_value(self) -> float:
        """Exact Z_t = P(success | simulator state) under `SimPolicy` at `self.skill`.

        After the episode ended this is the realised reward (the final jump).
        """
        if self._task_index is None:
            raise ResetNeeded(
                f"{self.id}: call env.reset() (or restore a checkpoint) before true_value()"
            )
        if self._done and self._reward is not None:
            return float(self._reward)
        ended = self._turn >= self.task.turns
        return value_at(self.task, self._turn, self._k, ended, self.skill)

    def latent_logit(self) -> float:
        """The current latent success logit (for tests and diagnostics)."""
        return float(self.task.logit(self._k))
