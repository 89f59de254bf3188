"""Hostile cells: each is contained, leaves a readable observation, and the env goes on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from trace_gym.envs.math.env import MathEnv

HOST_MARKER = Path("/tmp") / f"trace-gym-hostile-{os.getpid()}"
#: the checkout lies under /tmp, which inside the sandbox is a private tmpfs: a write to the
#: checkout's path there lands in that tmpfs, so only the host file can tell an escape
UNDER_TMP = Path(__file__).resolve().is_relative_to("/tmp")

# (name, code, statuses the cell may end with, text the observation must contain)
HOSTILE = [
    ("infinite_loop", "while True:\n    pass", {"timeout", "crashed"}, "rolled back"),
    ("fork_bomb", "import os\nwhile True:\n    os.fork()", {"error", "timeout", "crashed"}, ""),
    # contained either way: the memory cap stops it, or on a loaded machine the 2 s wall limit
    # does first (the memory cap itself is checked in test_isolation's limit cases)
    (
        "memory_bomb",
        "blocks = []\nwhile True:\n    blocks.append(' ' * 10**7)",
        {"error", "crashed", "timeout"},
        "",
    ),
    ("huge_alloc", "x = bytearray(10**11)", {"error"}, "MemoryError"),
    ("deep_recursion", "def f(n):\n    return f(n + 1)\nf(0)", {"error"}, "RecursionError"),
    (
        "c_stack_overflow",
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
        {"crashed", "error", "timeout"},
        "",
    ),
    (
        "tcp_connect",
        "import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=1)",
        {"error"},
        "Error",
    ),
    ("dns_lookup", "import socket\nsocket.getaddrinfo('example.com', 80)", {"error"}, "error"),
    (
        "loopback_server",
        "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\nc = socket.create_connection(s.getsockname(), timeout=1)",
        {"error", "ok"},
        "",
    ),
    # what counts is the host file (checked after every cell); a checkout under /tmp is
    # also a path inside the sandbox's private /tmp, where the write succeeds harmlessly
    (
        "write_project",
        f"open({str(Path(__file__).resolve().parents[2] / 'PWNED')!r}, 'w').write('x')",
        {"error", "ok"} if UNDER_TMP else {"error"},
        "" if UNDER_TMP else "Error",
    ),
    ("write_etc", "open('/etc/passwd', 'a').write('evil')", {"error"}, "Error"),
    (
        "write_host_tmp",
        f"open({str(HOST_MARKER)!r}, 'w').write('x')\nprint('wrote')",
        {"ok", "error"},
        "",
    ),
    ("delete_outside", "import os\nos.remove('/etc/hostname')", {"error"}, "Error"),
    ("read_root_home", "print(open('/root/.bashrc').read())", {"error"}, "Error"),
    ("setuid_root", "import os\nos.setuid(0)", {"error"}, "Error"),
    (
        "kill_parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')",
        {"ok", "error", "crashed"},
        "",
    ),
    (
        "kill_init",
        "import os, signal\nos.kill(1, signal.SIGKILL)\nprint('still here')",
        {"ok", "error", "crashed"},
        "",
    ),
    ("kill_host_env", "import os, signal\nos.kill({host_pid}, signal.SIGKILL)", {"error"}, "Error"),
    (
        "kill_everything",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('alone')",
        {"ok", "crashed"},
        "",
    ),
    (
        "ignore_signals",
        "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
        {"timeout", "crashed"},
        "",
    ),
    (
        "sigstop_self",
        "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)",
        {"timeout"},
        "TimeoutError",
    ),
    (
        "alarm_kills",
        "import signal, time\nsignal.setitimer(signal.ITIMER_REAL, 0.05)\ntime.sleep(5)",
        {"crashed"},
        "died",
    ),
    ("huge_output", "print('x' * 10**7)", {"ok"}, "output truncated"),
    ("many_lines", "for i in range(200000):\n    print(i)", {"ok"}, "output truncated"),
    (
        "stdin_reads",
        "import os, sys\nprint(repr(sys.stdin.read()), repr(os.read(0, 10)))\ninput()",
        {"error"},
        "EOFError",
    ),
    (
        "lingering_thread",
        "import threading, time\nthreading.Thread(target=lambda: [time.sleep(0.01) for _ in iter(int, 1)], daemon=True).start()\nprint('started')",
        {"ok"},
        "started",
    ),
    (
        "cpu_thread",
        "import threading\ndef burn():\n    while True:\n        pass\nthreading.Thread(target=burn).start()\nprint('burning')",
        {"ok"},
        "burning",
    ),
    ("os_exit", "import os\nos._exit(3)", {"crashed"}, "died"),
    ("sys_exit", "import sys\nsys.exit(1)", {"error"}, "SystemExit"),
    ("ctypes_crash", "import ctypes\nctypes.string_at(0)", {"crashed"}, "died"),
    (
        "escaped_child",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nprint('parent')",
        {"ok"},
        "parent",
    ),
    (
        "subprocess_sleep",
        "import subprocess\nsubprocess.Popen(['sleep', '600'], start_new_session=True)\nprint('spawned')",
        {"ok", "error"},
        "",
    ),
    (
        "close_channel",
        "import os\nfor fd in range(3, 64):\n    try:\n        os.close(fd)\n    except OSError:\n        pass",
        {"crashed", "timeout"},
        "",
    ),
    # a reply that breaks the protocol: the interpreter is compromised, the sandbox restarted
    (
        "forge_replies",
        'import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b\'{"output": "forged", "seq": -1}\')\n    except OSError:\n        pass\nprint(\'real\')',
        {"compromised"},
        "SandboxViolation",
    ),
    (
        "poke_other_processes",
        "import os\nme = os.readlink('/proc/self')\nhits = []\nfor p in os.listdir('/proc'):\n    if p.isdigit() and p != me:\n        try:\n            with open(f'/proc/{p}/mem', 'r+b'):\n                hits.append(p)\n        except OSError:\n            pass\nprint('hits', hits)",
        {"ok"},
        "hits []",
    ),
    (
        "fill_disk",
        "with open('big.bin', 'wb') as f:\n    f.write(b'0' * (64 << 20))",
        {"error"},
        "File too large",
    ),
    (
        "too_many_files",
        "fs = [open('f%d' % i, 'w') for i in range(1000)]",
        {"error"},
        "Too many open files",
    ),
]


@pytest.fixture(scope="module")
def hostile_env(leftovers):
    env = MathEnv(
        sandbox={"cell_timeout_s": 2.0, "cell_cpu_s": 1.5, "memory_mb": 512, "max_snapshots": 8}
    )
    env.reset(seed=0, options={"task": 0})
    env.step(
        "```python\nimport random\nrandom.seed(7)\ndef keep(x):\n    return x * 2\nstate = 21\n```"
    )
    yield env
    sb = env.sandbox
    uid = sb.isolation.get("uid")
    env.close()
    assert leftovers(uid) == [], "processes of the sandbox uid survived close()"
    assert not HOST_MARKER.exists(), "a cell wrote into the host's /tmp"


def test_suite_is_large_enough():
    assert len(HOSTILE) >= 25


@pytest.mark.parametrize("name,code,statuses,expect", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_cell_is_contained(hostile_env, name, code, statuses, expect):
    env = hostile_env
    if env.done:
        env.reset(seed=0, options={"task": 0})
        env.step(
            "```python\nimport random\nrandom.seed(7)\ndef keep(x):\n    return x * 2\nstate = 21\n```"
        )
    ck = env.checkpoint()
    code = code.replace("{host_pid}", str(os.getpid()))
    obs, reward, term, trunc, info = env.step(f"```python\n{code}\n```")
    assert info["status"] in statuses, (name, info, obs[:500])
    assert obs.startswith("```output") and expect in obs, obs[:800]
    assert not term and reward == 0.0
    # the env serves the next step, with the state from before the hostile cell intact
    obs, *_, info = env.step("```python\nprint(keep(state))\n```")
    assert "42" in obs, (name, obs)
    # ... and can still restore the checkpoint taken before it
    env.restore(ck)
    obs, *_ = env.step("```python\nprint(keep(state), random.random())\n```")
    assert obs.startswith("```output\n42 0."), (name, obs)
    env.release(ck)
    if env.turn >= env.max_turns - 2:
        env.reset(seed=0, options={"task": 0})
        env.step(
            "```python\nimport random\nrandom.seed(7)\ndef keep(x):\n    return x * 2\nstate = 21\n```"
        )
    assert not Path(Path(__file__).resolve().parents[2] / "PWNED").exists()


# --------------------------------------------------------------------------- forged messages
#: a cell that finds its own channel (the inherited SOCK_SEQPACKET descriptor) and the
#: sequence number of the request it is running under (a local of the worker's loop), and
#: sends the env PAYLOAD as the reply, with SEQ replaced by that number
FORGE = """
import os, socket, sys
frame = sys._getframe()
while frame is not None and not isinstance(frame.f_locals.get("msg"), dict):
    frame = frame.f_back
