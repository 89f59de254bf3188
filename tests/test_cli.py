"""`trace-gym`'s routing tables: every "module:function" target exists, benchmarks sit in their rooms."""

from __future__ import annotations

import importlib

import pytest

from trace_gym import cli

TARGETS = {
    **{f"command {k}": v[0] for k, v in cli.COMMANDS.items()},
    **{f"bench {k}": v[0] for k, v in cli.BENCHMARKS.items()},
}


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_target_resolves_to_a_function(name):
    module, func = TARGETS[name].split(":")
    assert callable(getattr(importlib.import_module(module), func)), TARGETS[name]


def test_core_benchmarks_live_under_bench_and_env_benchmarks_with_their_env():
    for name, (target, _) in cli.BENCHMARKS.items():
        module = target.split(":")[0]
        core = module.startswith("trace_gym.bench.")
        # an env's benchmarks sit in its own folder, in modules named bench*.py
        parts = module.split(".")
        env = (
            module.startswith("trace_gym.envs.")
            and len(parts) == 4
            and parts[3].startswith("bench")
        )
        trainer = module.startswith("trace_gym.trainers.")  # benchmarks that train (bench learn)
        assert core or env or trainer, f"benchmark {name!r} lives in {module}"


def test_bench_help_lists_every_benchmark(capsys):
    assert cli.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.BENCHMARKS)
    assert cli.main(["bench", "nope"]) == 2
