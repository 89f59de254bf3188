"""Seeded fuzzing of every env through its public `step()`: no exception, the env stays
usable, no process is left behind. Short runs in the fast set, 10,000 actions in `slow`.

The actions come from the shipped fuzzer (`trace_gym.bench.fuzz.fuzz_action`), so
`trace-gym bench fuzz` and these tests send the same kinds of hostile text.
"""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from trace_gym.bench.fuzz import fuzz_action, fuzz_env

import trace_gym
from trace_gym.testing import CountdownEnv

#: env id -> (fast-set actions, keyword arguments of gym.make, action length cap or None)
ENVS = {
    "trace/Sim-v0": (600, {}, None),
    "trace/BFCL-v0": (400, {}, None),
    # a small sandbox: a fuzzed cell that loops is cut at 2 s. The cap keeps the run short:
    # Math's answer parser is quadratic in a flood of unclosed \boxed{ (8.5k characters
    # take 1.8 s, 68k take 89 s); `trace-gym bench fuzz` reports it at the default cap
    "trace/Math-v0": (
        25,
        {"sandbox": {"cell_timeout_s": 2.0, "cell_cpu_s": 1.5, "memory_mb": 768}},
        4_000,
    ),
}


def _descendants() -> set[int]:
    """Live (non-zombie) processes below this one, from /proc."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] not in ("Z", "X"):
                parent[int(entry.name)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def _usable(env: gym.Env, rng: np.random.Generator) -> None:
    """After the fuzzing: a fresh episode steps, checkpoints and restores exactly."""
    env.reset(seed=7)
    base = env.unwrapped
    ck = trace_gym.checkpoint(env)
    action = base.example_action(rng)
    first = env.step(action)[:4]
    trace_gym.restore(env, ck)
    assert env.step(action)[:4] == first


def _fuzz(env_id: str, actions: int, seed: int) -> None:
    _, kwargs, cap = ENVS[env_id]
    rng = np.random.default_rng(seed)
    # a first env starts what lives for the whole process (imports, helper processes);
    # process-wide pools started later are stopped by _close_shared before the count
    warm = gym.make(env_id, **kwargs)
    warm.reset(seed=0)
    warm.step(warm.unwrapped.example_action(rng))
    warm.close()
    before = _descendants()
    env = gym.make(env_id, **kwargs)
    if cap is not None:
        env.unwrapped.max_action_chars = cap
    env.reset(seed=seed)
    rejected = 0
    for _ in range(actions):
        *_, term, trunc, info = env.step(fuzz_action(rng, env.unwrapped))
        assert isinstance(info, dict)
        rejected += info.get("error") == "action_too_long"
        if term or trunc:
            env.reset(seed=int(rng.integers(2**31)))
    _usable(env, rng)
    env.close()
    _close_shared(env_id)
    assert rejected > 0 or actions < 100  # the over-long kind was sent and answered
    leaked = _descendants() - before
    assert not leaked, (
        f"{env_id} left processes behind: {[_cmdline(pid) for pid in sorted(leaked)]}"
    )


def _close_shared(env_id: str) -> None:
    """Stop what is process-wide by design, so only what the env itself left is counted.

    Math's verifier pool is shared by every MathEnv and stopped at exit; a worker killed
    for overrunning its deadline (a fuzzed answer) is replaced by a new process.
    """
    if env_id == "trace/Math-v0":
        from trace_gym.envs.math.verify import default_pool

        default_pool().close()


def _cmdline(pid: int) -> str:
    try:
        return (
            f"{pid}: "
            + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        )
    except OSError:
        return f"{pid}: (gone)"


@pytest.mark.parametrize("env_id", list(ENVS))
def test_short_fuzz_raises_nothing_and_leaves_the_env_usable(env_id):
    _fuzz(env_id, ENVS[env_id][0], seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", list(ENVS))
def test_ten_thousand_fuzzed_actions(env_id):
    _fuzz(env_id, 10_000, seed=2)


def test_the_bench_counts_exceptions_instead_of_stopping():
    class Fragile(CountdownEnv):
        def _step(self, action):
            if "[" in action:
                raise RuntimeError("parser crashed")
            return super()._step(action)

    report = fuzz_env("trace/Countdown-v0", 300, seed=3, make=lambda: Fragile())
    assert report.exceptions > 0 and report.examples[0][1] == "RuntimeError: parser crashed"
    assert report.actions == 300 and report.limit_s == 0.0 and report.max_s >= 0.0
