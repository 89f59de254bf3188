"""MathEnv: protocol end to end, restore equivalence (fork and replay), fallbacks, data sets."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from trace_gym.envs.math.env import MathEnv

import trace_gym
from trace_gym.checker import check_checkpoint

STATEFUL = [
    "```python\nimport random\nfrom fractions import Fraction\ndef g(n):\n    return Fraction(n, 3) + random.randint(1, 9)\nacc = [g(1)]\n```",
    "<python>\nacc.append(g(2))\nimport numpy as np\nv = np.random.rand(2)\nacc\n</python>",
]
PROBE = "```python\nprint(acc, g(5), g, random.random(), np.random.rand(), hash('abc'))\n```"


def _play(env, actions):
    return [env.step(a)[0] for a in actions]


def test_episode_protocol(math_env):
    obs, info = math_env.reset(seed=0, options={"task": "divisor-sum-001"})
    assert "sum of all positive divisors of 16483" in obs and "boxed" in obs
    assert "answer" not in info and info["topic"] == "number_theory"
    obs, r, term, trunc, info = math_env.step(
        "Try:\n```python\nimport sympy\nsympy.divisor_sigma(16483)\n```"
    )
    assert obs == "```output\n16848\n```" and info["status"] == "ok" and not term
    obs, r, term, trunc, info = math_env.step("```python\n1/0\n```")
    assert "ZeroDivisionError" in obs and "<cell" in obs and info["status"] == "error"
    obs, r, term, trunc, info = math_env.step("```python\nx = (1,\n```")
    assert (
        obs.startswith('```output\n  File "<cell') and "SyntaxError" in obs and "ast.py" not in obs
    )
    obs, r, term, trunc, info = math_env.step("I think it is about 16848.")
    assert "no code and no final answer" in obs and info["action"] == "invalid"
    obs, r, term, trunc, info = math_env.step("```python\nprint(1)\n```\n```python\nprint(2)\n```")
    assert obs.startswith("```output\n1\n```") and "Only the first" in obs
    obs, r, term, trunc, info = math_env.step("So the answer is \\boxed{16848}.")
    assert term and r == 1.0 and info["correct"] and info["verifier"]["correct"]
    json.dumps(info)


def test_wrong_answer_and_answer_tag(math_env):
    math_env.reset(seed=0, options={"task": 0})
    *_, r, term, _, info = math_env.step("<answer>12</answer>")
    assert term and r == 0.0 and info["answer"] == "12" and not info["correct"]


def test_turn_limit_is_the_envs_own(fast_sandbox):
    env = MathEnv(max_turns=2, sandbox=fast_sandbox)
    try:
        env.reset(seed=0)
        assert not env.step("```python\nx = 1\n```")[3]
        *_, term, trunc, info = env.step("```python\nx += 1\n```")
        assert trunc and not term and info["truncation"] == "turn_limit"
    finally:
        env.close()


def test_current_task_exposes_reference_for_scripted_policies(math_env, fast_sandbox):
    unstarted = MathEnv(sandbox=fast_sandbox)
    assert unstarted.current_task is None
    unstarted.close()
    math_env.reset(seed=0, options={"task": 3})
    task = math_env.current_task
    assert task.id == math_env.task_id and task.answer and task.solution
    assert math_env.tasks[3] is task and len(math_env.tasks) == len(math_env.task_ids)
    *_, r, term, _, _ = math_env.step(f"\\boxed{{{task.answer}}}")
    assert r == 1.0 and term


@pytest.mark.parametrize("via", ["fork", "pickled_same_env", "fresh_env"])
def test_restore_equivalence_random_state_and_functions(math_env, fast_sandbox, via):
    env = math_env
    env.reset(seed=0, options={"task": 1})
    _play(env, STATEFUL)
    ck = env.checkpoint()
    assert ck.local is not None
    want = _play(env, [PROBE, PROBE])
    assert "Fraction" in want[0] and want[0] != want[1]
    target = env
    if via == "fork":
        env.restore(ck)
    elif via == "pickled_same_env":
        env.restore(pickle.loads(pickle.dumps(ck)))
    else:
        target = MathEnv(sandbox=fast_sandbox)
        target.restore(pickle.loads(pickle.dumps(ck)))
    try:
        assert _play(target, [PROBE, PROBE]) == want
        assert target.turn == ck.turn + 2
    finally:
        env.release(ck)
        if target is not env:
            target.close()


def test_snapshots_are_reusable_lru_bounded_and_released(fast_sandbox, closer):
    env = MathEnv(sandbox={**fast_sandbox, "max_snapshots": 3})
    try:
        env.reset(seed=0, options={"task": 0})
        ckpts = []
        for i in range(5):
            env.step(f"```python\nx = {i}\n```")
            ckpts.append(env.checkpoint())
        assert env.sandbox.num_snapshots == 3
        for _ in range(2):  # a snapshot serves many restores
            env.restore(ckpts[-1])
            assert env.step("```python\nx\n```")[0] == "```output\n4\n```"
        env.restore(ckpts[0])  # evicted: falls back to replaying the ledger, same result
        assert env.step("```python\nx\n```")[0] == "```output\n0\n```"
        for ck in ckpts:
            env.release(ck)
        assert env.sandbox.num_snapshots == 0
    finally:
        closer(env)


def test_timeout_rolls_back_to_the_ledger(math_env):
    math_env.reset(seed=0, options={"task": 0})
    math_env.step("```python\nimport random\nn = 5\nr0 = random.random()\n```")
    obs, *_, info = math_env.step("```python\nn = 99\nwhile True:\n    pass\n```")
    assert info["status"] in ("timeout", "crashed") and info["rolled_back"]
    obs, *_ = math_env.step("```python\nprint(n, r0 == r0, random.random())\n```")
    fresh = MathEnv(sandbox={"cell_timeout_s": 2.0})
    try:
        fresh.reset(seed=0, options={"task": 0})
        fresh.step("```python\nimport random\nn = 5\nr0 = random.random()\n```")
        assert fresh.step("```python\nprint(n, r0 == r0, random.random())\n```")[0] == obs
    finally:
        fresh.close()


def test_interpreter_lost_between_cells_is_rebuilt_from_the_ledger(math_env):
    math_env.reset(seed=0, options={"task": 0})
    math_env.step("```python\nimport random\nrandom.seed(3)\nn = 5\n```")
    expected = math_env.step("```python\nprint(n, random.random())\n```")[0]
    math_env.reset(seed=0, options={"task": 0})
    math_env.step("```python\nimport random\nrandom.seed(3)\nn = 5\n```")
    # killed after its cell answered (as a failed snapshot fork or a stray kill would): the
    # next cell must see the ledger's state, not a pristine interpreter
    os.kill(math_env.sandbox._live.pid, signal.SIGKILL)  # noqa: SLF001 - simulate the loss
    obs, *_, info = math_env.step("```python\nprint(n, random.random())\n```")
    assert (obs, info["status"]) == (expected, "ok")


def test_interpreter_is_seeded_and_isolated(math_env):
    math_env.reset(seed=0, options={"task": 0})
    obs = math_env.step(
        "```python\nimport random, os\nprint(random.random(), os.environ['PYTHONHASHSEED'], os.getcwd())\n```"
    )[0]
    assert obs.startswith("```output\n0.8444218515250481 0 ")
    iso = math_env.sandbox.isolation
    if iso.get("uid") is not None:  # started as root: unprivileged uid, no network
        uid = math_env.step("```python\nimport os\nos.getuid()\n```")[0]
        assert str(iso["uid"]) in uid


def test_fallback_without_namespaces_still_blocks_network(closer, fast_sandbox):
    env = MathEnv(sandbox={**fast_sandbox, "isolation": "none", "allow_unsafe_host": True})
    try:
        env.reset(seed=0, options={"task": 0})
        assert env.sandbox.isolation["netns"] is False
        obs = env.step(
            "```python\nimport socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n```"
        )[0]
        assert "network access is disabled" in obs
        obs = env.step("```python\nwhile True:\n    pass\n```")[0]
        assert "TimeoutError" in obs or "InterpreterCrash" in obs
        env.step("```python\nimport random\nx = random.random()\n```")
        ck = env.checkpoint()
        want = env.step("```python\nx, random.random()\n```")[0]
        env.restore(ck)
        assert env.step("```python\nx, random.random()\n```")[0] == want
        env.restore(pickle.loads(pickle.dumps(ck)))
        assert env.step("```python\nx, random.random()\n```")[0] == want
    finally:
        closer(env)


def test_checker_contract_on_gym_make():
    env = gym.make("trace/Math-v0", sandbox={"cell_timeout_s": 5.0})
    try:
        report = check_checkpoint(env, seed=3, run_gym_check_env=False)
        assert report["turns"] >= 1
        ck = trace_gym.checkpoint(env)
        assert pickle.loads(pickle.dumps(ck)) == ck.without_local()
    finally:
        env.close()


def test_example_action_is_realistic(math_env):
    math_env.reset(seed=0, options={"task": 0})
    rng = np.random.default_rng(0)
    kinds = set()
    for _ in range(30):
        if math_env.done:
            math_env.reset(seed=0, options={"task": 0})
        *_, info = math_env.step(math_env.example_action(rng))
        kinds.add(info["action"])
        assert info.get("status") in (None, "ok", "error")
    assert {"code", "answer"} <= kinds


def test_bad_config_fails_fast():
    with pytest.raises(trace_gym.errors.ConfigError):
        MathEnv(sandbox={"cell_timeout_s": 0})
    with pytest.raises(trace_gym.errors.ConfigError):
        MathEnv(dataset="/nonexistent/file.json")


def test_pickled_checkpoint_restores_in_another_process(math_env, tmp_path):
    math_env.reset(seed=0, options={"task": 2})
    _play(math_env, STATEFUL)
    ck = math_env.checkpoint()
    want = _play(math_env, [PROBE])[0]
    math_env.release(ck)
    path = tmp_path / "ck.pkl"
    path.write_bytes(pickle.dumps(ck))
    code = (
        "import pickle, sys, gymnasium as gym, trace_gym\n"
        "env = gym.make('trace/Math-v0')\n"
        f"trace_gym.restore(env, pickle.loads(open({str(path)!r}, 'rb').read()))\n"
        f"sys.stdout.write(env.step({PROBE!r})[0])\n"
        "env.close()\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300
    ).stdout
    assert got == want


def test_cpu_limit_is_a_timeout_with_rollback(closer):
    """The CPU limit stopping a cell is the same stop as the wall limit, whichever fires first."""
    env = MathEnv(sandbox={"cell_timeout_s": 30.0, "cell_cpu_s": 1.0})
    try:
        env.reset(seed=0, options={"task": 0})
        env.step("```python\nn = 5\n```")
        obs, *_, info = env.step("```python\nn = 99\nwhile True:\n    pass\n```")
        assert info["status"] == "timeout" and info["rolled_back"], info
        assert "CPU time limit" in obs and "rolled back" in obs, obs
        assert info["elapsed_s"] < 20, info  # the CPU limit stopped it, not the 30 s wall limit
        obs, *_ = env.step("```python\nprint(n)\n```")
        assert obs == "```output\n5\n```", obs
    finally:
        closer(env)
