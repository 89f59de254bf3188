"""scripts/gpu_check.sh's --tiny CPU smoke path: one full TRACE training step, JSON out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]
#: the script picks .venv/bin/python by default; run it with the interpreter running the tests
ENV = {**os.environ, "PYTHON": sys.executable}


@pytest.mark.slow
def test_gpu_check_tiny_cpu_runs_one_full_training_step():
    r = subprocess.run(
        [
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--tiny",
            "--device",
            "cpu",
            "--modes",
            "lora",
            "--predictors",
            "empirical",
            "--roots",
            "4",
            "--new-tokens",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**ENV, "GPU_CHECK": "step"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1
    row = rows[0]
    assert row["mode"] == "lora" and row["predictor"] == "empirical"
    assert row["roots"] == 4 and row["generated_tokens"] > 0 and row["failed_branches"] == 0
    assert row["gen_tokens_per_s"] > 0 and row["train_tokens_per_s"] > 0 and row["step_s"] > 0
    assert row["predictor_update"]["n"] > 0  # the predictor was updated on the step's trees
    assert row["policy_version"] == 2  # synced at start and after the optimiser step


def test_gpu_check_without_cuda_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert r.returncode == 3 and "no CUDA device" in r.stdout


@pytest.mark.slow
def test_gpu_check_fsdp_tiny_cpu_runs_both_world_sizes_and_the_memory_formula():
    r = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--tiny", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**ENV, "GPU_CHECK": "fsdp"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    bench = [row for row in rows if row["check"] == "fsdp_bench"]
    assert len(bench) == 1 and set(bench[0]["world_sizes"]) == {"1", "2"}
    two = bench[0]["world_sizes"]["2"]
    assert len(two["peak_mem_mb"]) == 2 and two["step_s"] > 0 and "max_abs_weight_diff" in two
    formula = [row for row in rows if row["check"] == "memory_formula"]
    assert sorted(row["rank"] for row in formula) == [0, 1]
    assert all(row["estimate_mb"] > 0 and row["measured_mb"] > 0 for row in formula)
