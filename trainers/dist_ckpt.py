"""Sharded checkpoints of `trace_gym.trainers.sharding.ShardedTrainer` with ``torch.distributed.checkpoint``.

A checkpoint directory ``out_dir/checkpoints/step_NNNNNN`` holds

- ``dcp/``: the model and AdamW state as DCP writes them (one ``.distcp`` file per rank
  plus ``.metadata``), from ``get_state_dict(model, optimizer)``: keys are parameter
  names (FQNs), so a checkpoint written by W ranks loads on any other number of ranks
  (DCP reshards on load; tested 2 -> 1 and 2 -> 2);
- ``state.safetensors`` + ``state.json``: rank 0's step, RNG states, predictor
  ``state_dict()``, visit histories, config and the step's metrics row
  (`trace_gym.trainers.checkpoint.training_state`, as in a single-process checkpoint,
  plus the world size), written without pickle (`trace_gym.trainers.state_io`);
- ``checksums.json``: the sha256 of every file above.

DCP keeps ``dcp/.metadata`` as a pickle (its ``FileSystemReader`` reads it with
``pickle.load``; tensors and the optimiser's scalars in ``.distcp`` are read with
``torch.load(weights_only=True)``). Before DCP loads it, rank 0 reads ``.metadata`` with
an unpickler that builds only DCP's metadata classes, torch sizes and dtypes
(`state_io.check_dcp_metadata`) and refuses the checkpoint otherwise, unless
``trust_checkpoint``. An old checkpoint with ``state.pkl`` loads only with
``trust_checkpoint``.

Every rank writes its shards into ``.tmp-step_NNNNNN``; after a barrier rank 0 adds the
state and checksums and moves the directory into place with ``os.replace``, then the
``latest`` pointer, as the single-process trainer does, so a job killed at any moment
resumes from the last complete step (at most one step is lost); the checkpoint also
carries the metrics row of its step, appended on resume if the job died before writing it. On resume rank 0 checks
the candidates (newest valid first, skipping damaged ones with a warning) and tells the
others which one to load. The output directory must be on a filesystem every rank sees.
"""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

from trace_gym.trainers.checkpoint import (
    CHECKSUMS,
    STATE_FILE,
    STATE_STEM,
    checkpoint_dirs,
    is_legacy,
    no_usable_checkpoint,
    publish_checkpoint,
    restore_metrics_row,
    restore_training_state,
    training_state,
    truncate_metrics,
    verify_checksums,
    warn_older,
)
from trace_gym.trainers.state_io import (
    check_dcp_metadata,
    legacy_refused,
    load_legacy,
    load_state,
    save_state,
)

from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.optional import require

torch = require("torch", "train")

__all__ = ["DCP_DIR", "STATE_FILE", "load_sharded", "save_sharded", "state_dicts"]

DCP_DIR = "dcp"


def _barrier() -> None:
    torch.distributed.barrier()


def _state(tr: Any) -> dict[str, Any]:
    return {**training_state(tr), "world_size": tr.dist.world_size}


def _files(path: Path) -> list[str]:
    return sorted(
        str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != CHECKSUMS
    )


def state_dicts(tr: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``get_state_dict(tr.model, tr.optimizer)`` that leaves a fresh optimizer fresh.

    DCP gives an optimizer without state one by a zero-gradient step at lr 0. For Adam that
    step counts: a checkpoint before the first update (a first step without samples) left
    the step count at 1, so the first real update was 0.74x a fresh one's (bias correction
    at t = 2), and the run left one process's by 0.26 lr. The counts go back to 0 - with
    zero moments, exactly a fresh Adam - in the live state and in the dict saved.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    fresh = not tr.optimizer.state
    model_sd, optim_sd = get_state_dict(tr.model, tr.optimizer)
    if fresh:
        for state in [*tr.optimizer.state.values(), *optim_sd.get("state", {}).values()]:
            _zero_step(state)
    return model_sd, optim_sd


def _zero_step(state: dict[str, Any]) -> None:
    step = state.get("step")
    if torch.is_tensor(step):
        step.zero_()
    elif step is not None:
        state["step"] = 0


