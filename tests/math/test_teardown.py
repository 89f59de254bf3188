"""Issue 26 item 6: the env reaps every process it starts (nothing is left to the host's init).

In a container whose pid 1 is the training script, every orphan the env leaves becomes that
script's zombie. The test process below makes itself a child subreaper (as such a pid 1 is),
so every orphan lands on it; after episodes with sandbox restarts, cell timeouts and
verifier timeouts it must have no zombie children.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, json, os, sys
from pathlib import Path
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
from trace_gym.envs.math.env import MathEnv
from trace_gym.envs.math.verify import VerifierPool

def zombies():
    me, out = os.getpid(), []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                rest = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if rest[0] == "Z" and int(rest[1]) == me:
                out.append(entry.name + " " + Path(entry.path, "comm").read_text().strip())
    return out

episodes, period = int(sys.argv[1]), int(sys.argv[2])  # one event of each kind per period
env = MathEnv(sandbox={"cell_timeout_s": 1.0, "cell_cpu_s": 1.0, "memory_mb": 512, "max_snapshots": 4})
env._pool = VerifierPool(workers=2, timeout_s=0.001)  # every non-exact answer overruns: killed
events = {"restarts": 0, "cell_timeouts": 0, "verifier_timeouts": 0}
for ep in range(episodes):
    env.reset(seed=ep, options={"task": env.task_ids[ep % 5]})
    env.step("```python\nx = 1\nprint(x)\n```")
    if ep % period == 1:  # a cell that kills the whole sandbox: the next cell restarts it
        env.step("```python\nimport os, signal\nos.kill(-1, signal.SIGKILL)\n```")
        env.step("```python\ny = 2\n```")
        events["restarts"] += 1
    if ep % period == 2:
        obs = env.step("```python\nwhile True:\n    pass\n```")[4]
        events["cell_timeouts"] += obs["status"] == "timeout"
    if ep % period == 3:
        env.sandbox.close()  # a restart from the outside
        events["restarts"] += 1
    if ep % period == 0:
        info = env.step("\\boxed{x + 1}")[4]
        events["verifier_timeouts"] += bool(info["verifier"]["timed_out"])
    else:  # the reference itself: decided by string match, no worker needed
        env.step("\\boxed{%s}" % env.unwrapped.current_task.answer)
for thread in list(getattr(env._pool, "_threads", [])):  # workers being killed in the background
    thread.join(30)
mid = zombies()  # before close: none may pile up while the env runs
env.close()
env._pool.close()
print(json.dumps({"during": mid, "after": zombies(), **events}))
"""


def _run(episodes: int, period: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(episodes), str(period)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_zombies_after_restarts_and_verifier_timeouts():
    res = _run(4, 4)
    assert res["restarts"] == 2 and res["verifier_timeouts"] == 1 and res["cell_timeouts"] == 1
    assert res["during"] == [] and res["after"] == []


@pytest.mark.slow
def test_no_zombies_after_100_episodes():
    res = _run(100, 5)
    assert res["restarts"] == 40 and res["verifier_timeouts"] == 20 and res["cell_timeouts"] == 20
    assert res["during"] == [] and res["after"] == []
