"""`trace-gym bench alloc`: equal accounted cost, shared candidate pools, outputs, generic envs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from trace_gym.bench.alloc import BenchConfig, main, parse_shapes, run_bench
from trace_gym.bench.report import mean_ci, spearman
from trace_gym.errors import ConfigError


@pytest.fixture(scope="module")
def small():
    cfg = BenchConfig(
        preset="math",
        steps=2,
        roots=32,
        replays=2,
        policies=("grpo", "pcl", "treepo", "trace", "oracle"),
        progress=False,
    )
    return run_bench(cfg)


def test_equal_accounted_cost_and_shared_pools(small):
    cfg = small.config
    assert cfg.accounted_budget == 64 and cfg.flat_roots == 64 and cfg.candidates_per_step == 32
    by = {}
    for r in small.records:
        by.setdefault(r.step, {})[r.policy] = r
        if r.policy in ("grpo", "pcl"):  # flat: the whole budget as roots
            assert r.roots == 64 and r.replays == 0 and r.cost == 64
        else:  # tree: M roots + N*M replays at half a trajectory each
            assert r.roots == 32 and r.replays + r.replays_unspent == 64
            assert r.cost == 32 + 0.5 * r.replays
        assert r.candidates == 32
        assert set(r.prompt_ids) <= set(by[r.step]["grpo"].prompt_ids) | set(r.prompt_ids)
    # every policy chose from the same candidate pool: PCL and GRPO see the same 32
    for step in by.values():
        assert len(set().union(*(set(r.prompt_ids) for r in step.values()))) <= 32


def test_summary_shape(small):
    s = small.summary
    for name in ("grpo", "pcl", "treepo", "trace", "oracle"):
        row = s["policies"][name]
        for k in (
            "effective_ratio",
            "mixed_groups",
            "contrastive_pairs",
            "cost",
            "measured_turns",
            "distinct_prompts",
        ):
            assert isinstance(row[k], float) and not math.isnan(row[k])
        assert len(row["effective_ratio_by_step"]) == 2
    assert s["oracle_effective_ratio"] == s["policies"]["oracle"]["effective_ratio"]
    assert s["policies"]["oracle"]["oracle_gap"] == 1.0
    assert (
        s["policies"]["trace"]["replays_by_depth"] and not s["policies"]["grpo"]["replays_by_depth"]
    )
    assert {g["goal"][:5] for g in s["goals"]}


def test_cli_writes_json_csv_and_plots(tmp_path):
    out = tmp_path / "out"
    argv = [
        "--preset", "hotpotqa", "--steps", "1", "--roots", "16", "--policies", "grpo,trace,oracle",
        "--json", str(tmp_path / "s.json"), "--out", str(out), "--no-progress",
        "--shapes", "16x2,8x6", "--shape-policies", "grpo,trace",
    ]  # fmt: skip
    assert main(argv) == 0
    d = json.loads((tmp_path / "s.json").read_text())
    assert set(d["policies"]) == {"grpo", "trace", "oracle"} and "oracle_effective_ratio" in d
    shapes = d["budget_shapes"]
    assert set(shapes) == {"16x2", "8x6"}
    assert shapes["16x2"]["accounted_budget"] == shapes["8x6"]["accounted_budget"] == 32
    # the 16x2 shape is the main run: its rows are reused, not rerun
    assert (
        shapes["16x2"]["policies"]["trace"]["effective_ratio"]
        == d["policies"]["trace"]["effective_ratio"]
    )
    for f in (
        "summary.csv",
        "steps.csv",
        "summary.json",
        "effective_ratio.png",
        "replays_by_depth.png",
    ):
        assert (out / f).stat().st_size > 0


def test_cli_subprocess_and_errors():
    cmd = [sys.executable, "-m", "trace_gym.cli", "bench", "alloc", "--steps", "1", "--roots", "8",
           "--policies", "grpo,trace", "--no-progress"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "trace" in res.stdout and "goals" in res.stdout
    assert main(["--policies", "nope", "--steps", "1", "--roots", "8", "--no-progress"]) == 2


def test_generic_env_path_with_scripted_policy():
    cfg = BenchConfig(env_id="trace/Countdown-v0", policy="scripted", steps=1, roots=8, progress=False,
                      policies=("grpo", "trace", "oracle"))  # fmt: skip
    res = run_bench(cfg)
    assert set(res.summary["policies"]) == {"grpo", "trace"}  # no exact values: oracle dropped
    assert res.summary["oracle_effective_ratio"] is None
    with pytest.raises(ConfigError, match="Nope"):
        run_bench(
            BenchConfig(env_id="trace/Nope-v0", policy="scripted", steps=1, roots=8, progress=False)
        )


def test_helpers():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(
        np.corrcoef([0.5, 0.5, 2, 3], [0, 1, 2, 3])[0, 1]
    )
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert parse_shapes("1024x2,512x6") == [(1024, 2.0), (512, 6.0)]
    with pytest.raises(ConfigError):
        parse_shapes("1024by2")
    with pytest.raises(ConfigError):
        BenchConfig(preset="atari")
