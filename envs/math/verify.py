"""Answer checking for trace/Math-v0: math-verify and our own judge in a sandboxed worker.

`math_verify` bounds its own work with ``signal.alarm``, which only works in a main
thread and can still hang on adversarial input (a tower of exponents, a huge
factorial). So every check runs in a separate worker process (`VerifierPool`) with a
hard wall-clock deadline; a worker that overruns is killed and replaced, and the answer
counts as wrong with ``timed_out`` in the details.

Two judges run side by side: our own (`_judge.decide`: string normalisation, then rules
for hedges, structure and equations, then a LaTeX grammar that builds sympy objects
without ever evaluating text), whose verdict is the reward whenever it reads both
answers, and math-verify, which decides only what our reader cannot read (it accepts
``7 = 5`` and ``0.333333`` for 1/3, so it never overrides our rules). The verdict says
which rule decided (`Verdict.judge`). math-verify does hand text to sympy's parsers, so
the worker runs under the same isolation as the interpreter cells (bubblewrap: read-only
root, no network, unprivileged uid, seccomp; see `isolation`), with only ``_judge.py``
of our code inside.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from trace_gym.envs.math import _judge
from trace_gym.envs.math import isolation as iso
from trace_gym.envs.math._judge import (
    canonical_equal,
    judge,
    normalize,
    parse_math,
    stated_precision,
    to_sympy,
)

from trace_gym.errors import ConfigError, TraceGymError

__all__ = [
    "Verdict",
    "VerifierPool",
    "canonical_equal",
    "judge",
    "normalize",
    "parse_math",
    "stated_precision",
    "to_sympy",
    "verify_answer",
]

log = logging.getLogger(__name__)

_JUDGE = Path(_judge.__file__)
#: address-space limit of a verifier worker (sympy on adversarial input can grow without bound)
WORKER_MEMORY_MB = 2048


class Verdict(NamedTuple):
    """The outcome of checking one final answer."""

    correct: bool
    #: which judge answered: 'exact' (normalised strings equal), 'canonical' (ours),
    #: 'math_verify' or 'timeout'
    method: str
    math_verify: bool | None
    canonical: bool | None
    timed_out: bool
    error: str | None
    #: the rule that decided: 'exact', 'symbolic', 'numeric', 'math-verify', 'refused' or 'timeout'
    judge: str = "refused"
    #: why, in a few words (for auditing rewards)
    why: str | None = None

    def to_info(self) -> dict[str, Any]:
        return dict(self._asdict())


class _Worker:
    """One verifier process (isolated like the cells) and its pipes."""

    def __init__(self, start_timeout_s: float):
        self.mode = iso.choose_mode("auto")
        try:
            self._start(start_timeout_s)
        except VerifierUnavailable:
            if self.mode != "namespaces":
                raise
            # a fallback machine where even the launcher's own isolation cannot start Python:
            # keep rewards working (our judge never evaluates text) and say so loudly
            log.warning(
                "math verifier: the isolated worker did not start; RUNNING THE VERIFIER UNISOLATED"
            )
            self.mode = "none"
            self._start(start_timeout_s)

    def _start(self, start_timeout_s: float) -> None:
        root = os.geteuid() == 0
        bwrap = self.mode == "bwrap"
        inside = iso.exposed_path(_JUDGE) if bwrap else str(_JUDGE)
        env = {
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "LANG": "C.UTF-8",
        }
        if bwrap:
            env["PYTHONPATH"] = iso.sandbox_pythonpath()
        spec = iso.Launch(
            [
                iso.python_executable() if bwrap else sys.executable,
                "-s",
                inside,
                str(WORKER_MEMORY_MB),
            ],
            self.mode,
            uid=iso.free_uid() if root and self.mode != "none" else None,
            expose={str(_JUDGE): inside},
            tmpfs_mb=16,
            env=env,
            self_isolating=False,
        )
        try:
            self.proc = iso.launch(
                spec,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except (OSError, subprocess.SubprocessError) as e:
            raise VerifierUnavailable(
                f"the math verifier worker could not be launched ({self.mode}): {e}"
            ) from e
        if self.readline(start_timeout_s) is None:
            self.kill()
            raise VerifierUnavailable(
                f"the math verifier worker did not start (isolation {self.mode})"
            )

    def readline(self, timeout_s: float) -> dict | None:
        ready = select.select([self.proc.stdout], [], [], timeout_s)[0]
        if not ready:
            return None
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None

    def kill(self) -> None:
        self.proc.kill()  # the process the host spawned (bwrap takes its sandbox down with it)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()  # type: ignore[union-attr]


class VerifierUnavailable(TraceGymError, RuntimeError):
    """The verifier worker process could not be started."""


class VerifierPool:
    """Worker processes that run `judge` under a hard deadline (killed when they overrun)."""

    def __init__(
        self,
        workers: int = 1,
        timeout_s: float = 10.0,
        inner_timeout_s: int = 3,
        start_timeout_s: float = 60.0,
    ):
        if workers < 1 or timeout_s <= 0 or inner_timeout_s < 1:
            raise ConfigError(
                "VerifierPool needs workers >= 1, timeout_s > 0 and inner_timeout_s >= 1"
            )
        self.timeout_s, self.inner_timeout_s, self.start_timeout_s = (
            timeout_s,
            inner_timeout_s,
            start_timeout_s,
        )
        self._free: list[_Worker] = []
        self._slots = threading.Semaphore(workers)
        self._lock = threading.Lock()
        self._all: list[_Worker] = []

    def _take(self) -> _Worker:
        with self._lock:
            if self._free:
                return self._free.pop()
        worker = _Worker(self.start_timeout_s)
        with self._lock:
            self._all.append(worker)
        return worker

    def check(
        self, pred: str, ref: str, string_match: bool = True, places: int | None = None
    ) -> dict[str, Any]:
        """Both verdicts, or ``{"timed_out": True}`` if the worker had to be killed.

        A multi-part `ref` (``data.Reference``: a str with ``parts`` and ``ordered``) is judged
        part by part (``_judge.judge_parts``). `places` is the problem's stated precision
        (``_judge.stated_precision``; None: exact answers only).
        """
        parts = getattr(ref, "parts", None)
        request = [pred, str(ref), self.inner_timeout_s, string_match]
        request += [list(parts) if parts else None, bool(getattr(ref, "ordered", True)), places]
        with self._slots:
            worker = self._take()
            result = None
            try:
                worker.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
                worker.proc.stdin.flush()  # type: ignore[union-attr]
                result = worker.readline(self.timeout_s)
            except (OSError, ValueError):
                result = None
            if result is not None:
                with self._lock:
                    self._free.append(worker)
                return result
            worker.kill()
            with self._lock:
                self._all.remove(worker)
            return {"timed_out": True}

    def close(self) -> None:
        """Stop every worker."""
        with self._lock:
            workers, self._all, self._free = self._all, [], []
        for worker in workers:
            worker.kill()


_SHARED: dict[float, VerifierPool] = {}
_SHARED_LOCK = threading.Lock()


def default_pool(timeout_s: float = 10.0) -> VerifierPool:
    """The process-wide verifier pool for a deadline (started on first use, stopped at exit)."""
    with _SHARED_LOCK:
        pool = _SHARED.get(timeout_s)
        if pool is None:
            pool = _SHARED[timeout_s] = VerifierPool(timeout_s=timeout_s)
            atexit.register(pool.close)
        return pool


def verify_answer(
    pred: str, ref: str, pool: VerifierPool | None = None, problem: str | None = None
) -> Verdict:
    """Is `pred` mathematically equivalent to the reference `ref`?

    `ref` is a string, or a multi-part ``data.Reference`` (a str carrying ``parts`` and
    ``ordered``), whose parts must each match, in order unless ``ordered`` is false.
    `problem` (its text) says whether a decimal approximation may count
    (``_judge.stated_precision``: "to the nearest hundredth", "as a decimal"); without it
    only exact answers do. The rule order is in docs/math.md ("How an answer is judged").
    """
    if normalize(pred) == normalize(ref) and normalize(ref):
        return Verdict(
            True, "exact", None, None, False, None, "exact", "the normalised strings are equal"
        )
    t0 = time.monotonic()
    res = (pool or default_pool()).check(pred, ref, places=stated_precision(problem))
    if res.get("timed_out"):
        log.info("math verifier timed out after %.1fs on %r", time.monotonic() - t0, pred[:80])
        return Verdict(False, "timeout", None, None, True, None, "timeout", "the check overran")
    mv, canon, error = res.get("math_verify"), res.get("canonical"), res.get("error")
    if res.get("canonical_confident"):  # our rules first: math-verify never overrides them
        rule = res.get("rule") or "symbolic"
        return Verdict(bool(canon), "canonical", mv, canon, False, error, rule, res.get("why"))
    if mv is not None:
        why = f"our reader could not read it ({res.get('why')})"
        return Verdict(bool(mv), "math_verify", mv, canon, False, error, "math-verify", why)
    return Verdict(
        False, "canonical", mv, canon, False, error, "refused", "neither judge could read it"
    )
