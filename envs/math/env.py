"""trace/Math-v0: tool-integrated math with a persistent, sandboxed Python interpreter.

Each turn the assistant either runs one Python cell (a fenced python block or
``<python>...</python>``), whose output comes back as the observation, or gives a final
answer in ``\\boxed{...}`` / ``<answer>...</answer>``, which ends the episode with reward 1
if the answer is equivalent to the reference (our judge's rules, math-verify for what our
reader cannot read; ``info["judge"]`` names the rule) and 0 otherwise. Interpreter state carries across turns like a notebook.

Checkpoints carry the *code ledger* (every cell that ran to completion, in order) as
their portable payload and, in-process, a handle to a forked copy of the interpreter,
so a local restore costs one fork and a pickled checkpoint restores by replaying the
ledger in a fresh interpreter.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from trace_gym.envs.math.data import MathTask, TaskSet, load_dataset
from trace_gym.envs.math.protocol import FORMAT_HINT, format_cell, parse_action
from trace_gym.envs.math.sandbox import CellResult, Sandbox, SandboxConfig, SandboxError
from trace_gym.envs.math.verify import (
    VerifierPool,
    VerifierUnavailable,
    default_pool,
    verify_answer,
)

from trace_gym.core import TraceEnv, Transition
from trace_gym.errors import ConfigError

__all__ = ["MathEnv", "PROMPT_TEMPLATE"]

log = logging.getLogger(__name__)

PROMPT_TEMPLATE = (
    "{problem}\n\n"
    "You can use a Python interpreter: put code in a ```python ... ``` block (or "
    "<python>...</python>) and its output (printed text and the value of the last line) "
    "comes back in the next message. Variables persist between blocks. When you are done, "
    "give the final answer as \\boxed{{...}}."
)
MAX_ANSWER_CHARS = 2000
_CACHE: dict[tuple[str, int | None], TaskSet] = {}


def _task_set(dataset: str | Path | None, limit: int | None) -> TaskSet:
    key = (str(Path(dataset).resolve()) if dataset not in (None, "default") else "default", limit)
    if key not in _CACHE:
        _CACHE[key] = load_dataset(dataset, limit)
    return _CACHE[key]


@dataclass
class _Episode:
    ledger: list[str]
    cells: int = 0
    answer: str | None = None


class MathEnv(TraceEnv):
    """Solve a math problem with a persistent sandboxed Python interpreter; answer in \\boxed{}.

    Args:
        dataset: ``None``/``"default"`` for the embedded generated set, or a path to a
            DeepScaleR-format JSON, JSONL or parquet file (problem / answer / solution).
        limit: keep only the first `limit` problems.
        max_turns: the env's own turn limit (episodes are truncated after it).
        sandbox: a `SandboxConfig` (or a dict of its fields) for limits and isolation.
        max_code_chars: longest cell that is run (longer ones get an error observation).
        verifier_timeout_s: hard deadline of one answer check (the worker is killed after it).
    """

    env_id = "trace/Math-v0"
    volatile_info_keys: ClassVar[frozenset[str]] = frozenset({"elapsed_s", "timings"})

    def __init__(
        self,
        dataset: str | Path | None = None,
        limit: int | None = None,
        max_turns: int = 8,
        sandbox: SandboxConfig | dict[str, Any] | None = None,
        max_code_chars: int = 50_000,
        verifier_timeout_s: float = 10.0,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if isinstance(sandbox, dict):
            sandbox = SandboxConfig(**sandbox)
        if max_code_chars < 1 or verifier_timeout_s <= 0:
            raise ConfigError("MathEnv needs max_code_chars >= 1 and verifier_timeout_s > 0")
        self.config = sandbox or SandboxConfig()
        self.max_code_chars = int(max_code_chars)
        self._tasks = _task_set(dataset, limit)
        self._ids = self._tasks.ids
        self._sandbox = Sandbox(self.config)
        self._pool: VerifierPool = default_pool(float(verifier_timeout_s))  # shared, closed at exit
        self._ep = _Episode([])
        self._evicted_seen = 0
        self._notes: dict[str, Any] = {}  # said in the next step's info

    # ------------------------------------------------------------------ tasks
    @property
    def task_ids(self) -> Sequence[str]:
        return self._ids

    @property
    def task_set(self) -> str:
        return self._tasks.fingerprint

    @property
    def tasks(self) -> tuple[MathTask, ...]:
        """Every problem with its reference answer, in `task_ids` order (for scripted policies)."""
        return self._tasks.tasks

    @property
    def current_task(self) -> MathTask | None:
        """The current problem *with its reference answer and solution* (for scripted policies)."""
        return None if self._task_index is None else self._tasks.tasks[self._task_index]

    @property
    def sandbox(self) -> Sandbox:
        """The interpreter sandbox (for diagnostics: isolation report, pids)."""
        return self._sandbox

    def _reset_task(self, task_index: int) -> tuple[str, dict[str, Any]]:
        self._ep = _Episode([])
        self._notes = {}
        self._sandbox.start()
        self._sandbox.discard_live()
        task = self._tasks.tasks[task_index]
        info = {
            "dataset": self._tasks.name,
            "isolation": self._sandbox.isolation.get("mode"),
            **{
                k: v
                for k, v in task.meta.items()
                if k in ("topic", "type", "level", "difficulty", "year")
            },
        }
        return PROMPT_TEMPLATE.format(problem=task.problem), info

    # ------------------------------------------------------------------ turns
    def _step(self, action: str) -> Transition:
        parsed = parse_action(action)
        if parsed.kind == "code":
            return self._run_code(parsed.code or "", parsed.code_blocks)
        if parsed.kind == "answer":
            return self._answer(parsed.answer or "")
        return Transition(FORMAT_HINT, 0.0, False, {"action": "invalid"})

    def _run_code(self, code: str, blocks: int) -> Transition:
        self._ep.cells += 1
        info: dict[str, Any] = {"action": "code", "cell": self._ep.cells, "code_blocks": blocks}
        info.update(self._take_notes())
        if len(code) > self.max_code_chars:
            info["status"] = "rejected"
            msg = f"Error: the code block has {len(code)} characters; the limit is {self.max_code_chars}. Nothing was run."
            return Transition(f"```output\n{msg}\n```", 0.0, False, info)
        if self._ep.ledger and not self._sandbox.has_live:
            # the interpreter was lost between cells (a failed snapshot fork, a process killed
            # after its cell answered): rebuild the state from the ledger before this cell,
            # or it would run in a pristine interpreter
            self._rebuild()
        result = self._run_faithfully(code)
        cfg = self.config
        obs = format_cell(
            result.status,
            result.output,
            result.total_chars,
            result.error,
            timeout_s=cfg.cell_timeout_s,
            cpu_s=cfg.cell_cpu_s,
        )
        if blocks > 1:
            obs += "\n(Only the first of your code blocks was run.)"
        if result.threads:
            obs += (
                f"\n(Note: {result.threads} thread(s) started by your code are still running; a checkpoint "
                "of this state is restored by re-running the code, not from a snapshot.)"
            )
            info["threads"] = result.threads
        info.update(
            status=result.status,
            output_chars=result.total_chars,
            truncated=result.total_chars > len(result.output),
            elapsed_s=round(result.elapsed_s, 6),
        )
        if result.status in ("ok", "error"):
            self._ep.ledger.append(code)
        else:
            info["rolled_back"] = self._rebuild()
        return Transition(obs, 0.0, False, info)

    def _run_faithfully(self, code: str) -> CellResult:
        """Run `code` in the episode's state, rebuilding that state when it cannot be trusted.

        A restored interpreter that finds its files or limits tampered with refuses to run
        the cell; the state is then replayed (in a new sandbox the second time, when the
        pristine zygote itself was tampered with) and the cell runs there.
        """
        for attempt in range(3):
            try:
                result = self._sandbox.run(code)
            except SandboxError as e:
                log.warning("math sandbox failed, restarting it and replaying the ledger: %s", e)
                self._sandbox.close()
                self._rebuild()
                result = self._sandbox.run(code)
            if result.status != "refused":
                return result
            if attempt:
                self._sandbox.close()
            self._rebuild()
        return result._replace(status="crashed", error=None)

    def _take_notes(self) -> dict[str, Any]:
        """Memory-budget events since the last step (evicted snapshots, a replayed restore)."""
        notes, self._notes = self._notes, {}
        evicted = self._sandbox.evicted_for_memory
        if evicted > self._evicted_seen:
            notes["snapshots_evicted"] = evicted - self._evicted_seen
        self._evicted_seen = evicted
        return notes

    def _rebuild(self) -> bool:
        """After a timeout or crash: a fresh interpreter that re-ran the ledger."""
        if self._sandbox.replay(self._ep.ledger):
            return True
        log.warning("math env: ledger replay failed after a crash; the interpreter starts empty")
        self._ep.ledger = []
        self._sandbox.discard_live()
        return False

    def _answer(self, answer: str) -> Transition:
        task = self.current_task
        assert task is not None
        self._ep.answer = answer
        if len(answer) > MAX_ANSWER_CHARS or not answer.strip():
            verdict_info = {
                "correct": False,
                "method": "rejected",
                "math_verify": None,
                "canonical": None,
                "timed_out": False,
                "error": "empty or over-long answer",
                "judge": "refused",
                "why": "empty or over-long answer",
            }
        else:
            try:
                verdict_info = verify_answer(
                    answer, task.answer, self._pool, problem=task.problem
                ).to_info()
            except VerifierUnavailable as e:  # a bad answer is data: reward 0, the episode ends
                log.warning("math env: %s", e)
                verdict_info = {
                    "correct": False,
                    "method": "unavailable",
                    "math_verify": None,
                    "canonical": None,
                    "timed_out": False,
                    "error": str(e),
                    "judge": "unavailable",
                    "why": "the verifier worker did not start",
                }
        correct = bool(verdict_info["correct"])
        info = {
            "action": "answer",
            "answer": answer[:MAX_ANSWER_CHARS],
            "correct": correct,
            # the rule that decided: exact, symbolic, numeric, math-verify, refused, timeout
            "judge": verdict_info["judge"],
            "verifier": verdict_info,
        }
        return Transition(f"Final answer received: {answer[:200]}", float(correct), True, info)

    # ------------------------------------------------------------------ checkpoint hooks
    def _get_state(self) -> Any:
        return {
            "ledger": tuple(self._ep.ledger),
            "cells": self._ep.cells,
            "answer": self._ep.answer,
        }

    def _apply(self, payload: Any) -> None:
        self._ep = _Episode(list(payload["ledger"]), int(payload["cells"]), payload["answer"])

    def _set_state(self, payload: Any) -> None:
        self._apply(payload)
        if not self._ep.ledger:
            self._sandbox.discard_live()
        elif not self._sandbox.replay(self._ep.ledger):
            log.warning(
                "math env: replaying a checkpoint's ledger did not finish; state may differ"
            )

    def _local_handle(self) -> Any:
        if self._done or not self._sandbox.has_live:
            return None
        return self._sandbox.snapshot()

    def _restore_local(self, handle: Any, payload: Any) -> bool:
        if not self._sandbox.restore_snapshot(handle):
            if self._sandbox.was_evicted(handle):
                self._notes["restore"] = (
                    "replay: this checkpoint's snapshot was dropped to keep the sandbox under "
                    "its memory budget"
                )
            return False
        self._apply(payload)
        return True

    def release(self, checkpoint: Any) -> None:
        if getattr(checkpoint, "local", None) is not None:
            self._sandbox.release(checkpoint.local)

    def close(self) -> None:
        self._sandbox.close()
        super().close()

    # ------------------------------------------------------------------ demo actions
    def example_action(self, rng: np.random.Generator) -> str:
        """A realistic turn: an exploratory code cell, or (sometimes) a boxed answer."""
        task = self.current_task
        if task is not None and self._turn >= 1 and rng.random() < 0.2:
            guess = task.answer if rng.random() < 0.5 else "0"
            return f"Based on the computation, the answer is $\\boxed{{{guess}}}$."
        cells = [
            "Let me draw a few random samples to get a feel for it.\n```python\nimport random\n"
            "samples = [random.randint(1, 100) for _ in range(5)]\nprint(samples)\n```",
            "I'll define a helper.\n```python\ndef f(n):\n    return sum(k * k for k in range(n + 1))\nprint(f(10))\n```",
            "<python>\nimport sympy as sp\nx = sp.symbols('x')\nsp.solve(x**2 - 5*x + 6, x)\n</python>",
            "Keep a running count.\n```python\ntry:\n    total += 1\nexcept NameError:\n    total = 1\nprint('total =', total)\n```",
            "```python\nfrom math import comb, factorial\n[comb(10, k) for k in range(4)], factorial(6)\n```",
            "```python\nimport random\nrandom.random()\n```",
            "Check a divisibility pattern.\n```python\nimport sympy as sp\nprint(sp.factorint(2**20 - 1))\n```",
            "```python\nvalues = [f(k) for k in range(3)]\nvalues\n```",
        ]
        return cells[int(rng.integers(len(cells)))]
