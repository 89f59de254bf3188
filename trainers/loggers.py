"""Metric sinks of the training loop beside ``metrics.jsonl``: TensorBoard, W&B, MLflow.

`TrainConfig.logging.backends` names them (default ``["tensorboard"]``; the top-level
``tensorboard = false`` drops TensorBoard). Each logger gets every finite numeric metric
of a step, with the step as its x-axis, and writes under the run's ``out_dir`` unless
told otherwise:

- ``tensorboard``: ``out_dir/tb`` (torch's ``SummaryWriter``; missing tensorboard: a
  warning, JSONL only, as before);
- ``wandb`` (extra ``wandb``): ``wandb.init(mode=logging.wandb_mode, dir=out_dir)``,
  ``"offline"`` by default, so a run writes ``out_dir/wandb/offline-run-*/run-*.wandb``
  and needs no account or network (``wandb sync`` uploads it later); the run id is kept
  in ``out_dir/wandb_run_id`` so a resumed run continues the same W&B run;
  `read_wandb_history` reads an offline run's logged rows back;
- ``mlflow`` (extra ``mlflow``): an ``MlflowClient`` on ``logging.mlflow_tracking_uri``,
  by default ``sqlite:///out_dir/mlflow.db`` (MLflow 3 refuses its old file store),
  artifacts in ``out_dir/mlartifacts``; the flattened config goes in as params. Nothing
  global is touched (no ``mlflow.set_tracking_uri``).

A backend whose package is missing fails at `Trainer` construction with the extra to
install (`check_backends`), not after the first step.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import secrets
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from trace_gym.errors import ConfigError, DependencyNotInstalled, unknown
from trace_gym.optional import EXTRAS, require

__all__ = [
    "LOGGERS",
    "MetricLogger",
    "check_backends",
    "make_loggers",
    "read_wandb_history",
    "scalars",
]

log = logging.getLogger(__name__)

#: backend name -> (module that must be importable, extra that installs it)
BACKENDS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "train"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}
WANDB_MODES = ("offline", "online", "disabled")


class MetricLogger(Protocol):
    """A metric sink: `log` one step's scalars, `close` at the end of `Trainer.run`."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(m: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of a metrics row, as floats (``step`` left out)."""
    return {
        k: float(v)
        for k, v in m.items()
        if k != "step" and isinstance(v, (int, float)) and math.isfinite(float(v))
    }


class TensorBoardLogger:
    def __init__(self, out_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out_dir / "tb"))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbLogger:
    def __init__(self, out_dir: Path, cfg: Any, config: dict[str, Any]):
        wandb = require("wandb", "wandb")
        id_file = out_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=cfg.wandb_project,
            name=cfg.run_name or out_dir.name,
            dir=str(out_dir),
            mode=cfg.wandb_mode,
            id=run_id,
            resume="allow",
            config=config,
            reinit="create_new",
            **cfg.wandb_kwargs,
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MLflowLogger:
    def __init__(self, out_dir: Path, cfg: Any, config: dict[str, Any]):
        require("mlflow", "mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.metric = Metric
        uri = cfg.mlflow_tracking_uri or f"sqlite:///{(out_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(cfg.mlflow_experiment)
        exp_id = (
            exp.experiment_id
            if exp
            else self.client.create_experiment(
                cfg.mlflow_experiment,
                artifact_location=(out_dir / "mlartifacts").resolve().as_uri(),
            )
        )
        self.run_id = self.client.create_run(
            exp_id, run_name=cfg.run_name or out_dir.name
        ).info.run_id
        params = [Param(k, str(v)[:500]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        ts = int(time.time() * 1000)
        rows = [self.metric(_mlflow_key(k), v, ts, step) for k, v in metrics.items()]
        for i in range(0, len(rows), 1000):
            self.client.log_batch(self.run_id, metrics=rows[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _mlflow_key(key: str) -> str:
    """MLflow keys allow alphanumerics, ``_ - . / space``; anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_backends(names: list[str]) -> None:
    """Unknown names are a `ConfigError`; a missing wandb/mlflow package names its extra."""
    for name in names:
        if name not in BACKENDS:
            raise unknown("logging backend", name, BACKENDS)
        module, extra = BACKENDS[name]
        if name != "tensorboard" and importlib.util.find_spec(module) is None:
            raise DependencyNotInstalled(module, EXTRAS[extra])


def make_loggers(
    names: list[str], out_dir: Path, cfg: Any, config: dict[str, Any]
) -> list[MetricLogger]:
    """The loggers of `names` writing under `out_dir`; `cfg` is the `LoggingConfig`."""
    check_backends(names)
    loggers: list[MetricLogger] = []
    for name in names:
        if name == "tensorboard":
            try:
                loggers.append(TensorBoardLogger(out_dir))
            except ImportError:  # tensorboard missing: JSONL only (the loop's behaviour since v0.1)
                log.warning("tensorboard is not installed; metrics go to metrics.jsonl only")
        elif name == "wandb":
            loggers.append(WandbLogger(out_dir, cfg, config))
        else:
            loggers.append(MLflowLogger(out_dir, cfg, config))
    return loggers


LOGGERS = tuple(BACKENDS)


# ---------------------------------------------------------------------- W&B offline files
_WB_BLOCK, _WB_HEADER = 32768, 7  # the .wandb file is a LevelDB-style log of 32 KiB blocks


def _wandb_records(data: bytes) -> list[bytes]:
    """The records of a ``.wandb`` file (LevelDB log format: FULL/FIRST/MIDDLE/LAST chunks)."""
    ident, magic, _version = struct.unpack("<4sHB", data[:_WB_HEADER])
    if ident != b":W&B" or magic != 0xBEE1:
        raise ConfigError("not a W&B run file (bad header)")
    out, i, buf = [], _WB_HEADER, b""
    while i + _WB_HEADER <= len(data):
        left = _WB_BLOCK - i % _WB_BLOCK
        _crc, n, kind = struct.unpack("<IHB", data[i : i + _WB_HEADER])
        if left < _WB_HEADER or (n == 0 and kind == 0):  # block padding
            i += left
            continue
        chunk = data[i + _WB_HEADER : i + _WB_HEADER + n]
        i += _WB_HEADER + n
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            out.append(buf + chunk)
    return out


def read_wandb_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The history rows (``run.log`` calls) of the newest offline W&B run under `run_dir`.

    `run_dir` is the ``dir`` given to ``wandb.init`` (a trainer's ``out_dir``) or the
    ``offline-run-*`` folder itself. Needs the wandb package (for its protobuf schema).
    """
    pb = require("wandb.proto.wandb_internal_pb2", "wandb")
    root = Path(run_dir)
    files = sorted(root.glob("run-*.wandb")) or sorted(root.glob("wandb/offline-run-*/run-*.wandb"))
    if not files:
        raise ConfigError(f"no offline W&B run under {root}")
    rows = []
    for raw in _wandb_records(files[-1].read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            rows.append(
                {
                    it.key or "/".join(it.nested_key): json.loads(it.value_json)
                    for it in rec.history.item
                }
            )
    return rows
