"""Math problem sets: the embedded default and DeepScaleR-format files (JSON/JSONL/parquet).

A DeepScaleR-format record has ``problem`` and ``answer`` (and usually ``solution``);
a record whose answer is null or empty is kept (its episodes always score 0, with a warning);
other fields (``id``/``unique_id``, ``year``, ``type``, ``level``, ...) are kept as
metadata.

Reference answers are normalised once, at load time, by one rule (`normalize_answer`):

- a list (the DeepScaleR packaging of Minerva and OlympiadBench: ``["9.6\\n"]``,
  ``["3", "5"]``): one element is that answer; several elements are a **multi-part**
  answer, matched element-wise and in order, unless the problem asks for a set
  (`asks_for_set`: its text says "find all", "all possible values", ... ), when the parts
  match in any order;
- a number: an int stays that int, an integral float is the integer (``142.0`` -> ``142``),
  another float its shortest repr; a string that is an integral decimal (``"142.0"``) is the
  integer; other strings keep their digits (``"033"`` stays, the judge reads it as 33);
- text: surrounding whitespace, newlines, ``$...$`` delimiters, LaTeX spacing commands
  (``\\,``, ``\\ ``, ``~``, ``\\quad``) at either end, ``\\phantom`` placeholders and a
  ``\\boxed{...}`` wrapper are removed; internal runs of whitespace become one space.

The loader warns once per file with the number of records whose answer it changed. A
multi-part answer is a `Reference`: a ``str`` (its parts joined by ``", "``, what a model
would box) that also carries ``parts`` and ``ordered``, so every consumer that reads
``task.answer`` as text keeps working and the verifier sees the parts.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError, DependencyNotInstalled

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DATASET",
    "MathTask",
    "Reference",
    "TaskSet",
    "asks_for_set",
    "load_dataset",
    "load_records",
    "normalize_answer",
]

DEFAULT_DATASET = "default"


class Reference(str):
    """A multi-part reference answer: its parts joined by ", ", plus the parts and their order rule."""

    parts: tuple[str, ...]
    ordered: bool

    def __new__(cls, parts: tuple[str, ...] | list[str], ordered: bool = True) -> Reference:
        self = super().__new__(cls, ", ".join(parts))
        self.parts, self.ordered = tuple(parts), bool(ordered)
        return self

    def __reduce__(self):  # pickles (checkpoints cross processes) as the parts, not the joined text
        return (Reference, (self.parts, self.ordered))

    def __repr__(self) -> str:
        return f"Reference({list(self.parts)!r}, ordered={self.ordered})"


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


# "asks for a set" only when the problem says so in words a set question uses; anything else
# (including "find a and b", "what are x and y") keeps the stricter in-order match
_SET_WORDS = re.compile(
    r"\b(?:find|determine|list|give|compute|enumerate|identify|state|what\s+are)\s+all\b"
    r"|\ball\s+possible\b|\bset\s+of\s+all\b|\ball\s+(?:the\s+)?(?:solutions|roots|zeros)\b",
    re.I,
)
_EDGE_SPACE = re.compile(r"^(?:\s|~|\\[ ,;:!]|\\q?quad\b)+|(?:\s|~|\\[ ,;:!]|\\q?quad\b)+$")
_INTEGRAL_DECIMAL = re.compile(r"([+-]?\d+)\.0+")


def asks_for_set(problem: str) -> bool:
    """Whether a problem asks for a set of answers (its parts then match in any order)."""
    return bool(_SET_WORDS.search(problem))


def _clean_text(answer: str) -> str:
    # \phantom is invisible: "\phantom -1" is the entry 1 (math-verify reads -1 and then rejects both)
    s = re.sub(r"\\phantom\s*(?:\{[^{}]*\}|\S)", "", answer)
    s = re.sub(r"\s+", " ", s).strip()
    while True:
        prev = s
        s = _EDGE_SPACE.sub("", s)
        if len(s) >= 2 and s[0] == s[-1] == "$" and "$" not in s.strip("$"):
            s = s.strip("$").strip()
        s = _unbox(s)
        if s == prev:
            break
    m = _INTEGRAL_DECIMAL.fullmatch(s)
    return str(int(m.group(1))) if m else s


def _scalar(value: Any) -> str:
    if isinstance(value, bool):  # a JSON true/false is text, not 1/0
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if math.isfinite(value) and value.is_integer() else repr(value)
    return _clean_text(str(value))


def normalize_answer(value: Any, problem: str = "") -> str:
    """A record's reference answer under the load-time rule (see the module doc)."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        parts = [p for p in (_scalar(v) for v in value if v is not None) if p]
        if len(parts) <= 1:
            return parts[0] if parts else ""
        return Reference(parts, ordered=not asks_for_set(problem))
    return _scalar(value)


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """The raw records of a JSON list, JSONL (optionally .gz) or parquet file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"math dataset {str(path)!r} does not exist; pass a JSON, JSONL or parquet file path"
        )
    name = path.name.lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise DependencyNotInstalled(
                "pyarrow (to read parquet math datasets)", "pip install pyarrow"
            ) from e
        return pq.read_table(path).to_pylist()
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
        records = _parse_records(text, name)
    except (json.JSONDecodeError, UnicodeDecodeError, gzip.BadGzipFile) as e:
        where = f" (line {e.lineno}, column {e.colno}: {e.msg})" if hasattr(e, "lineno") else ""
        raise ConfigError(
            f"math dataset {str(path)!r} is not JSON, JSONL or parquet{where}; pass a file of "
            "objects with 'problem' and 'answer' fields"
        ) from e
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ConfigError(f"{path}: expected a list of objects with 'problem' and 'answer' fields")
    return records


def _parse_records(text: str, name: str) -> Any:
    """A JSON list, JSONL lines or one JSON object (raises `json.JSONDecodeError`)."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        return json.loads(text)
    if name.endswith((".jsonl", ".jsonl.gz")) or "\n" in stripped:
        lines = text.splitlines()
        out = []
        for i, line in enumerate(lines):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:  # the file's line, not the line's line 1
                    raise json.JSONDecodeError(
                        e.msg, text, sum(map(len, lines[:i])) + i + e.pos
                    ) from e
        return out
    return [json.loads(text)]


