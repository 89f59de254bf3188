"""HotpotQA questions and retrieval corpora: loaders for real files and the bundled set.

- `load_hotpotqa(path)`: HotpotQA questions in any layout of
  `trace_gym.envs.hotpotqa.layouts` (the original release, its
  ``[title, [sent_ids], [sentences], doc]`` supporting-facts variant, Hugging Face
  ``hotpot_qa``, FlashRAG / Search-R1), from a JSON list, JSON Lines (.gz ok) or parquet.
- `load_wiki18(path)`: a wiki-18-style JSONL corpus (``{"id", "contents"}`` with
  ``contents = '"Title"\\ntext'``, as used by Search-R1 and FlashRAG), optionally gzipped.
- `context_passages(tasks)`: the distinct context paragraphs of HotpotQA records, a
  local Wikipedia for the distractor setting.
- `load_bundled()`: the bundled HotpotQA-format set about fictional entities (see
  `trace_gym.corpora.build_hotpotqa`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trace_gym.envs.hotpotqa.layouts import RecordError, record_to_task
from trace_gym.envs.hotpotqa.task import Passage, QATask

from trace_gym.errors import ConfigError, DependencyNotInstalled

__all__ = [
    "Passage",
    "QATask",
    "context_passages",
    "corpus_fingerprint",
    "iter_jsonl",
    "load_bundled",
    "load_hotpotqa",
    "load_wiki18",
    "open_text",
    "passage_from_contents",
]


def open_text(path: Path) -> io.TextIOBase:
    """`path` opened for reading UTF-8 text, through gzip when it ends in ``.gz``."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_jsonl(path: str | Path, with_lines: bool = False) -> Iterator[Any]:
    """Rows of a (possibly gzipped) JSON Lines file, skipping blank lines.

    With `with_lines`, yields (line number, row) pairs.
    """
    path = Path(path)
    lineno = 0
    try:
        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    row = json.loads(line)
                    yield (lineno, row) if with_lines else row
    except (json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(
            f"{path}:{lineno} is not valid JSON ({e}); expected one object per line"
        ) from e
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise ConfigError(
            f"{path}:{lineno + 1} cannot be read as UTF-8 text ({type(e).__name__}: {e})"
        ) from e


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(position label, record) pairs of a JSON list, JSON Lines or parquet file."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise DependencyNotInstalled(
                "pyarrow (to read parquet)", 'pip install "trace-gym[dev]" or pip install pyarrow'
            ) from e
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises its own ArrowInvalid / OSError family
            raise ConfigError(f"{path} is not a readable parquet file ({e})") from e
        for i, r in enumerate(table.to_pylist(), 1):
            yield f"record {i}", r
        return
    try:
        with open_text(path) as f:
            head = f.read(1)
            while head and head.isspace():
                head = f.read(1)
        if head == "[":
            with open_text(path) as f:
                rows = json.load(f)
            for i, r in enumerate(rows, 1):
                yield f"record {i}", r
            return
    except (UnicodeDecodeError, OSError, EOFError, RecursionError) as e:
        raise ConfigError(f"{path} cannot be read as UTF-8 JSON ({type(e).__name__}: {e})") from e
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path} is not valid JSON ({e}); expected a list of HotpotQA records"
        ) from e
    for i, r in enumerate(iter_jsonl(path, with_lines=True)):
        yield f"line {r[0]} (record {i + 1})", r[1]


def _task(path: Path, where: str, r: Any) -> QATask:
    try:
        return record_to_task(r)
    except RecordError as e:
        keys = ", ".join(sorted(map(str, r))) if isinstance(r, dict) else type(r).__name__
        raise ConfigError(
            f"{path}: {where}: not a HotpotQA record: field {e.field!r}: {e}; keys present: {keys}. Expected one of "
            "the layouts original HotpotQA (_id, question, answer, supporting_facts, context), Hugging Face hotpot_qa "
            "(id, question, answer, context{title, sentences}) or FlashRAG (id, question, golden_answers)"
        ) from e


def load_hotpotqa(path: str | Path, limit: int | None = None) -> list[QATask]:
    """Load HotpotQA questions in any supported layout from JSON, JSON Lines (.gz ok) or parquet."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"HotpotQA file {path} does not exist; pass the path of hotpot_dev_distractor_v1.json or similar"
        )
    tasks = []
    for where, r in _rows(path):
        tasks.append(_task(path, where, r))
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise ConfigError(f"{path} holds no HotpotQA records")
    return tasks


def passage_from_contents(pid: str, contents: str) -> Passage:
    """Split wiki-18 `contents` ('"Title"\\ntext') into a `Passage`."""
    first, _, rest = contents.partition("\n")
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return Passage(str(pid), title, rest)


def load_wiki18(path: str | Path, limit: int | None = None) -> list[Passage]:
    """Load a wiki-18-style JSONL corpus (``{"id", "contents"}`` per line; .gz ok)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"corpus file {path} does not exist; pass a wiki-18-style JSONL file")
    out = []
    for r in iter_jsonl(path):
        if not isinstance(r, dict) or "contents" not in r:
            keys = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise ConfigError(
                f"{path}: row {len(out) + 1} has no 'contents' (keys present: {keys}); "
                "expected {'id', 'contents'} rows"
            )
        out.append(passage_from_contents(str(r.get("id", len(out))), str(r["contents"])))
        if limit is not None and len(out) >= limit:
            break
    return out


def context_passages(tasks: Sequence[QATask], prefix: str = "ctx") -> list[Passage]:
    """The distinct context paragraphs of `tasks` (first occurrence of each title wins)."""
    seen: dict[str, Passage] = {}
    for t in tasks:
        for title, sents in t.context:
            if title not in seen:
                seen[title] = Passage(f"{prefix}-{len(seen):07d}", title, "".join(sents).strip())
    return list(seen.values())


def corpus_fingerprint(passages: Sequence[Passage]) -> str:
    """A short hash of a corpus (ids and contents), used to key cached indexes."""
    h = hashlib.sha1()
    for p in passages:
        h.update(p.id.encode())
        h.update(b"\0")
        h.update(p.contents.encode())
        h.update(b"\1")
    return h.hexdigest()[:16]


def bundled_paths() -> tuple[Path, Path]:
    """The bundled question and corpus files (package data of trace_gym.corpora)."""
    from trace_gym.corpora import build_hotpotqa

    return build_hotpotqa.QUESTIONS_FILE, build_hotpotqa.CORPUS_FILE


def load_bundled() -> tuple[list[QATask], list[Passage]]:
    """The bundled HotpotQA-format questions and their 3,100-passage corpus."""
    qpath, cpath = bundled_paths()
    if not qpath.exists() or not cpath.exists():
        raise ConfigError(
            f"bundled HotpotQA-format files are missing ({qpath.name}); regenerate them with "
            "`python -m trace_gym.corpora.build_hotpotqa`"
        )
    return load_hotpotqa(qpath), load_wiki18(cpath)
