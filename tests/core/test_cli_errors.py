"""Every `trace-gym` command answers a bad argument with one line on stderr and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trace_gym import cli
from trace_gym.errors import ConfigError

EVERY = [[c] for c in cli.COMMANDS] + [["bench", b] for b in cli.BENCHMARKS]


def _one_line_error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command", EVERY, ids=" ".join)
def test_every_command_refuses_an_unknown_flag_in_one_line(capsys, command):
    err = _one_line_error(capsys, [*command, "--no-such-flag"])
    assert "--no-such-flag" in err or "required" in err


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--roots", "-1"], "--roots must be >= 2"),
        (["--tasks", "0"], "--tasks must be >= 1, got 0"),
        (["--steps", "-2"], "--steps must be >= 0"),
        (["--replays", "nan"], "--replays must be a finite number"),
        (["--m-max", "0"], "--m-max must be >= 2"),
        (["--allocator", "nope"], "unknown allocator 'nope'"),
        (["--predictor", "nope"], "unknown predictor 'nope'"),
        (["--env-kwargs", "{bad"], "--env-kwargs must be a JSON object"),
        (["--roots", "many"], "argument --roots: invalid int value: 'many'"),
    ],
)
def test_rollout_bad_values_are_one_line(capsys, tmp_path, args, match):
    argv = [
        "rollout",
        "--env",
        "trace/Sim-v0",
        "--policy",
        "sim",
        "--out",
        str(tmp_path / "t.jsonl"),
        *args,
    ]
    assert match in _one_line_error(capsys, argv)


def test_rollout_unknown_env_and_unwritable_out(capsys, tmp_path):
    out = str(tmp_path / "t.jsonl")
    assert "unknown env id 'trace/Nope-v0'" in _one_line_error(
        capsys, ["rollout", "--env", "trace/Nope-v0", "--out", out]
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    err = _one_line_error(
        capsys, ["rollout", "--env", "trace/Sim-v0", "--out", str(blocker / "t.jsonl")]
    )
    assert f"cannot write --out {blocker / 't.jsonl'}" in err


def test_bench_fuzz_bad_values(capsys):
    assert "unknown env id 'trace/Nope-v0'" in _one_line_error(
        capsys, ["bench", "fuzz", "--envs", "trace/Nope-v0"]
    )
    assert "--actions must be >= 1" in _one_line_error(capsys, ["bench", "fuzz", "--actions", "0"])


def test_a_bug_keeps_its_traceback():
    def broken(argv):
        raise RuntimeError("a bug, not a user error")

    with pytest.raises(RuntimeError):
        cli.run_command("trace-gym x", broken, [])


def test_errors_are_one_line_even_when_the_message_has_several(capsys):
    def fails(argv):
        raise ConfigError("first line\nsecond line")

    assert cli.run_command("trace-gym x", fails, []) == 2
    assert capsys.readouterr().err == "trace-gym x: error: first line second line\n"


def test_the_installed_entry_point_prints_no_traceback(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "rollout",
            "--env",
            "trace/Sim-v0",
            "--tasks",
            "0",
            "--out",
            str(tmp_path / "t"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        out.returncode == 2
        and out.stderr == "trace-gym rollout: error: --tasks must be >= 1, got 0\n"
    )


def test_eval_with_an_unknown_env_is_one_line(capsys):
    assert "Environment `Nope` doesn't exist" in _one_line_error(
        capsys, ["eval", "--env", "trace/Nope-v0", "--policy", "sim"]
    )


@pytest.mark.parametrize(
    ("args", "match"),
    [  # each names the flag that was wrong (one line, rc 2), with a close match for a name
        (["--roots", "-5"], "--roots must be >= 2, got -5"),
        (["--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["--pool-factor", "0"], "--pool-factor must be > 0, got 0"),
        (["--env-kwargs", "{dataset: x}"], "--env-kwargs must be a JSON object"),
        (["--predictor-kwargs", "[1]"], "--predictor-kwargs must be a JSON object"),
        (["--preset", "mat"], "(did you mean 'math'?)"),
        (["--policies", "tarce"], "unknown allocator 'tarce' (did you mean 'trace'?)"),
        (["--predictor", "clu"], "unknown predictor 'clu' (did you mean 'clue'?)"),
    ],
)
def test_bench_alloc_bad_values_name_their_flag(capsys, args, match):
    assert match in _one_line_error(
        capsys, ["bench", "alloc", "--steps", "1", "--no-progress", *args]
    )


def test_unknown_env_id_gets_a_close_match(capsys, tmp_path):
    err = _one_line_error(
        capsys, ["rollout", "--env", "trace/Mth-v0", "--out", str(tmp_path / "t.jsonl")]
    )
    assert "(did you mean 'trace/Math-v0'" in err


@pytest.mark.parametrize(
    ("argv", "match"),
    [(["trian"], "(did you mean 'train'?)"), (["bench", "aloc"], "(did you mean 'alloc'?)")],
)
def test_unknown_command_and_benchmark_get_a_close_match(capsys, argv, match):
    assert match in _one_line_error(capsys, argv)