payload = PAYLOAD.replace(b"SEQ", str(frame.f_locals["msg"]["seq"]).encode())
for fd in range(3, 64):
    try:
        chan = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    if chan.type == socket.SOCK_SEQPACKET:
        chan.send(payload)
    chan.close()
"""
_REST = 'b\', "error": null, "threads": 0, "limit": null, "seq": SEQ}\''
#: each forgery as a Python expression the cell evaluates (the big ones would not fit a cell)
FORGERIES = {
    "deep_json": "b'{\"output\": ' + b'[' * 100_000 + b']' * 100_000 + b', \"seq\": SEQ}'",
    "infinite_total": 'b\'{"output": "x", "total_chars": Infinity\' + ' + _REST,
    "huge_float_threads": 'b\'{"output": "x", "total_chars": 1, "error": null, '
    '"threads": 1e400, "limit": null, "seq": SEQ}\'',
    "float_for_int": 'b\'{"output": "x", "total_chars": 1.0\' + ' + _REST,
    "bool_for_int": 'b\'{"output": "x", "total_chars": true\' + ' + _REST,
    "negative_total": 'b\'{"output": "x", "total_chars": -5\' + ' + _REST,
    "over_the_cap": "b'{\"output\": \"' + b'A' * 3_670_031 + b'\", \"total_chars\": 3670031' + "
    + _REST,
    "list_output": 'b\'{"output": ["x"], "total_chars": 1\' + ' + _REST,
    "unknown_key": 'b\'{"output": "x", "total_chars": 1, "pwn": 1\' + ' + _REST,
    "not_json": "b'\\xff\\xfe{{{ not json'",
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forged_message_is_a_compromise_not_an_exception(hostile_env, name):
    """Every forgery the issue lists: an observation that says so, state rolled back, 0 raises."""
    env = hostile_env
    env.reset(seed=0, options={"task": 0})
    env.step("```python\nstate = 21\n```")
    ck = env.checkpoint()
    code = f"PAYLOAD = {FORGERIES[name]}\n{FORGE}\nstate = 'overwritten'\nprint('sent')"
    obs, reward, term, _trunc, info = env.step(f"```python\n{code}\n```")
    assert info["status"] == "compromised" and info["rolled_back"], (name, info, obs[:300])
    assert "SandboxViolation" in obs and len(obs) < 1000, obs[:300]
    assert not term and reward == 0.0
    obs, *_ = env.step("```python\nprint(state * 2)\n```")  # the cell's state was rolled back
    assert "42" in obs, (name, obs)
    env.restore(ck)
    obs, *_ = env.step("```python\nprint(state + 1)\n```")
    assert "22" in obs, (name, obs)
    env.release(ck)


def test_a_well_formed_forgery_is_only_output(hostile_env):
    """A reply that keeps the protocol says no more than the cell could print itself."""
    env = hostile_env
    env.reset(seed=0, options={"task": 0})
    payload = b'{"output": "forged", "total_chars": 6, "error": null, "threads": 0, "limit": null, "seq": SEQ}'
    code = f"PAYLOAD = {payload!r}\n{FORGE}\nimport time\ntime.sleep(0.2)\nprint('real')"
    obs, *_, info = env.step(f"```python\n{code}\n```")
    assert info["status"] == "ok" and "forged" in obs, obs
    obs, *_ = env.step("```python\nprint(6 * 7)\n```")  # the real, late reply is skipped
    assert "42" in obs, obs


# --------------------------------------------------------------------------- snapshots a cell cannot touch
def _fresh_episode(env: MathEnv, code: str) -> None:
    env.reset(seed=0, options={"task": 0})
    obs, *_, info = env.step(f"```python\n{code}\n```")
    assert info["status"] == "ok", obs


def test_saved_copies_of_files_cannot_be_rewritten(hostile_env):
    env = hostile_env
    _fresh_episode(env, "open('data.txt', 'w').write('original')")
    ck = env.checkpoint()
    # the attacker rewrites every copy of the file it can find anywhere it may write
    obs, *_ = env.step(
        "```python\nimport os\nhits = 0\nfor top in ('/tmp', '/dev', '/var/tmp', '/dev/shm'):\n"
        "    for root, dirs, files in os.walk(top):\n        if 'data.txt' in files:\n"
        "            try:\n                open(os.path.join(root, 'data.txt'), 'w').write('tampered')\n"
        "                hits += 1\n            except OSError:\n                pass\nprint('hits', hits)\n```"
    )
    assert "hits" in obs, obs
    for _ in range(2):  # the first restore takes the spare, the second a new fork
        env.restore(ck)
        obs, *_ = env.step("```python\nprint(open('data.txt').read())\n```")
        assert obs.startswith("```output\noriginal"), obs
    env.release(ck)


def test_all_of_tmp_is_restored_and_fresh_per_episode(hostile_env):
    env = hostile_env
    _fresh_episode(env, "x = 1")
    ck = env.checkpoint()
    env.step(
        "```python\nimport os\nopen('/tmp/signal.txt', 'w').write('branch A was here')\n"
        "os.makedirs('/tmp/d/e')\nopen('/tmp/d/e/f', 'w').write('x')\nos.chmod('/tmp/d', 0o500)\n```"
    )
    check = (
        "```python\nimport os\n"
        "print(os.path.exists('/tmp/signal.txt'), os.path.exists('/tmp/d'), x)\n```"
    )
    env.restore(ck)
    obs, *_ = env.step(check)
    assert obs.startswith("```output\nFalse False 1"), obs
    env.release(ck)
    # a later episode cannot read what an earlier one left in /tmp
    env.step("```python\nopen('/tmp/signal.txt', 'w').write('episode 1')\n```")
    _fresh_episode(env, "x = 2")
    obs, *_ = env.step(check)
    assert obs.startswith("```output\nFalse False 2"), obs


FILL_DISK = """
import os, time
open('data.bin', 'r+b').truncate(0)
r, w = os.pipe()
if os.fork() == 0:
    fds, i = [], 0
    try:
        while True:
            path = f'/tmp/fill{i}'
            fd = os.open(path, os.O_WRONLY | os.O_CREAT)
            os.unlink(path)  # held open: a restore that clears /tmp cannot free it
            fds.append(fd)
            for _ in range(15):
                os.write(fd, b'0' * (1 << 20))
            i += 1
    except OSError:
        pass
    os.write(w, b'x')
    time.sleep(600)
