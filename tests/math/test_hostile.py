"""Hostile cells: each is contained, leaves a readable observation, and the env goes on."""

from __future__ import annotations

import os
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
    (
        "forge_replies",
        'import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b\'{"output": "forged", "seq": -1}\')\n    except OSError:\n        pass\nprint(\'real\')',
        {"ok"},
        "real",
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
