"""`serve-retriever --workers N`: the supervisor starts, health-checks, restarts and stops its
workers, and a SIGKILLed supervisor takes every worker with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from trace_gym.envs.hotpotqa.retrievers import BM25Retriever, load_retriever
from trace_gym.envs.hotpotqa.supervisor import Supervisor, SupervisorOptions

from trace_gym.errors import ConfigError


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if entry.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid and _alive(int(entry)):
            kids.append(int(entry))
    return kids


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _retrieve(url: str, query: str, topk: int = 2) -> dict:
    body = json.dumps({"queries": [query], "topk": topk, "return_scores": True}).encode()
    with urllib.request.urlopen(
        urllib.request.Request(url + "/retrieve", data=body), timeout=30
    ) as r:
        return json.loads(r.read())


def _wait_dead(pids: list[int], seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.fixture()
def index(bundled, tmp_path):
    """A saved BM25 index over part of the bundled corpus, reopened memory-mapped."""
    BM25Retriever(bundled[1][:400]).save(tmp_path / "idx")
    return load_retriever(tmp_path / "idx", mmap=True)


def test_workers_start_serve_answer_health_and_stop(index):
    sup = Supervisor(index, port=0, options=SupervisorOptions(workers=2, stop_grace_s=5))
    sup.start()
    try:
        slots = sup.status()["workers"]
        assert sorted(slots) == [0, 1]
        for slot, w in slots.items():  # each worker answers on its private port, as itself
            h = _get(f"http://127.0.0.1:{w['port']}/health")
            assert h["pid"] == w["pid"] and h["worker"] == slot and h["passages"] == 400
        out = _retrieve(sup.url, "town")  # the shared port: Search-R1's shape
        item = out["result"][0][0]
        assert set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"}
        local = index.search(["town"], 2)[0]
        assert [i["document"]["id"] for i in out["result"][0]] == [h.passage.id for h in local]
        sup.check()
        assert sup.restarts == 0
    finally:
        sup.stop()
    assert _wait_dead([w["pid"] for w in slots.values()], 1) == []
    with pytest.raises(OSError):
        _get(sup.url + "/health")


def test_a_dead_or_hung_worker_is_replaced(index):
    options = SupervisorOptions(workers=2, health_timeout_s=0.3, health_failures=2, stop_grace_s=2)
    sup = Supervisor(index, port=0, options=options)
    sup.start()
    try:
        dead = sup.status()["workers"][0]["pid"]
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while sup.restarts == 0 and time.monotonic() < deadline:
            sup.check()
            time.sleep(0.05)
        assert sup.restarts == 1 and sup.status()["workers"][0]["pid"] != dead
        hung = sup.status()["workers"][1]["pid"]
        os.kill(hung, signal.SIGSTOP)  # alive but answering nothing
        sup.check()
        assert sup.restarts == 1 and sup.status()["workers"][1]["failures"] == 1
        sup.check()
        assert sup.restarts == 2 and sup.status()["workers"][1]["pid"] != hung
        assert not _alive(hung)
        for w in sup.status()["workers"].values():
            assert _get(f"http://127.0.0.1:{w['port']}/health")["pid"] == w["pid"]
    finally:
        sup.stop()


def test_unforkable_retrievers_and_bad_options_are_refused(index):
    index.forkable = False
    with pytest.raises(ConfigError, match="cannot be shared"):
        Supervisor(index, port=0)
    with pytest.raises(ConfigError, match="workers"):
        SupervisorOptions(workers=0)


def _serve(tmp_path: Path, workers: int, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "trace_gym.cli", "serve-retriever", "--port", "0"),
            *("--workers", str(workers)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={
            **os.environ,
            "TRACE_GYM_CACHE": str(tmp_path),
            "TRACE_GYM_BM25_BACKEND": "numpy",  # no numba compile at start-up
            **(env or {}),
        },
    )
    line = proc.stdout.readline()
    assert f"with {workers} workers" in line, line
    return proc, line.split(" at ")[1].split("/retrieve")[0]


@pytest.mark.parametrize("guard", ["pdeathsig and lifeline", "lifeline alone"])
def test_a_sigkilled_supervisor_leaves_no_worker(tmp_path, guard):
    env = {"TRACE_GYM_NO_PDEATHSIG": "1"} if guard == "lifeline alone" else {}
    proc, url = _serve(tmp_path, 3, env)
    try:
        workers = _children(proc.pid)
        assert len(workers) == 3
        assert _retrieve(url, "town")["result"]
        proc.kill()  # SIGKILL: no handler runs, no cleanup
        proc.wait(timeout=10)
        assert _wait_dead(workers) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _children(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_the_supervisor_and_its_workers(tmp_path):
    proc, url = _serve(tmp_path, 2)
    workers = _children(proc.pid)
    assert len(workers) == 2 and _get(url + "/health")["status"] == "ok"
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert _wait_dead(workers, 1) == []
