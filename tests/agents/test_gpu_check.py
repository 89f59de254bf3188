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
#: the GPU limits (290 s in all) are for an H200; a shared 2-core CPU gets more time
ENV = {
    **os.environ,
    "PYTHON": sys.executable,
    "GPU_CHECK_LIMITS": "step=900,fsdp=900,fsdp8b=900,async=900",
}


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


def test_gpu_check_without_cuda_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    out = tmp_path / "gpu.json"
    r = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert r.returncode == 3 and "no CUDA device" in r.stdout
    rep = json.loads(out.read_text())  # the one JSON says so too, and that nothing else ran
    assert rep["rc"] == {"step": 3} and "no CUDA device" in rep["checks"]["step"][0]["skipped"]
    assert rep["timed_out"] == [] and rep["wall_s"] >= 0


def test_gpu_check_refuses_a_bad_time_limit_in_one_line(tmp_path):
    r = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--json", str(tmp_path / "g.json")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**ENV, "GPU_CHECK_LIMITS": "step=fast"},
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "bad GPU_CHECK_LIMITS entry 'step=fast'" in r.stderr


@pytest.mark.slow
def test_gpu_check_async_tiny_cpu_compares_staleness_one_to_zero_in_one_json(tmp_path):
    out = tmp_path / "sub" / "gpu.json"
    args = ["--tiny", "--device", "cpu", "--roots", "4", "--new-tokens", "8"]
    args += ["--modes", "lora", "--predictors", "empirical"]  # step's own: async ignores them
    r = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**ENV, "GPU_CHECK": "step,async"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert rep["rc"] == {"step": 0, "async": 0} and "--json" not in rep["args"]
    assert len(rep["checks"]["step"]) == 1 and rep["checks"]["step"][0]["mode"] == "lora"
    sync, one, ratio = rep["checks"]["async"]
    assert (sync["staleness"], one["staleness"]) == (0, 1) and sync["steps"] == one["steps"] == 4
    assert sync["staleness_mean"] == 0.0 and one["staleness_mean"] > 0  # step 1 is one behind
    assert sync["generated_tokens"] > 0 and one["wait_s_mean"] >= 0
    assert ratio["steps_per_s_ratio"] == pytest.approx(one["steps_per_s"] / sync["steps_per_s"])


def test_the_8b_memory_formula_rows_are_labelled_formula_only():
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check_fsdp import formula_only_8b
    from trace_gym.bench.train import SHAPES, memory_estimate

    one, eight = formula_only_8b((1, 8), 2048, 16, 139.8)
    assert one["formula_only"] and one["check"] == "memory_formula_8b_full"
    want = memory_estimate(
        SHAPES["qwen3-8b"], 8, micro_batch=1, seq_len=2048, gen_batch=16, gen_context=2048
    )
    assert eight["rank0_gib"] == pytest.approx(want["rank0"] / 2**30)
    # 16 bytes of states per parameter: 8B does not fit one H200 at one rank, does at eight
    assert one["fits_device"] is False and eight["fits_device"] is True
    assert formula_only_8b((2,), 2048, 16, None)[0]["fits_device"] is None


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
