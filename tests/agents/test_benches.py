"""`trace-gym bench replay-cost` and `bench generate` on HF (the vLLM halves run in tests/vllm)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from trace_gym.bench.replay_cost import table_cost

from trace_gym.budget import Budget
from trace_gym.errors import ConfigError

pytest.importorskip("torch")


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_replay_cost_cli_on_hf_writes_the_table(countdown_model_dir, tmp_path):
    out = tmp_path / "rc.json"
    r = _cli(
        "replay-cost",
        "--engines",
        "hf",
        "--envs",
        "trace/Sim-v0",
        "--tasks",
        "2",
        "--max-turns",
        "3",
        "--max-new-tokens",
        "8",
        "--model",
        str(countdown_model_dir),
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    table = res["replay_cost_by_depth"]["trace/Sim-v0"]["hf"]
    assert table, "no replay was measured"
    for depth, row in table.items():
        assert int(depth) >= 1 and row["replays"] >= 1
        assert row["prefill_computed"] == row["prefill"]  # HF has no cross-call cache
        assert row["prefill"] > 0 and row["decode"] >= 0
    assert res["prefill_saved_share"]["trace/Sim-v0"]["hf"] == 0.0
    assert "depth" in r.stdout and res["accounted_replay_cost"] == 0.5


@pytest.mark.slow
def test_generate_cli_on_hf_reports_tokens_per_s(countdown_model_dir, tmp_path):
    out = tmp_path / "gen.json"
    r = _cli(
        "generate",
        "--engines",
        "hf",
        "--env",
        "trace/Sim-v0",
        "--prompts",
        "4",
        "--max-new-tokens",
        "8",
        "--model",
        str(countdown_model_dir),
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["tokens_per_s"]) == {"hf", "hf_policy"}
    assert all(v > 0 for v in res["tokens_per_s"].values())
    assert res["detail"]["hf"]["tokens"] <= 4 * 8 and res["detail"]["hf_policy"]["tokens"] <= 4 * 8


def test_a_measured_table_is_a_budget_cost_function():
    table = {"1": {"decode": 0.8, "prefill": 0.9}, "2": {"decode": 0.4}}
    b = Budget(roots=4, replays=8, cost=table_cost(table))
    assert b.cost(1, 5) == 0.8 and b.cost(2, 5) == 0.4
    assert b.cost(3, 5) == 0.5  # unmeasured depth: the paper's default
    assert table_cost(table, key="prefill", default=1.0)(2, 5) == 1.0
    with pytest.raises(ConfigError):
        table_cost({"1": {"decode": -0.1}})
