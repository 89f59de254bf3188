"""Math problem sets: the embedded default and DeepScaleR-format files (JSON/JSONL/parquet).

A DeepScaleR-format record has ``problem`` and ``answer`` (and usually ``solution``);
a record whose answer is null or empty is kept (its episodes always score 0, with a warning);
other fields (``id``/``unique_id``, ``year``, ``type``, ``level``, ...) are kept as
metadata. The reference answer is used as given, except that an answer written as
``\\boxed{...}`` is unwrapped.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError, DependencyNotInstalled

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_DATASET", "MathTask", "TaskSet", "load_dataset", "load_records"]

DEFAULT_DATASET = "default"


@dataclass(frozen=True)
class MathTask:
    """One problem with its reference answer (what a scripted policy may read)."""

    id: str
    problem: str
    answer: str
    solution: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class TaskSet:
    """A loaded problem set and the fingerprint checkpoints carry."""

    name: str
    tasks: tuple[MathTask, ...]
    fingerprint: str

    @property
    def ids(self) -> list[str]:
        return [t.id for t in self.tasks]


def _unbox(answer: str) -> str:
    from trace_gym.envs.math.protocol import extract_boxed

    s = answer.strip()
    found = extract_boxed(s)
    if found is not None and s.startswith("\\boxed") and s.endswith("}"):
        return found[0]
    return s


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """The raw records of a JSON list, JSONL (optionally .gz) or parquet file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"math dataset {str(path)!r} does not exist; pass a JSON, JSONL or parquet file path")
    name = path.name.lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise DependencyNotInstalled("pyarrow (to read parquet math datasets)", "pip install pyarrow") from e
        return pq.read_table(path).to_pylist()
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        records = json.loads(text)
    elif name.endswith((".jsonl", ".jsonl.gz")) or "\n" in stripped:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        records = [json.loads(text)]
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ConfigError(f"{path}: expected a list of objects with 'problem' and 'answer' fields")
    return records


def _to_tasks(records: list[dict[str, Any]], stem: str) -> tuple[MathTask, ...]:
    tasks, seen = [], set()
    for i, rec in enumerate(records):
        if "problem" not in rec or "answer" not in rec:
            raise ConfigError(
                f"record {i} of {stem!r} lacks 'problem' or 'answer' (DeepScaleR format: problem, answer, "
                f"solution); its keys are {sorted(rec)}"
            )
        tid = str(rec.get("id") or rec.get("unique_id") or f"{stem}-{i:05d}")
        if tid in seen:
            tid = f"{tid}#{i}"
        seen.add(tid)
        meta = {k: v for k, v in rec.items() if k not in ("problem", "answer", "solution", "id") and _jsonable(v)}
        answer = "" if rec["answer"] is None else _unbox(str(rec["answer"]))
        tasks.append(MathTask(tid, str(rec["problem"]), answer, str(rec.get("solution") or ""), meta))
    if not tasks:
        raise ConfigError(f"math dataset {stem!r} is empty")
    missing = sum(1 for t in tasks if not t.answer)
    if missing:
        log.warning("%d problems of %r have no reference answer; answers to them always score 0", missing, stem)
    return tuple(tasks)


def _jsonable(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool)) or v is None


def _fingerprint(name: str, tasks: tuple[MathTask, ...]) -> str:
    h = hashlib.sha1()
    for t in tasks:
        h.update(f"{t.id}\0{t.problem}\0{t.answer}\0".encode())
    return f"math:{name}:{len(tasks)}:{h.hexdigest()[:12]}"


def load_dataset(dataset: str | Path | None = None, limit: int | None = None) -> TaskSet:
    """The default embedded set (``None`` / ``"default"``) or a DeepScaleR-format file."""
    if dataset is None or str(dataset) == DEFAULT_DATASET:
        text = resources.files("trace_gym.corpora").joinpath("math_default.jsonl").read_text("utf-8")
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        name = DEFAULT_DATASET
    else:
        records = load_records(dataset)
        name = Path(dataset).name
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit}")
        records = records[:limit]
    tasks = _to_tasks(records, Path(name).stem.split(".")[0])
    return TaskSet(name, tasks, _fingerprint(name, tasks))
