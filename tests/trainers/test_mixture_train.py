"""A three-env mixture on the tiny model, end to end on CPU, with per-env figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_three_env_mixture_trains_and_reports_per_env(tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "trace_gym.cli",
        "train",
        "--config",
        str(REPO / "configs" / "cpu_tiny_mixture.toml"),
        "--out-dir",
        str(out),
        "--set",
        "steps=3",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    envs = {
        k.split("/")[1] + "/" + k.split("/")[2] for r in rows for k in r if k.startswith("env/")
    }
    assert envs == {"trace/Sim-v0", "trace/Math-v0", "trace/BFCL-v0"}
    for r in rows:
        assert sum(r[k] for k in r if k.endswith("/prompts")) == r["prompts"]
        assert all(0.0 <= r[k] <= 1.0 for k in r if k.endswith("/success"))
    assert '"env/' in proc.stdout  # the CLI's summary shows the last step per env


def test_rollout_config_checks_mixture_and_engine_keys():
    from trace_gym.trainers.config import RolloutConfig

    from trace_gym.errors import ConfigError

    with pytest.raises(ConfigError, match="rollout_cost"):
        RolloutConfig(rollout_cost="seconds")
    with pytest.raises(ConfigError, match="ray_engines"):
        RolloutConfig(ray_engines=-1)
    cfg = RolloutConfig(env_id="trace/Mixture-v0", rollout_cost="tokens", ray_engines=2)
    assert (cfg.rollout_cost, cfg.ray_engines) == ("tokens", 2)


def test_trainer_draws_mixture_candidates_by_weight():
    from trace_gym.trainers.loop import Trainer

    from trace_gym.mixture import member_of

    trainer = Trainer.__new__(Trainer)  # only the candidate draw: no model needed
    trainer.task_ids = [f"a::{i}" for i in range(30)] + [f"b::{i}" for i in range(30)]

    class _Cfg:
        seed = 0

        class rollout:  # noqa: N801 - a config stand-in
            candidates_per_step = 8
            env_id = "trace/Mixture-v0"
            env_kwargs = {"weights": {"a": 3.0, "b": 1.0}}

    trainer.config = _Cfg
    got = trainer.candidates(4)
    assert [member_of(t) for t in got].count("a") == 6 and got == trainer.candidates(4)
