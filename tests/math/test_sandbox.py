"""The sandbox itself: isolation as reported, limits in force, clean shutdown, bench smoke."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trace_gym.envs.math.sandbox import Sandbox, SandboxConfig

ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def sandbox():
    sb = Sandbox(SandboxConfig(cell_timeout_s=3.0, max_snapshots=4))
    sb.start()
    yield sb
    sb.close()


def test_isolation_when_started_as_root(sandbox):
    if not ROOT:
        pytest.skip("privilege drop and namespaces are only attempted when started as root")
    iso = sandbox.isolation
    assert iso["uid"] is not None and iso["uid"] != 0
    out = sandbox.run(
        "import os, resource\n"
        "st = open('/proc/self/status').read()\n"
        "print(os.getuid(), os.geteuid(), 'NoNewPrivs:\\t1' in st)\n"
        "print(resource.getrlimit(resource.RLIMIT_NPROC)[1], resource.getrlimit(resource.RLIMIT_AS)[1] >> 20)\n"
        "print(os.getcwd(), os.listdir('.'))"
    ).output.split("\n")
    assert out[0] == f"{iso['uid']} {iso['uid']} True"
    nproc, as_mb = map(int, out[1].split())
    assert nproc < 200 and as_mb == sandbox.config.memory_mb
    if iso["pidns"]:  # pids inside the namespace are small and the env's own pid is invisible
        assert int(sandbox.run("import os\nos.getpid()").output) < 100
        assert "ProcessLookupError" in (
            sandbox.run(f"import os\nos.kill({os.getpid()}, 0)").error or ""
        )
    if iso["netns"]:
        assert "unreachable" in (
            sandbox.run("import socket\nsocket.create_connection(('8.8.8.8', 53), 1)").error or ""
        )
    if iso["cgroup"]:
        limit = Path(sandbox._cgroup, "pids.max").read_text().strip()  # noqa: SLF001
        assert int(limit) == sandbox.process_limit


def test_cell_output_value_and_error(sandbox):
    sandbox.fresh()
    r = sandbox.run("a = 2\nprint('hi')\na * 21")
    assert (r.status, r.output) == ("ok", "hi\n42\n")
    r = sandbox.run("undefined_name")
    assert r.status == "error" and "NameError" in r.error and "<cell" in r.error


def test_close_leaves_nothing_behind():
    sb = Sandbox(SandboxConfig(cell_timeout_s=3.0))
    sb.start()
    sb.run("import subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)")
    sb.snapshot()
    pids = sb.pids()
    assert len(pids) >= 4  # bootstrap, init, zygote, live, snapshot, sleep
    sb.close()
    alive = [
        p
        for p in pids
        if Path(f"/proc/{p}").exists() and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"
    ]
    assert alive == []


def test_restore_after_kill_everything_gives_the_checkpoint_state():
    """kill(-1) leaves the zygote and snapshots dying for a while; restore must not use them."""
    sb = Sandbox(SandboxConfig(cell_timeout_s=3.0, max_snapshots=4))
    sb.start()
    try:
        if not (sb.isolation.get("pidns") and sb.isolation.get("uid") is not None):
            pytest.skip(
                "kill(-1) from a cell is only contained with a PID namespace and a sandbox uid"
            )
        ledger = ["import random\nrandom.seed(7)\nstate = 21"]
        expected = f"21 {random.Random(7).random()}\n"
        for _ in range(3):
            sb.fresh()
            assert sb.run(ledger[0]).status == "ok"
            snap = sb.snapshot()
            assert sb.run("import os, signal\nos.kill(-1, signal.SIGKILL)").status == "ok"
            # SIGKILL is queued on the zygote before the cell answers, however long it takes to die
            assert not sb._zygote.alive()  # noqa: SLF001 - the check restore and replay rely on
            if not sb.restore_snapshot(snap):
                assert sb.replay(ledger)
            r = sb.run("print(state, random.random())")
            assert (r.status, r.output) == ("ok", expected)
    finally:
        sb.close()


def test_failed_snapshot_fork_keeps_the_live_interpreter():
    sb = Sandbox(SandboxConfig(cell_timeout_s=3.0, max_snapshots=1, extra_processes=4))
    sb.start()
    try:
        if not (sb.isolation.get("cgroup") or sb.isolation.get("uid") is not None):
            pytest.skip("without a sandbox uid or pids cgroup nothing bounds the cell's forks")
        sb.fresh()
        fill = (
            "import os, time\nkids = 0\nwhile True:\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(600)\n        os._exit(0)\n"
            "    kids += 1\nprint(kids > 0)"
        )
        assert sb.run(fill).output == "True\n"
        # every process slot is taken: the snapshot fails, but the interpreter and its state stay
        assert sb.snapshot() is None
        assert sb.has_live and sb.run("print(kids > 0)").output == "True\n"
    finally:
        sb.close()


def test_bench_cli_smoke(tmp_path):
    out = tmp_path / "bench.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "bench",
            "math-env",
            "--seconds",
            "0.2",
            "--repeats",
            "2",
            "--hostile-checkpoints",
            "2",
            "--slow-answers",
            "0",
            "--busy",
            "0,1",
            "--profile",
            "--json",
            str(out),
        ],
        check=True,
        timeout=240,
        capture_output=True,
    )
    res = json.loads(out.read_text())
    for key in ("cells_per_s", "restore_fork_ms", "restore_replay_ms", "snapshot_rss_mb"):
        assert res[key] > 0, key
    levels = res["busy_levels"]
    assert [lv["busy_processes"] for lv in levels.values()] == [0, 1]
    for level in levels.values():
        assert level["layers"].keys() == level["profile"].keys()
        for phases in level["profile"].values():
            assert phases["total_ms"] > phases["cell_exec_ms"] > 0
            assert phases["mean_ms"]["total"] > phases["mean_ms"]["cell_exec"] > 0
    assert res["goals"]["cells_per_s"]["busy_processes"] == 1
    assert (
        res["goals"]["cells_per_s"]["value"] == levels["busy_1"]["layers"]["bwrap"]["cells_per_s"]
    )
    assert res["restored_output"] == "[1, 2, 3] 2002 55"
    hostile = res["hostile_memory"]
    assert hostile["pss_peak_mb"] > 250 and hostile["checkpoints"] == 2
    if hostile["memory_cgroup"] is not None:
        assert 250 < hostile["peak_mb"] <= hostile["memory_total_mb"]


def test_clean_up_of_stale_cgroups_spares_live_owners():
    """Another env process cleaning up must not remove a live sandbox's (still empty) cgroup:
    it did once, between our mkdir and the sandbox joining it, and that launch failed."""
    mine = Sandbox(SandboxConfig())
    made = mine._make_cgroups() if ROOT else []  # noqa: SLF001 - empty until a sandbox joins them
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stale = [os.path.join(os.path.dirname(cg), f"trace_gym_math_{dead}_feedc0de") for cg in made]
    try:
        for path in stale:
            os.mkdir(path)
        other = (
            "from trace_gym.envs.math.sandbox import Sandbox, SandboxConfig\n"
            "sb = Sandbox(SandboxConfig())\nsb._cgroups = sb._make_cgroups()\nsb._remove_cgroups()\n"
        )
        subprocess.run([sys.executable, "-c", other], check=True, timeout=60)
        assert all(os.path.isdir(cg) for cg in made), "a live sandbox's cgroup was removed"
        assert not any(os.path.exists(path) for path in stale), "a dead owner's cgroup was left"
        assert bool(made) == ROOT  # as root the cgroups exist here, so the check above ran
    finally:
        for path in [*made, *stale]:
            if os.path.isdir(path):
                os.rmdir(path)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _await_state(pid: int, states: tuple[str | None, ...], timeout_s: float = 5.0) -> str | None:
    deadline = time.monotonic() + timeout_s
    while _state(pid) not in states and time.monotonic() < deadline:
        time.sleep(0.01)
    return _state(pid)


def test_restore_stops_the_replaced_interpreter_and_kills_it_after_the_first_cell(sandbox):
    """The interpreter a restore replaces runs nothing more (stopped at the handover), and
    is gone once the restored one has answered (its teardown is kept off the restore)."""
    sandbox.fresh()
    assert sandbox.run("x = 1").status == "ok"
    handle = sandbox.snapshot()
    assert (
        sandbox.run(
            "import threading, time\nticks = [0]\n"
            "def tick():\n    while True:\n        ticks[0] += 1\n        time.sleep(0.001)\n"
            "threading.Thread(target=tick, daemon=True).start()"
        ).status
        == "ok"
    )
    old = sandbox._live.pid  # noqa: SLF001 - the process under test
    assert sandbox.restore_snapshot(handle)
    assert _await_state(old, ("T", "t")) in ("T", "t")
    assert sandbox.run("x").output == "1\n"
    assert _await_state(old, (None, "Z", "X")) in (None, "Z", "X")
    # a second restore before any cell retires the first restored interpreter at once
    first = sandbox._live.pid  # noqa: SLF001
    assert sandbox.restore_snapshot(handle)
    second = sandbox._live.pid  # noqa: SLF001
    assert sandbox.restore_snapshot(handle)
    assert _await_state(first, (None, "Z", "X")) in (None, "Z", "X")
    assert _await_state(second, ("T", "t")) in ("T", "t")
    assert sandbox.run("x + 1").output == "2\n"
    assert _await_state(second, (None, "Z", "X")) in (None, "Z", "X")
    sandbox.release(handle)


def test_a_reply_bigger_than_the_small_receive_buffer_arrives_whole():
    sb = Sandbox(SandboxConfig(max_output_chars=100_000))
    try:
        res = sb.run("print('\\u00e9' * 99_999)")  # 2 bytes each in UTF-8: over 64 KiB
        assert res.status == "ok" and res.output == "\u00e9" * 99_999 + "\n"
        assert sb.run("print('ok')").output == "ok\n"
    finally:
        sb.close()


@pytest.mark.parametrize("levels", ["0,0", "x", "65", ""])
def test_bench_busy_levels_are_checked(levels):
    done = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "bench", "math-env", "--busy", levels],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--busy" in done.stderr
