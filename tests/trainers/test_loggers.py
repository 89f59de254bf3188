"""Metric loggers beside metrics.jsonl: TensorBoard, W&B (offline) and MLflow (sqlite), read back."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from trace_gym.trainers.config import LoggingConfig, TrainConfig  # noqa: E402
from trace_gym.trainers.loggers import make_loggers, read_wandb_history, scalars  # noqa: E402

from trace_gym.errors import ConfigError, UnknownNameError  # noqa: E402


def test_scalars_keep_finite_numbers_only():
    assert scalars(
        {"step": 3, "loss": 0.5, "n": 2, "bad": float("nan"), "inf": float("inf"), "name": "x"}
    ) == {"loss": 0.5, "n": 2.0}


def test_logging_config_refuses_unknown_backends_and_modes():
    with pytest.raises(UnknownNameError, match="wandbb"):
        LoggingConfig(backends=["wandbb"])
    with pytest.raises(ConfigError, match="wandb_mode"):
        LoggingConfig(wandb_mode="cloud")
    with pytest.raises(ConfigError, match="twice"):
        LoggingConfig(backends=["mlflow", "mlflow"])
    with pytest.raises(ConfigError, match="unknown key"):
        TrainConfig.from_dict({"logging": {"backend": ["wandb"]}})
    assert LoggingConfig(backends=["tensorboard", "wandb"]).active(tensorboard=False) == ["wandb"]


def _mlflow_history(out, key):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("trace-gym")
    (run,) = client.search_runs([exp.experiment_id])
    return run, [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]


def test_each_backend_writes_what_it_was_given(tmp_path):
    cfg = LoggingConfig(backends=["tensorboard", "wandb", "mlflow"], run_name="unit")
    loggers = make_loggers(cfg.backends, tmp_path, cfg, {"algo": {"name": "treerpo"}, "seed": 3})
    for step in range(3):
        for lg in loggers:
            lg.log({"loss": 1.0 / (step + 1), "trace/roots": 6.0}, step)
    for lg in loggers:
        lg.close()
    rows = read_wandb_history(tmp_path)
    assert [(r["_step"], r["loss"], r["trace/roots"]) for r in rows] == [
        (0, 1.0, 6),
        (1, 0.5, 6),
        (2, 1 / 3, 6),
    ]
    run, hist = _mlflow_history(tmp_path, "loss")
    assert hist == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert run.data.params["algo.name"] == "treerpo" and run.info.run_name == "unit"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("trace/roots")] == [
        (0, 6.0),
        (1, 6.0),
        (2, 6.0),
    ]


@pytest.mark.slow  # ~20 s on a shared 2-core machine: a 2-step run with all three backends open
def test_the_trainer_logs_to_wandb_and_mlflow_offline(tmp_path, policy_factory, guess_env_factory):
    from trace_gym.trainers.loop import Trainer

    cfg = TrainConfig.from_dict(
        {
            "steps": 2,
            "seed": 3,
            "out_dir": str(tmp_path / "run"),
            "tensorboard": False,
            "progress": False,
            "policy": {"kind": "custom"},
            "logging": {"backends": ["tensorboard", "wandb", "mlflow"]},
            "rollout": {
                "root_budget": 6,
                "replays_per_root": 1.0,
                "candidates_per_step": 3,
                "group_size": 2,
            },
            "optim": {"lr": 1e-3, "micro_batch_size": 3},
        }
    )
    Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory).run()
    out = tmp_path / "run"
    jsonl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    wb = read_wandb_history(out)
    assert [r["_step"] for r in wb] == [0, 1]
    assert [r["reward"] for r in wb] == [row["reward"] for row in jsonl]
    assert [r["roots"] for r in wb] == [6, 6]
    _, hist = _mlflow_history(out, "loss")
    assert [s for s, _ in hist] == [0, 1] and [v for _, v in hist] == pytest.approx(
        [row["loss"] for row in jsonl]
    )
    assert not (out / "tb").exists()  # tensorboard = false in tiny_config
    # a resumed run continues the same W&B run (the id is kept in the run dir)
    run_id = (out / "wandb_run_id").read_text().strip()
    assert run_id and run_id in next(out.glob("wandb/offline-run-*")).name
