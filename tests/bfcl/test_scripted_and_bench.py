"""The scripted player's bookkeeping and the `trace-gym bench bfcl` smoke run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from trace_gym.envs.bfcl.data import get_entry
from trace_gym.envs.bfcl.scripted import ScriptedBFCL, replay_position

from trace_gym.errors import ConfigError


def test_replay_position_counts_turns_and_calls():
    actions = [
        "[cd(folder='a')]",
        "done",
        '<tool_call>{"name": "ls", "arguments": {}}</tool_call>',
        "[pwd(), ls()]",
    ]
    assert replay_position(actions) == (1, [["ls()"], ["pwd()", "ls()"]])


def test_scripted_positional_ground_truth_becomes_keywords():
    entry = get_entry("multi_turn_base_0")  # turn 2 ground truth is sort('final_report.pdf')
    text = ScriptedBFCL(syntax="hermes").next_action(entry, 2, [], np.random.default_rng(0))
    assert json.loads(text.split("\n")[1]) == {
        "name": "sort",
        "arguments": {"file_name": "final_report.pdf"},
    }


def test_scripted_is_done_after_the_turns_calls_and_replies_in_empty_turns():
    entry = get_entry("multi_turn_miss_param_0")
    empty = next(t for t, c in enumerate(entry.ground_truth) if not c)
    player = ScriptedBFCL()
    rng = np.random.default_rng(0)
    assert "<tool_call>" not in player.next_action(entry, empty, [], rng)
    done = [[c] for c in entry.ground_truth[0]]
    assert "<tool_call>" not in player.next_action(entry, 0, done, rng)


def test_scripted_config_is_validated():
    with pytest.raises(ConfigError):
        ScriptedBFCL(error_rate=1.5)
    with pytest.raises(ConfigError):
        ScriptedBFCL(syntax="xml")


def test_bench_cli_writes_the_json_keys(tmp_path):
    out = tmp_path / "bfcl.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "bench",
            "bfcl",
            "--limit",
            "3",
            "--repeats",
            "2",
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(out.read_text())
    assert {"checkpoint_ms", "restore_ms", "steps_per_s"} <= report.keys()
    assert report["entries"] == 3 and report["ground_truth_success"] == 1.0
    assert report["restore_ms"]["n"] == 3 * 2 * 2 and report["steps_per_s"] > 0


def test_bench_bfcl_parse_smoke(tmp_path):
    out = tmp_path / "parse.json"
    subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "bench", "bfcl-parse", "--sizes", "200,2000"]
        + ["--formats", "python_calls,json_call", "--json", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(out.read_text())
    rows = {(r["format"], r["chars"] // 100): r for r in report["rows"]}
    assert len(report["rows"]) == 4 and report["limits"]["max_calls"] == 256
    assert rows[("python_calls", 19)]["outcome"] == "python:250 calls,0 errors"
    assert rows[("python_calls", 1)]["size_ratio"] == 1.0 and report["summary"]["max_step_ms"] > 0
    bad = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "bench", "bfcl-parse", "--sizes", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