def _to_tasks(records: list[dict[str, Any]], stem: str, source: str = "") -> tuple[MathTask, ...]:
    tasks, seen, coerced = [], set(), 0
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
        meta = {
            k: v
            for k, v in rec.items()
            if k not in ("problem", "answer", "solution", "id") and _jsonable(v)
        }
        answer = normalize_answer(rec["answer"], str(rec["problem"]))
        raw = rec["answer"]
        coerced += raw is not None and not (
            isinstance(raw, str) and raw == answer and type(answer) is str
        )
        solution = rec.get("solution") or ""
        if isinstance(solution, list):  # OlympiadBench packages its solutions as a list of strings
            solution = "\n\n".join(str(x) for x in solution)
        tasks.append(MathTask(tid, str(rec["problem"]), answer, str(solution), meta))
    if not tasks:
        raise ConfigError(f"math dataset {stem!r} is empty")
    if coerced:
        log.warning(
            "%s: normalised the reference answers of %d of %d records (lists, numbers, whitespace, "
            "$...$, \\boxed; see docs/math.md, 'Answer normalisation')",
            source or stem,
            coerced,
            len(tasks),
        )
    missing = sum(1 for t in tasks if not t.answer)
    if missing:
        log.warning(
            "%d problems of %r have no reference answer; answers to them always score 0",
            missing,
            stem,
        )
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
        text = (
            resources.files("trace_gym.corpora").joinpath("math_default.jsonl").read_text("utf-8")
        )
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        name = DEFAULT_DATASET
    else:
        records = load_records(dataset)
        name = Path(dataset).name
    source = str(dataset) if dataset is not None else DEFAULT_DATASET
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit}")
        records = records[:limit]
    tasks = _to_tasks(records, Path(name).stem.split(".")[0], source)
    return TaskSet(name, tasks, _fingerprint(name, tasks))
