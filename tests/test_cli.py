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


# ---------------------------------------------------------------------- one parser class
def _refusing_command(argv: list[str]) -> int:
    ap = cli.Parser(prog="trace-gym demo-cmd")
    ap.add_argument("--n", type=int, required=True)
    sub = ap.add_subparsers(dest="what")
    sub.add_parser("go").add_argument("--k", type=int)
    ap.parse_args(argv)
    return 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n", "x"], "argument --n: invalid int value: 'x'"),
        (["--n", "1", "--bogus"], "unrecognized arguments: --bogus"),
        (["--n", "1", "go", "--k", "y"], "argument --k: invalid int value: 'y'"),
    ],
)
def test_a_usage_error_is_one_line_on_stderr_and_exit_2(argv, message, capsys):
    assert cli.run_command("trace-gym demo-cmd", _refusing_command, argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().startswith(f"trace-gym demo-cmd: error: {message} (see ")
    assert captured.err.count("\n") == 1  # one line, no usage block, no traceback


def test_the_parser_raises_usage_error_under_run_command_and_exits_2_alone(capsys):
    with pytest.raises(cli.UsageError, match="unrecognized arguments"):
        with cli._in_command():
            _refusing_command(["--n", "1", "--bogus"])
    with pytest.raises(SystemExit) as e:  # `python -m module`: argparse's own usage, exit 2
        _refusing_command(["--n", "1", "--bogus"])
    assert e.value.code == 2
    assert "usage: trace-gym demo-cmd" in capsys.readouterr().err
    assert cli.UsageError is importlib.import_module("trace_gym.errors").UsageError


def test_argparse_itself_is_left_alone():
    import argparse

    assert argparse.ArgumentParser.error is not cli.Parser.error
    with cli._in_command(), pytest.raises(SystemExit):  # a third-party parser keeps its exit
        argparse.ArgumentParser(prog="other").parse_args(["--nope"])


# ---------------------------------------------------------------------- the help tables
def _help(argv, capsys) -> list[str]:
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    return [line for line in out if line.startswith("  ")]


def test_both_help_tables_share_one_aligned_column(capsys):
    columns = set()
    for argv, table in ((["--help"], cli.COMMANDS), (["bench", "--help"], cli.BENCHMARKS)):
        rows = _help(argv, capsys)
        assert len(rows) == len(table)
        for row, (name, (_, help_)) in zip(rows, table.items(), strict=True):
            assert row.startswith(f"  {name} ") and row.endswith(help_)
            columns.add(len(row) - len(help_))
    assert len(columns) == 1, columns  # every help text starts in the same column
    assert columns.pop() >= 2 + max(map(len, [*cli.COMMANDS, *cli.BENCHMARKS])) + 2
