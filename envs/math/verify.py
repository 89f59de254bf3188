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
import secrets
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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
from trace_gym.envs.math._proc import Members, stop_spawned
from trace_gym.envs.math.sandbox import make_cgroups

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
        self.cgroups: list[str] = []
        self.memcg: str | None = None
        if root and self.mode != "none":
            # a memory total for the worker and everything sympy makes it start (RLIMIT_AS is
            # per process); also what lets `kill` find every process of it
            name = f"trace_gym_math_{os.getpid()}_v{secrets.token_hex(6)}"
            self.cgroups, self.memcg = make_cgroups(name, WORKER_MEMORY_MB, None)
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
            cgroups=self.cgroups,
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
            self._remove_cgroups()
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
        """Stop the worker inside-out (bwrap last), so each process is reaped by its parent."""
        stop_spawned(self.proc, Members(self.cgroups, self.proc.pid), wrapper=self.mode == "bwrap")
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()  # type: ignore[union-attr]
        self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        for cg in self.cgroups:
            with contextlib.suppress(OSError):
                os.rmdir(cg)
        self.cgroups = []


class VerifierUnavailable(TraceGymError, RuntimeError):
    """The verifier worker process could not be started."""


#: every worker is launched from these long-lived threads (an executor's threads live as long
#: as it does): bwrap's --die-with-parent (a parent-death signal) fires when the *thread* that
#: spawned it ends, so a worker started from a short-lived thread (a background replacement, a
#: caller's thread pool) would die with it. Several, so a standby's start does not delay a
#: replacement's
_LAUNCHER = ThreadPoolExecutor(4, thread_name_prefix="math-verifier-launch")


def _new_worker(start_timeout_s: float) -> _Worker:
    return _LAUNCHER.submit(_Worker, start_timeout_s).result()


def default_workers() -> int:
    """Verifier workers per pool: one per core, at least 2 and at most 4."""
    return min(4, max(2, os.cpu_count() or 1))


class VerifierPool:
    """Worker processes that run `judge`, each answer under its own hard deadline.

    Up to `workers` answers are checked at once. A worker that overruns is killed and
    replaced off the caller's path: a warm standby (started in the background at first use)
    takes its place at once, so answers waiting for a worker wait for the next one to free,
    at most one deadline, never for a start-up; a new standby is then started.
    """

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = 10.0,
        inner_timeout_s: int = 3,
        start_timeout_s: float = 60.0,
        standby: bool = True,
    ):
        workers = default_workers() if workers is None else workers
        if workers < 1 or timeout_s <= 0 or inner_timeout_s < 1:
            raise ConfigError(
                "VerifierPool needs workers >= 1, timeout_s > 0 and inner_timeout_s >= 1"
            )
        self.workers, self.standby = workers, standby
        self.timeout_s, self.inner_timeout_s, self.start_timeout_s = (
            timeout_s,
            inner_timeout_s,
            start_timeout_s,
        )
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._serving = 0  # workers idle, busy or starting for service
        self._spare: _Worker | None = None
        self._spare_starting = False
        self._threads: list[threading.Thread] = []
        self._closed = False
        #: workers killed for overrunning their deadline (each replaced)
        self.killed = 0

    def _background(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._cond:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _acquire(self) -> _Worker:
        """An idle worker, a new one while the pool is below `workers`, else wait for one."""
        with self._cond:
            if self.standby and self._spare is None and not self._spare_starting:
                self._spare_starting = True
                self._background(self._start_spare)
            while not self._idle and self._serving >= self.workers:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._serving += 1
        try:
            return _new_worker(self.start_timeout_s)
        except VerifierUnavailable:
            with self._cond:
                self._serving -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if self._closed:
                self._serving -= 1
            else:
                self._idle.append(worker)
                self._cond.notify()
                return
        worker.kill()

    def _replace(self, worker: _Worker) -> None:
        """Put the standby in a killed worker's place (or free its slot), then kill it."""
        with self._cond:
            self.killed += 1
            spare, self._spare = self._spare, None
            if spare is not None and not self._closed:
                self._idle.append(spare)
            else:
                self._serving -= 1
                if spare is not None:
                    self._background(spare.kill)
            if self.standby and not self._spare_starting and not self._closed:
                self._spare_starting = True
                self._background(self._start_spare)
            self._cond.notify()
        self._background(worker.kill)  # reaping it takes a moment: nobody waits for that

    def _start_spare(self) -> None:
        try:
            spare = _new_worker(self.start_timeout_s)
        except VerifierUnavailable as e:
            log.warning("math verifier: the standby worker did not start: %s", e)
            spare = None
        with self._cond:
            self._spare_starting = False
            if spare is not None and (self._closed or self._spare is not None):
                extra, spare = spare, None
            else:
                extra = None
                self._spare = spare or self._spare
        if extra is not None:
            extra.kill()

    def check(
        self,
        pred: str,
        ref: str,
        string_match: bool = True,
        places: int | None = None,
        *,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Both verdicts, or ``{"timed_out": True}`` if the worker had to be killed.

        A multi-part `ref` (``data.Reference``: a str with ``parts`` and ``ordered``) is judged
        part by part (``_judge.judge_parts``). `places` is the problem's stated precision
        (``_judge.stated_precision``; None: exact answers only). `timeout_s` (default: the
        pool's) is this answer's own deadline, counted from when a worker has it.
        """
        parts = getattr(ref, "parts", None)
        request = [pred, str(ref), self.inner_timeout_s, string_match]
        request += [list(parts) if parts else None, bool(getattr(ref, "ordered", True)), places]
        worker = self._acquire()
        try:
            worker.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
            worker.proc.stdin.flush()  # type: ignore[union-attr]
            result = worker.readline(self.timeout_s if timeout_s is None else timeout_s)
        except (OSError, ValueError):
            result = None
        if result is not None:
            self._release(worker)
            return result
        self._replace(worker)
        return {"timed_out": True}

    def close(self) -> None:
        """Stop every worker, and wait for the ones being stopped or started in the background."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            spare, self._spare = self._spare, None
            self._serving -= len(idle)
            threads = list(self._threads)
        for worker in [*idle, *([spare] if spare else [])]:
            worker.kill()
        for thread in threads:
            thread.join(30)
        with self._cond:
            self._closed = False  # usable again: new workers start on demand


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
