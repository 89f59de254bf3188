"""Issue 26 item 5: answers are checked in parallel, and a killed worker blocks nobody.

The pool's logic is tested with stand-in workers (no processes, no timing): a slow answer
blocks on an event until the test lets it go, so the order of events shows whether an
honest answer had to wait for it. One test uses real worker processes.
"""

from __future__ import annotations

import itertools
import threading

import pytest
from trace_gym.envs.math import verify
from trace_gym.envs.math.verify import VerifierPool, default_workers

_ids = itertools.count()


class _FakeProc:
    def __init__(self) -> None:
        self.stdin = self
        self.lines: list[str] = []

    def write(self, line: str) -> None:
        self.lines.append(line)

    def flush(self) -> None:
        pass


class FakeWorker:
    """Answers 'slow' after `release` is set, 'hang' never (a deadline expiry), else at once."""

    release = threading.Event()
    log: list[str] = []
    killed: list[int] = []

    def __init__(self, start_timeout_s: float) -> None:
        self.id = next(_ids)
        self.proc = _FakeProc()
        FakeWorker.log.append(f"start {self.id}")

    def readline(self, timeout_s: float) -> dict | None:
        pred = self.proc.lines[-1].split('"')[1]
        if pred == "hang":
            return None
        if pred == "slow":
            FakeWorker.release.wait(30)
        FakeWorker.log.append(f"done {pred} on {self.id}")
        return {"math_verify": True, "canonical": True, "worker": self.id}

    def kill(self) -> None:
        FakeWorker.killed.append(self.id)


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(verify, "_Worker", FakeWorker)
    FakeWorker.release = threading.Event()
    FakeWorker.log, FakeWorker.killed = [], []
    return FakeWorker


def test_default_pool_has_two_to_four_workers():
    assert 2 <= default_workers() <= 4
    assert VerifierPool().workers == default_workers()


def test_an_honest_answer_does_not_wait_for_a_slow_one(fake):
    pool = VerifierPool(standby=False)  # the default size
    slow = threading.Thread(target=pool.check, args=("slow", "1"))
    slow.start()
    while not any(line.startswith("start") for line in fake.log):
        threading.Event().wait(0.01)  # the slow answer has its worker
    assert pool.check("honest", "2")["math_verify"] is True
    fake.log.append("honest returned")
    fake.release.set()
    slow.join(30)
    assert fake.log.index("honest returned") < fake.log.index("done slow on 0")
    pool.close()


def test_a_killed_worker_is_replaced_by_the_standby_not_by_a_start_up(fake):
    pool = VerifierPool(workers=1, timeout_s=5.0)
    pool.check("warm", "1")  # starts the worker, and the standby in the background
    for thread in list(pool._threads):  # noqa: SLF001 - wait for the standby to be up
        thread.join(10)
    started_before = {int(line.split()[1]) for line in fake.log if line.startswith("start")}
    assert pool.check("hang", "1") == {"timed_out": True}
    served = pool.check("next", "1")["worker"]
    assert served in started_before  # the standby, already running when the worker was killed
    pool.close()
    assert pool.killed == 1 and len(fake.killed) >= 1


def test_each_answer_has_its_own_deadline(fake):
    pool = VerifierPool(workers=2, timeout_s=5.0, standby=False)
    seen = []

    def readline(self, timeout_s):
        seen.append(timeout_s)
        return {"math_verify": True}

    FakeWorker.readline = readline  # type: ignore[method-assign]
    try:
        pool.check("a", "1")
        pool.check("b", "1", timeout_s=0.5)
    finally:
        del FakeWorker.readline
    assert seen == [5.0, 0.5]
    pool.close()


def test_real_workers_check_two_answers_at_once():
    pool = VerifierPool(workers=2, timeout_s=60.0, standby=False)
    try:
        results: list[dict] = []
        threads = [
            threading.Thread(target=lambda: results.append(pool.check("\\frac{1}{2}", "0.5")))
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(results) == 2 and all(r.get("math_verify") is True for r in results)
        assert len(pool._idle) == 2  # noqa: SLF001 - two workers, each answered one
    finally:
        pool.close()
