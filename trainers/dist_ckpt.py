"""Sharded checkpoints of `trace_gym.trainers.sharding.ShardedTrainer` with ``torch.distributed.checkpoint``.

A checkpoint directory ``out_dir/checkpoints/step_NNNNNN`` holds

- ``dcp/``: the model and AdamW state as DCP writes them (one ``.distcp`` file per rank
  plus ``.metadata``), from ``get_state_dict(model, optimizer)``: keys are parameter
  names (FQNs), so a checkpoint written by W ranks loads on any other number of ranks
  (DCP reshards on load; tested 2 -> 1 and 2 -> 2);
- ``state.pkl``: rank 0's step, RNG states, predictor ``state_dict()``, visit histories
  and config (`trace_gym.trainers.checkpoint.training_state`, as in a single-process
  checkpoint, plus the world size and the step's metrics row);
- ``checksums.json``: the sha256 of every file above.

Every rank writes its shards into ``.tmp-step_NNNNNN``; after a barrier rank 0 adds the
state and checksums and moves the directory into place with ``os.replace``, then the
``latest`` pointer, as the single-process trainer does, so a job killed at any moment
resumes from the last complete step (at most one step is lost); the checkpoint also
carries the metrics row of its step, appended on resume if the job died before writing it. On resume rank 0 checks
the candidates (newest valid first, skipping damaged ones with a warning) and tells the
others which one to load. The output directory must be on a filesystem every rank sees.
"""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

from trace_gym.trainers.checkpoint import (
    CHECKSUMS,
    STATE_FILE,
    checkpoint_dirs,
    no_usable_checkpoint,
    publish_checkpoint,
    restore_training_state,
    sha256_file,
    training_state,
    truncate_metrics,
    warn_older,
)

from trace_gym.optional import require

torch = require("torch", "train")

__all__ = ["DCP_DIR", "STATE_FILE", "load_sharded", "save_sharded"]

DCP_DIR = "dcp"


def _barrier() -> None:
    torch.distributed.barrier()


def _state(tr: Any) -> dict[str, Any]:
    return {
        **training_state(tr),
        "world_size": tr.dist.world_size,
        "metrics": getattr(tr, "last_metrics", None),
    }


def _files(path: Path) -> list[str]:
    return sorted(
        str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != CHECKSUMS
    )


def save_sharded(tr: Any) -> Path:
    """Write the checkpoint of `tr.step` (every rank its shards; rank 0 the rest); prune old ones."""
    from torch.distributed.checkpoint import save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = tr.ckpt_root
    final = root / f"step_{tr.step:06d}"
    tmp = root / f".tmp-{final.name}"
    if tr.dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    model_sd, optim_sd = get_state_dict(tr.model, tr.optimizer)
    save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / DCP_DIR))
    _barrier()
    if tr.dist.is_main:
        with open(tmp / STATE_FILE, "wb") as f:
            pickle.dump(_state(tr), f)
        publish_checkpoint(tmp, final, _files(tmp), tr.config.keep_checkpoints)
    _barrier()
    return final


def check(path: Path) -> str | None:
    """What is wrong with the sharded checkpoint dir `path` (None: it is complete and intact)."""
    if (path / "trainer.pt").exists() and not (path / DCP_DIR).exists():
        return "written by a single-process run (trainer.pt); a sharded run resumes from sharded checkpoints only"
    sums_path = path / CHECKSUMS
    if not sums_path.exists() or not (path / DCP_DIR / ".metadata").exists():
        return "incomplete (no checksums.json or dcp/.metadata)"
    try:
        sums = json.loads(sums_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return f"unreadable {CHECKSUMS} ({type(e).__name__})"
    for name, digest in sums.items():
        if not (path / name).is_file():
            return f"{name} is missing"
        if sha256_file(path / name) != digest:
            return f"{name} does not match its checksum (truncated or changed)"
    return None


def _pick(tr: Any) -> tuple[Path | None, list[str]]:
    """Rank 0: the newest intact checkpoint and the problems with newer ones (warned about)."""
    candidates, problems = checkpoint_dirs(tr.ckpt_root)
    for path in candidates:
        why = check(path)
        if why is None:
            warn_older(path, problems)
            return path, problems
        problems.append(f"{path.name}: {why}")
        warnings.warn(f"skipping checkpoint {path}: {why}", RuntimeWarning, stacklevel=3)
    return None, problems


def load_sharded(tr: Any) -> bool:
    """Restore the newest valid sharded checkpoint on every rank; True when one was loaded."""
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    box = [_pick(tr) if tr.dist.is_main else None]
    torch.distributed.broadcast_object_list(box, src=0)
    path, problems = box[0]
    if path is None:
        if problems:
            raise no_usable_checkpoint(tr.ckpt_root, problems)
        return False
    model_sd, optim_sd = get_state_dict(tr.model, tr.optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    load(state, checkpoint_id=str(path / DCP_DIR))
    set_state_dict(
        tr.model, tr.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    with open(path / STATE_FILE, "rb") as f:
        _apply_state(tr, path, pickle.load(f))
    tr._sync()
    return True


def _apply_state(tr: Any, path: Path, state: dict[str, Any]) -> None:
    restore_training_state(tr, path, state)  # every rank (predictor, histories: rank 0's matter)
    if tr.dist.is_main:
        truncate_metrics(tr.out, tr.step)
        _restore_row(tr, state.get("metrics"))


def _restore_row(tr: Any, row: dict[str, Any] | None) -> None:
    """Append the checkpoint's last metrics row when the job died after the checkpoint, before the row."""
    path = tr.out / "metrics.jsonl"
    if not row or row.get("step") != tr.step - 1:
        return
    lines = path.read_text().splitlines() if path.exists() else []
    if any(json.loads(x).get("step") == row["step"] for x in lines if x.strip()):
        return
    with open(path, "a") as f:
        f.write(json.dumps(row, default=float) + "\n")
