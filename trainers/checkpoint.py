"""Training checkpoints: what both trainers save and load, and how a checkpoint is published.

A checkpoint directory ``out_dir/checkpoints/step_NNNNNN`` holds the trained weights and
optimiser (``trainer.safetensors`` + ``trainer.json`` for the single-process `Trainer`;
``dcp/`` shards for the sharded one, `trace_gym.trainers.dist_ckpt`), ``state.safetensors``
+ ``state.json`` - the step, RNG states, the predictor's ``state_dict()``, the runner's
visit histories and measured rollout costs, the config and the step's metrics row
(`training_state`) - and ``checksums.json``, the sha256 of every file. Nothing in it is a
pickle (`trace_gym.trainers.state_io`): a checkpoint someone else made loads as data.
A checkpoint of the old pickle format (``trainer.pt``, ``state.pkl``) loads only with
``trust_checkpoint = true`` (``--trust-checkpoint``).

It is written into a temporary directory and moved into place with ``os.replace``
(`publish_checkpoint`); ``latest`` is updated the same way, so a run killed at any moment
resumes from the last complete step and replays the following steps with the same data.
Resuming tries the checkpoint ``latest`` names, then the others newest first
(`checkpoint_dirs`), skipping with a warning one that is truncated, fails its checksum or
is missing, drops the metric rows of steps after it (`truncate_metrics`; a torn last
row too) and puts back the checkpoint's own row when it is missing (`restore_metrics_row`:
the checkpoint is published before its row is logged). A run folder that holds rows or
checkpoints but no usable checkpoint to resume from is refused (`refuse_used_run`) unless
``overwrite = true``, which clears it first (`clear_run`). See docs/trainers.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from trace_gym.trainers.state_io import legacy_refused, load_legacy, load_state, save_state

from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.optional import require

torch = require("torch", "train")

__all__ = [
    "CHECKPOINT_FILES",
    "CHECKSUMS",
    "LEGACY_FILES",
    "STATE_FILE",
    "STATE_STEM",
    "checkpoint_dirs",
    "clear_run",
    "is_legacy",
    "load_checkpoint",
    "no_usable_checkpoint",
    "publish_checkpoint",
    "refuse_used_run",
    "restore_metrics_row",
    "restore_training_state",
    "save_checkpoint",
    "sha256_file",
    "training_state",
    "truncate_metrics",
    "verify_checksums",
    "warn_older",
]

log = logging.getLogger(__name__)

#: the files of a single-process checkpoint dir, each with its sha256 in `CHECKSUMS`
CHECKPOINT_FILES = ("trainer.safetensors", "trainer.json", "state.safetensors", "state.json")
CHECKSUMS = "checksums.json"
#: `training_state` of every checkpoint: ``state.safetensors`` + ``state.json``
STATE_STEM = "state"
STATE_FILE = "state.json"
#: the pickles of a checkpoint written before the pickle-free format
LEGACY_FILES = ("trainer.pt", "state.pkl")
#: what a run writes into its out_dir (`clear_run` removes them)
RUN_OUTPUTS = ("metrics.jsonl", "checkpoints", "trees", "tb")


class _BadCheckpoint(TraceGymError):
    """A checkpoint dir that cannot be read (truncated, checksum mismatch, missing file)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------- the state both save
def training_state(tr: Any) -> dict[str, Any]:
    """`tr`'s step, RNG states, predictor state, visit histories, rollout costs and config."""
    rng = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    # an asynchronous run's runner is ahead of the trainer: its state as of the trained step
    runner = tr.checkpoint_runner() if hasattr(tr, "checkpoint_runner") else tr.runner
    predictor = runner.predictor
    return {
        "step": tr.step,
        "rng": rng,
        "predictor": None if predictor is None else predictor.state_dict(),
        "history": dict(runner.history),
        "config": tr.config.to_dict(),
        "rollout_costs": None if runner.costs is None else dict(runner.costs.mean),
        "metrics": getattr(tr, "last_metrics", None),
    }


def restore_training_state(tr: Any, path: Path, state: dict[str, Any]) -> None:
    """Put a `training_state` back: step, predictor, visit histories, costs, RNG states."""
    tr.step = int(state["step"])
    if state["predictor"] is not None:
        if tr.runner.predictor is None:
            raise ConfigError(
                f"checkpoint {path} holds a predictor's state but this run has no predictor"
            )
        tr.runner.predictor.load_state_dict(state["predictor"])
    tr.runner.history.clear()
    tr.runner.history.update(state["history"])
    if (
        tr.runner.costs is not None and state.get("rollout_costs") is not None
    ):  # a mixture's measured costs
        tr.runner.costs.mean = dict(state["rollout_costs"])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(tuple(state["rng"]["numpy"]))
    random.setstate(state["rng"]["python"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])


