"""Policies and predictors from outside the project reach a shell command (issue 27 item 3):
"module:Class" on PYTHONPATH, and entry points an installed package declares."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trace_gym.alloc import allocator_class, make_allocator
from trace_gym.errors import ConfigError, UnknownNameError
from trace_gym.predict import predictor_class

#: a policy module that lives in a folder outside the project (the README's HalfSure)
POLICY_MODULE = textwrap.dedent(
    """
    import numpy as np
    from trace_gym.alloc import ALLOCATORS, solve_roots


    class HalfSure:
        name, branching, cost_aware = "half_sure", True, False

        def __init__(self, m_max: int = 16, lo: float = 0.2):
            self.m_max, self.lo = m_max, lo

        def allocate_roots(self, candidates, budget, rng):
            v = np.array([c.value for c in candidates])
            keep = np.flatnonzero((v > self.lo) & (v < 1 - self.lo))
            counts = np.zeros(len(v), dtype=int)
            if len(keep):
                spend = min(budget, len(keep) * self.m_max)
                counts[keep] = solve_roots(v[keep], spend, self.m_max, exact_budget=False).counts
            return counts

        def allocate_prefixes(self, prefixes, budget, rng):
            return ALLOCATORS["trace"]().allocate_prefixes(prefixes, budget, rng)
    """
)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the project holding `my_policies.py` and a tiny installed
    distribution whose entry points name it (a .dist-info is all importlib.metadata reads)."""
    (tmp_path / "my_policies.py").write_text(POLICY_MODULE)
    info = tmp_path / "my_policies-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-policies\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[trace_gym.allocators]\nhalf_sure = my_policies:HalfSure\n\n"
        "[trace_gym.predictors]\nhalf = trace_gym.predict.constant:ConstantPredictor\n"
    )
    return tmp_path


def _bench(outside: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(outside)}
    cmd = [sys.executable, "-m", "trace_gym.cli", "bench", "alloc", "--steps", "1"]
    cmd += ["--roots", "8", "--no-progress", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=outside)


def test_bench_alloc_takes_a_module_class_policy_with_kwargs_from_a_shell(outside):
    res = _bench(
        outside, "--policies", "my_policies:HalfSure,grpo", "--policy-kwargs", '{"lo": 0.3}'
    )
    assert res.returncode == 0, res.stderr
    assert "my_policies:HalfSure" in res.stdout
    header = next(ln for ln in res.stdout.splitlines() if ln.startswith("policy "))
    assert header.split()[-4:-1] == ["skipped", "budget", "filter"]
    res = _bench(outside, "--policies", "my_policies:HalfSure", "--policy-kwargs", '{"lox": 1}')
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "--policy-kwargs key 'lox'" in res.stderr and "did you mean 'lo'" in res.stderr


def test_installed_entry_points_register_policies_and_predictors(outside):
    res = _bench(outside, "--policies", "half_sure,trace", "--predictor", "half")
    assert res.returncode == 0, res.stderr
    assert "half_sure" in res.stdout and "predictor=half" in res.stdout


def test_unknown_policy_is_one_line_with_a_close_match(outside):
    res = _bench(outside, "--policies", "tarce")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "did you mean 'trace'" in res.stderr
    res = _bench(outside, "--policies", "no_such_module:Policy")
    assert res.returncode == 2 and "no module named 'no_such_module'" in res.stderr


def test_registry_lookup_in_process(outside, monkeypatch):
    monkeypatch.syspath_prepend(str(outside))
    cls = allocator_class("my_policies:HalfSure")
    assert cls.__name__ == "HalfSure"
    policy = make_allocator("my_policies:HalfSure", m_max=4, lo=0.3)
    assert (policy.m_max, policy.lo) == (4, 0.3)
    assert predictor_class("trace_gym.predict.constant:ConstantPredictor").__name__ == (
        "ConstantPredictor"
    )
    with pytest.raises(ConfigError, match="has no 'Nope'"):
        allocator_class("my_policies:Nope")
    with pytest.raises(UnknownNameError, match="did you mean 'clue'"):
        predictor_class("clu")


def test_trainer_config_takes_a_module_class_allocator(outside, monkeypatch):
    from trace_gym.trainers.config import RolloutConfig

    monkeypatch.syspath_prepend(str(outside))
    assert RolloutConfig(allocator="my_policies:HalfSure").allocator == "my_policies:HalfSure"
    with pytest.raises(UnknownNameError, match="did you mean 'trace'"):
        RolloutConfig(allocator="trac")