def save_sharded(tr: Any) -> Path:
    """Write the checkpoint of `tr.step` (every rank its shards; rank 0 the rest); prune old ones."""
    from torch.distributed.checkpoint import save

    root = tr.ckpt_root
    final = root / f"step_{tr.step:06d}"
    tmp = root / f".tmp-{final.name}"
    if tr.dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    model_sd, optim_sd = state_dicts(tr)
    save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / DCP_DIR))
    _barrier()
    if tr.dist.is_main:
        save_state(tmp, STATE_STEM, _state(tr))
        publish_checkpoint(tmp, final, _files(tmp), tr.config.keep_checkpoints)
    _barrier()
    return final


def check(path: Path, trusted: bool = False) -> str | None:
    """What is wrong with the sharded checkpoint dir `path` (None: it is complete and intact).

    Raises `ConfigError` for one holding pickles that are not DCP's metadata (an old
    ``state.pkl``, or a ``.metadata`` that would build anything else), unless `trusted`.
    """
    if (path / "trainer.pt").exists() and not (path / DCP_DIR).exists():
        return "written by a single-process run (trainer.pt); a sharded run resumes from sharded checkpoints only"
    if not (path / CHECKSUMS).exists() or not (path / DCP_DIR / ".metadata").exists():
        return "incomplete (no checksums.json or dcp/.metadata)"
    legacy = is_legacy(path, STATE_FILE)
    if legacy and not trusted:
        raise legacy_refused(path, legacy)
    try:
        verify_checksums(path, legacy or [f"{STATE_STEM}.safetensors", STATE_FILE])
    except TraceGymError as e:
        return str(e)
    except (OSError, ValueError) as e:
        return f"unreadable {CHECKSUMS} ({type(e).__name__})"
    if not trusted:
        try:
            check_dcp_metadata(path / DCP_DIR / ".metadata")
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
            raise legacy_refused(path, [f"{DCP_DIR}/.metadata ({e})"]) from e
    return None


def _pick(tr: Any) -> tuple[Path | None, list[str]]:
    """Rank 0: the newest intact checkpoint and the problems with newer ones (warned about)."""
    candidates, problems = checkpoint_dirs(tr.ckpt_root)
    trusted = bool(getattr(tr.config, "trust_checkpoint", False))
    for path in candidates:
        why = check(path, trusted)
        if why is None:
            warn_older(path, problems)
            return path, problems
        problems.append(f"{path.name}: {why}")
        warnings.warn(f"skipping checkpoint {path}: {why}", RuntimeWarning, stacklevel=3)
    return None, problems


def load_sharded(tr: Any) -> bool:
    """Restore the newest valid sharded checkpoint on every rank; True when one was loaded."""
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import set_state_dict

    box: list[Any] = [None]
    if tr.dist.is_main:
        try:
            box = [_pick(tr)]
        except ConfigError as e:  # every rank raises it, none waits for the others
            box = [str(e)]
    torch.distributed.broadcast_object_list(box, src=0)
    if isinstance(box[0], str):
        raise ConfigError(box[0])
    path, problems = box[0]
    if path is None:
        if problems:
            raise no_usable_checkpoint(tr.ckpt_root, problems)
        return False
    model_sd, optim_sd = state_dicts(tr)  # the shapes to load into (then overwritten)
    state = {"model": model_sd, "optim": optim_sd}
    load(state, checkpoint_id=str(path / DCP_DIR))
    set_state_dict(
        tr.model, tr.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    _apply_state(tr, path, _read_state(tr, path))
    tr._sync()
    return True


def _read_state(tr: Any, path: Path) -> dict[str, Any]:
    """The checkpoint's `training_state` (an old ``state.pkl`` only when trusted)."""
    if is_legacy(path, STATE_FILE):
        return load_legacy(path / "state.pkl", bool(tr.config.trust_checkpoint))
    return load_state(path, STATE_STEM)


def _apply_state(tr: Any, path: Path, state: dict[str, Any]) -> None:
    restore_training_state(tr, path, state)  # every rank (predictor, histories: rank 0's matter)
    if tr.dist.is_main:
        truncate_metrics(tr.out, tr.step)
        restore_metrics_row(tr.out, tr.step, state.get("metrics"))