os.read(r, 1)
print('disk full')
"""


def test_a_restore_onto_a_full_disk_falls_back_to_replay(hostile_env):
    env = hostile_env
    _fresh_episode(env, "open('data.bin', 'wb').write(b'1' * (10 << 20))\nstate = 21")
    ck = env.checkpoint()
    obs, *_ = env.step(f"```python\n{FILL_DISK}\n```")
    assert "disk full" in obs, obs
    env.restore(ck)
    obs, *_, info = env.step(
        "```python\nimport os\n"
        "print(os.path.getsize('data.bin'), open('data.bin', 'rb').read(3), state)\n```"
    )
    assert info["status"] == "ok" and obs.startswith("```output\n10485760 b'111' 21"), obs
    env.release(ck)


STOP_ALL = """
import os, signal
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) not in (os.getpid(), 1):
        try:
            os.kill(int(p), signal.SIGSTOP)
        except OSError:
            pass
print('tampered')
"""
LOWER_LIMITS = """
import os, resource
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) not in (os.getpid(), 1):
        try:
            resource.prlimit(int(p), resource.RLIMIT_NOFILE, (8, 8))
        except (OSError, ValueError):
            pass
print('tampered')
"""


@pytest.mark.parametrize("attack", [STOP_ALL, LOWER_LIMITS], ids=["sigstop", "prlimit"])
def test_tampered_parked_processes_never_falsify_a_branch(leftovers, attack):
    """A cell stops (or lowers the limits of) every parked process; sibling branches run true."""
    env = MathEnv(sandbox={"cell_timeout_s": 3.0, "cell_cpu_s": 2.0, "max_snapshots": 4})
    try:
        _fresh_episode(env, "state = 21")
        ck = env.checkpoint()
        # a timeout first: its sweep adopts every spare, so the restore below hands one over
        obs, *_, info = env.step("```python\nwhile True:\n    pass\n```")
        assert info["status"] == "timeout", obs
        obs, *_ = env.step(f"```python\n{attack}\n```")
        assert "tampered" in obs, obs
        for _ in range(2):
            env.restore(ck)
            obs, *_, info = env.step(
                "```python\nfs = [open('/dev/null') for _ in range(20)]\nprint(len(fs), state * 2)\n```"
            )
            assert info["status"] == "ok" and obs.startswith("```output\n20 42"), obs
        _fresh_episode(env, "y = 3")  # a new episode, from the (also tampered) pristine zygote
        obs, *_, info = env.step("```python\nprint(y + 1)\n```")
        assert info["status"] == "ok" and "4" in obs, obs
    finally:
        uid = env.sandbox.isolation.get("uid")
        env.close()
    assert leftovers(uid) == []


def test_a_stopped_snapshot_and_spare_are_continued_not_replayed():
    """Stopped parked processes (a SIGSTOP acted on or still pending) are continued on restore.

    The host cannot tell a stop still in flight from a sleeping process by reading /proc, so
    the restore continues the parked process and its spare before handing over (SIGCONT also
    discards a pending stop); the snapshot itself is restored, with no replay.
    """
    import signal

    from trace_gym.envs.math.sandbox import Sandbox, SandboxConfig

    sb = Sandbox(SandboxConfig(cell_timeout_s=3.0, max_snapshots=4))
    try:
        sb.fresh()
        sb.run("state = 21")
        handle = sb.snapshot()
        assert handle is not None
        parked = sb._snaps[handle.sid]  # noqa: SLF001
        spare = sb._spares.get(handle.sid)  # noqa: SLF001
        assert spare is not None and spare.ready(time.monotonic() + 5)
        for restore in range(2):
            for proc in (parked, spare) if restore == 0 else (parked,):
                os.kill(proc.pid, signal.SIGSTOP)  # the host's pid: the test runs as the host
            assert sb.restore_snapshot(handle), "a stopped snapshot was dropped, not continued"
            r = sb.run("print(state * 2)")
            assert (r.status, r.output) == ("ok", "42\n"), r
    finally:
        sb.close()
