"""Config files, the `trace-gym train` CLI and the GPU check script's no-CUDA exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trace_gym.bench.pipeline import mean_ci
from trace_gym.trainers.config import TrainConfig, load_config

from trace_gym.errors import ConfigError, UnknownNameError

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_preset_validates(path):
    cfg = load_config(path)
    assert cfg.algo.name in ("treerpo", "tree_grpo")
    assert cfg.rollout.allocator == "trace"
    if (
        cfg.policy.kind == "hf"
    ):  # one-GPU presets at 8B/14B use LoRA; full fine-tunes are FSDP presets
        assert cfg.policy.device == "cuda"
        if not cfg.policy.lora:
            text = path.read_text()
            assert cfg.dist.param_dtype == "bfloat16" and cfg.dist.strategy != "none"
            assert "torchrun --standalone --nproc-per-node 8" in text and "UNVERIFIED" in text
        assert "GPU" in path.read_text().splitlines()[0] + path.read_text()


def test_overrides_and_formats(tmp_path):
    cfg = load_config(REPO / "configs" / "cpu_tiny_sim.toml", {"algo.name": "grpo", "steps": 3})
    assert (cfg.algo.name, cfg.steps) == ("grpo", 3)
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"steps": 1, "algo": {"name": "tree_grpo"}}))
    assert load_config(j).algo.name == "tree_grpo"
    bad = tmp_path / "c.toml"
    bad.write_text("[algo]\nname = 'ppo'\n")
    with pytest.raises(UnknownNameError, match="treerpo"):
        load_config(bad)
    bad.write_text("stepz = 3\n")
    with pytest.raises(ConfigError, match="stepz"):
        load_config(bad)
    assert TrainConfig.from_dict(TrainConfig().to_dict()) == TrainConfig()


def test_cli_check_and_bad_name_exit_code(tmp_path):
    run = [
        sys.executable,
        "-m",
        "trace_gym.cli",
        "train",
        "--config",
        str(REPO / "configs" / "cpu_tiny_sim.toml"),
    ]
    ok = subprocess.run(
        [*run, "--check", "--set", "algo.name=tree_grpo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["algo"]["name"] == "tree_grpo"
    bad = subprocess.run(
        [*run, "--set", "rollout.allocator=nope"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "unknown allocator 'nope'" in bad.stderr


def test_gpu_script_exits_clearly_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present; the script would run the real check")
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check_train.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 3 and "no CUDA device" in r.stderr


def test_mean_ci():
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == pytest.approx(2.0) and h == pytest.approx(4.303 * 1.0 / 3**0.5)
    assert mean_ci([0.5])[0] == 0.5


def test_pipeline_methods_share_the_accounted_budget(tmp_path):
    from trace_gym.bench.pipeline import METHODS, method_config

    costs = {}
    for m in METHODS:
        r = method_config(m, 0, 1, str(tmp_path / m)).rollout
        costs[m] = r.root_budget * (1 + r.replays_per_root * r.replay_cost)
    assert costs == {"trace": 24.0, "treepo": 24.0, "grpo": 24.0}