def truncate_metrics(out: Path, step: int) -> None:
    """Drop metric rows of steps >= `step` (they will be rerun) and torn lines."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return
    rows, torn = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row_step = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError):  # a kill while the row was written
            torn += 1
            continue
        if row_step < step:
            rows.append(line)
    if torn:
        warnings.warn(
            f"{path}: dropped {torn} unreadable row(s) (a run killed while logging)",
            RuntimeWarning,
            stacklevel=3,
        )
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(r + "\n" for r in rows))
    os.replace(tmp, path)


def restore_metrics_row(out: Path, step: int, row: dict[str, Any] | None) -> None:
    """Append the checkpoint's metrics row (of step `step` - 1) when the run died after
    publishing the checkpoint, before (or while) it logged the row."""
    path = out / "metrics.jsonl"
    if not row or row.get("step") != step - 1:
        return
    lines = path.read_text().splitlines() if path.exists() else []
    if any(json.loads(x).get("step") == row["step"] for x in lines if x.strip()):
        return
    with open(path, "a") as f:
        f.write(json.dumps(row, default=float) + "\n")


def _metric_rows(out: Path) -> int:
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text(errors="replace").splitlines() if line.strip())


def refuse_used_run(out: Path, resume: bool) -> None:
    """Raise `ConfigError` when `out` holds metric rows or checkpoints of an earlier run
    that this run is not resuming (its rows would be appended to: steps 0,1,2,0,1)."""
    rows = _metric_rows(out)
    ckpts = sorted(p.name for p in (out / "checkpoints").glob("step_*") if p.is_dir())
    if not rows and not ckpts:
        return
    held = f"{rows} metric row(s)" + (f" and checkpoints up to {ckpts[-1]}" if ckpts else "")
    why = "no checkpoint to resume from" if resume else "resume = false"
    raise ConfigError(
        f"{out} already holds a run ({held}) and this run would start at step 0 ({why}); "
        "pass --overwrite (overwrite = true) to start over in it, or choose another --out-dir"
    )


def clear_run(out: Path) -> None:
    """Remove what an earlier run wrote into `out` (`RUN_OUTPUTS`), for ``overwrite``."""
    for name in RUN_OUTPUTS:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


# ---------------------------------------------------------------------- publishing, finding
def publish_checkpoint(tmp: Path, final: Path, files: Sequence[str], keep: int) -> Path:
    """Write the checksums of `files` in `tmp`, move `tmp` to `final`, point ``latest`` at it
    (both with ``os.replace``) and keep the newest `keep` checkpoints."""
    root = final.parent
    sums = {name: sha256_file(tmp / name) for name in files}
    (tmp / CHECKSUMS).write_text(json.dumps(sums, indent=1) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer = root / f".latest-{os.getpid()}"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_dirs(root: Path) -> tuple[list[Path], list[str]]:
    """Checkpoint dirs under `root` to try, best first (the one ``latest`` names, then
    newest first), and what was wrong with the pointer."""
    found = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
    pointer = root / "latest"
    if not pointer.exists():
        return found, []
    named = root / pointer.read_text(errors="replace").strip()
    if named.is_dir():
        return [named] + [p for p in found if p != named], []
    problem = f"checkpoint pointer {pointer} names {named.name!r}, which is missing"
    warnings.warn(f"{problem}; looking for an older checkpoint", RuntimeWarning, stacklevel=3)
    return found, [problem]


def warn_older(path: Path, problems: Sequence[str]) -> None:
    """Say that newer checkpoints were skipped, when they were."""
    if problems:
        warnings.warn(
            f"resuming from the older checkpoint {path} ({len(problems)} problem(s) with newer ones)",
            RuntimeWarning,
            stacklevel=3,
        )


def no_usable_checkpoint(root: Path, problems: Sequence[str]) -> ConfigError:
    return ConfigError(
        f"no usable checkpoint in {root} ({'; '.join(problems)}); "
        "pass --overwrite (overwrite = true) to start over in that run folder"
    )


# ---------------------------------------------------------------------- single process
def save_checkpoint(tr: Any) -> Path:
    """Write `tr`'s complete checkpoint for ``tr.step`` atomically; prune old ones."""
    root = tr.ckpt_root
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{tr.step:06d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    weights = {n: p.detach().cpu() for n, p in tr.model.named_parameters() if p.requires_grad}
    files = save_state(tmp, "trainer", {"weights": weights, "optimizer": tr.optimizer.state_dict()})
    files += save_state(tmp, STATE_STEM, training_state(tr))
    return publish_checkpoint(tmp, final, files, tr.config.keep_checkpoints)


def load_checkpoint(tr: Any) -> bool:
    """Restore the newest valid checkpoint into `tr`, if any; True when one was loaded.

    A checkpoint whose files are truncated or fail their checksum is skipped with a
    warning (the previous one is intact: checkpoints are written whole, then moved).
    One in the old pickle format is refused unless ``config.trust_checkpoint``.
    """
    candidates, problems = checkpoint_dirs(tr.ckpt_root)
    trusted = bool(getattr(tr.config, "trust_checkpoint", False))
    for path in candidates:
        try:
            blob, state = _read_checkpoint(path, trusted)
        except _BadCheckpoint as e:
            problems.append(str(e))
            warnings.warn(f"skipping checkpoint {path}: {e}", RuntimeWarning, stacklevel=2)
            continue
        warn_older(path, problems)
        _apply_checkpoint(tr, path, blob, state)
        return True
    if problems:
        raise no_usable_checkpoint(tr.ckpt_root, problems)
    return False


def _apply_checkpoint(tr: Any, path: Path, blob: dict[str, Any], state: dict[str, Any]) -> None:
    missing = set(blob["weights"]) - {n for n, _ in tr.model.named_parameters()}
    if missing:
        raise ConfigError(
            f"checkpoint {path} does not match the model (unknown weights {sorted(missing)[:3]}...)"
        )
    with torch.no_grad():
        params = dict(tr.model.named_parameters())
        for n, w in blob["weights"].items():
            params[n].copy_(w)
    tr.optimizer.load_state_dict(blob["optimizer"])
    restore_training_state(tr, path, state)
    truncate_metrics(tr.out, tr.step)
    restore_metrics_row(tr.out, tr.step, state.get("metrics"))
    tr._sync()
    log.info("resumed from %s (next step %d)", path, tr.step)


def is_legacy(path: Path, new_file: str) -> list[str]:
    """The old-format pickles in checkpoint dir `path` when it lacks `new_file` (else [])."""
    if (path / new_file).exists():
        return []
    return [name for name in LEGACY_FILES if (path / name).exists()]


def verify_checksums(path: Path, required: Sequence[str]) -> None:
    """Raise `_BadCheckpoint` when a file of `path` is missing or fails its checksum."""
    sums_path = path / CHECKSUMS
    sums = json.loads(sums_path.read_text()) if sums_path.exists() else {}  # older: none
    for name in required:
        if not (path / name).is_file():
            raise _BadCheckpoint(f"{name} is missing")
    for name, digest in sums.items():
        if not (path / name).is_file():
            raise _BadCheckpoint(f"{name} is missing")
        if sha256_file(path / name) != digest:
            raise _BadCheckpoint(f"{name} does not match its checksum (truncated or changed)")


def _read_checkpoint(path: Path, trusted: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer blob, state) of a checkpoint dir, verified; raises `_BadCheckpoint`, or
    `ConfigError` for an old pickle checkpoint that is not `trusted`."""
    legacy = is_legacy(path, "trainer.json")
    if legacy and not trusted:
        raise legacy_refused(path, legacy)
    try:
        verify_checksums(path, LEGACY_FILES if legacy else CHECKPOINT_FILES)
        if legacy:
            blob = load_legacy(path / "trainer.pt", trusted)
            state = load_legacy(path / "state.pkl", trusted)
        else:
            blob, state = load_state(path, "trainer"), load_state(path, STATE_STEM)
        if (
            not isinstance(blob, dict)
            or not isinstance(state, dict)
            or {"weights", "optimizer"} - set(blob)
        ):
            raise _BadCheckpoint("its files do not hold a trainer checkpoint")
    except _BadCheckpoint:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to read means: try the previous one
        raise _BadCheckpoint(f"unreadable ({type(e).__name__}: {str(e)[:120]})") from e
    return blob, state
