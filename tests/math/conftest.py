"""Shared helpers for the math env tests: small sandbox configs and a leftover-process check."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from trace_gym.envs.math.env import MathEnv
from trace_gym.envs.math.sandbox import Sandbox

from trace_gym.realdata import missing, path_of

FAST_SANDBOX = {"cell_timeout_s": 2.0, "cell_cpu_s": 1.5, "memory_mb": 768, "max_snapshots": 8}
DATA = path_of("math")


def uid_processes(uid: int | None) -> list[int]:
    """Live (non-zombie) processes running as `uid`, polled for up to 2 s to let exits finish."""
    if uid is None:
        return []
    deadline = time.monotonic() + 2.0
    while True:
        found = []
        for entry in os.scandir("/proc"):
            try:
                if entry.name.isdigit() and os.stat(entry.path).st_uid == uid:
                    state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state not in ("Z", "X"):
                        found.append(int(entry.name))
            except (OSError, IndexError):
                pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def sandbox_processes(sb: Sandbox) -> list[int]:
    """Every live process that still runs as the sandbox's uid."""
    return uid_processes(sb.isolation.get("uid"))


def close_and_check(env: MathEnv) -> None:
    """Close `env` and assert that none of its sandbox processes survive."""
    sb = env.sandbox
    boot = sb._boot.pid if sb._boot is not None else None  # noqa: SLF001 - test introspection
    cgroup = sb._cgroup  # noqa: SLF001
    env.close()
    assert sandbox_processes(sb) == []
    if boot is not None:
        assert (
            not Path(f"/proc/{boot}").exists()
            or "Z" in Path(f"/proc/{boot}/stat").read_text().split()[2]
        )
    if cgroup is not None:
        assert not Path(cgroup).exists()


@pytest.fixture(scope="module")
def math_env():
    """One env (and sandbox) per test module; every test resets it."""
    env = MathEnv(sandbox=dict(FAST_SANDBOX))
    yield env
    close_and_check(env)


@pytest.fixture
def fast_sandbox() -> dict:
    return dict(FAST_SANDBOX)


@pytest.fixture(scope="session")
def closer():
    return close_and_check


@pytest.fixture(scope="session")
def leftovers():
    return uid_processes


@pytest.fixture
def math_data_dir() -> Path:
    if not DATA.is_dir():
        pytest.skip(missing("math"))
    return DATA
