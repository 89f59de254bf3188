"""`trace-gym bench alloc-speed` runs and reports the figures the issue names (small sizes)."""

from __future__ import annotations

import json
import subprocess
import sys

from trace_gym.bench.alloc_speed import run

KEYS = {"root_fast_ms", "root_reference_ms", "speedup", "prefix_us", "objective_equal"}


def test_run_reports_figures():
    r = run(candidates=64, budget=150, m_max=8, repeats=3, reference_repeats=1, prefix_repeats=5)
    assert KEYS <= set(r)
    assert r["objective_equal"] is True
    assert r["root_fast_ms"] > 0 and r["prefix_us"] > 0 and r["speedup"] > 0


def test_cli_writes_json(tmp_path):
    out = tmp_path / "alloc.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "bench",
            "alloc-speed",
            "--candidates",
            "32",
            "--budget",
            "64",
            "--repeats",
            "3",
            "--reference-repeats",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "speedup" in proc.stdout
    data = json.loads(out.read_text())
    assert KEYS <= set(data) and data["objective_equal"] is True


def test_scale_reports_every_stage_per_size_with_ratios(tmp_path, capsys):
    from trace_gym.bench.alloc_speed import STAGES, main

    out = tmp_path / "scale.json"
    assert main(["--scale", "64,256", "--repeats", "1", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["sizes"] == [64, 256] and len(r["rows"]) == 2
    for row in r["rows"]:
        stages = set(STAGES)
        assert stages <= set(row) and all(row[k] > 0 for k in stages)
        # the goal's step is the runner's: the columns built from its tree walk, then the
        # allocator API on them; the records path (the runner before) beside it
        base = row["root_s"] + row["split_s"]
        assert row["step_s"] == base + row["columns_build_s"] + row["prefix_api_s"]
        assert row["runner_step_s"] == row["step_s"] + row["walk_s"]
        assert row["records_step_s"] == base + row["records_build_s"] + row["prefix_records_s"]
        assert row["api_step_s"] == base + row["prefix_records_s"]
        assert row["solver_step_s"] == base + row["prefix_batch_s"]
        assert row["same_counts"] is True
        assert set(row["ratio_to_smallest"]) == stages
    assert r["rows"][0]["ratio_to_smallest"]["root_s"] == 1.0
    assert set(r["goals_met"]) == {"step<=3x_root@256", "step<=300ms@256"}
    assert "allocation step by size" in capsys.readouterr().out


def test_scale_refuses_a_bad_size_list_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "bench", "alloc-speed", "--scale", "4096,256"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--scale wants increasing" in proc.stderr


def test_mixture_times_both_solvers_and_checks_exactness(tmp_path, capsys):
    from trace_gym.bench.alloc_speed import main

    out = tmp_path / "mixture.json"
    args = ["--mixture", "64,256", "--costs", "0.5,2", "--repeats", "1", "--brute", "20"]
    assert main([*args, "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["sizes"] == [64, 256] and r["costs"] == [0.5, 2.0]
    for row in r["rows"]:
        assert row["flat_s"] > 0 and row["mixture_s"] > 0
        assert row["ratio"] == row["mixture_s"] / row["flat_s"]
        assert row["objective_equal"] is True  # small enough for the reference DP
        assert row["spent_units"] <= row["budget_units"]
    assert r["brute_force"] == {"instances": 20, "equal": 20}
    assert r["goals_met"]["exact_where_checked"] is True
    assert "mixture root solver" in capsys.readouterr().out


def test_mixture_refuses_bad_costs_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "bench", "alloc-speed", "--mixture", "64"]
        + ["--costs", "1,-2"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--costs wants positive" in proc.stderr
