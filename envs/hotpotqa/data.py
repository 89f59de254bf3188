"""HotpotQA questions and retrieval corpora: loaders for real files and the bundled set.

- `load_hotpotqa(path)`: the original HotpotQA train/dev JSON (a list of records; the
  distractor and fullwiki files share this format) or JSON Lines, optionally gzipped.
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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError

__all__ = [
    "Passage",
    "QATask",
    "context_passages",
    "corpus_fingerprint",
    "iter_jsonl",
    "load_bundled",
    "load_hotpotqa",
    "load_wiki18",
    "passage_from_contents",
]


@dataclass(frozen=True)
class Passage:
    """One retrievable passage (a Wikipedia paragraph)."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """The wiki-18 / Search-R1 `contents` field: quoted title line, then the text."""
        return f'"{self.title}"\n{self.text}'

    def to_row(self) -> dict[str, str]:
        return {"id": self.id, "contents": self.contents}


@dataclass(frozen=True)
class QATask:
    """One HotpotQA question with its gold answer and supporting facts."""

    id: str
    question: str
    answer: str
    type: str = ""
    level: str = ""
    #: (paragraph title, sentence index) pairs, as in the original `supporting_facts`
    supporting_facts: tuple[tuple[str, int], ...] = ()
    #: (title, sentences) pairs of the distractor/fullwiki context
    context: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: the generator template for bundled questions ("" for real HotpotQA)
    template: str = ""

    @property
    def supporting_titles(self) -> tuple[str, ...]:
        """The gold paragraphs' titles, in first-mention order."""
        return tuple(dict.fromkeys(t for t, _ in self.supporting_facts))

    def supporting_sentences(self) -> list[str]:
        """The text of each supporting fact (where the context holds it)."""
        ctx = dict(self.context)
        return [ctx[t][i].strip() for t, i in self.supporting_facts if t in ctx and i < len(ctx[t])]

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (answer included: use it only after the episode)."""
        return {"id": self.id, "question": self.question, "answer": self.answer, "type": self.type,
                "level": self.level, "supporting_facts": [list(f) for f in self.supporting_facts],
                "supporting_titles": list(self.supporting_titles), "template": self.template}


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Rows of a (possibly gzipped) JSON Lines file, skipping blank lines."""
    path = Path(path)
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{lineno} is not valid JSON ({e}); expected one object per line") from e


def _task(r: dict[str, Any]) -> QATask:
    try:
        return QATask(
            id=str(r["_id"]),
            question=str(r["question"]),
            answer=str(r.get("answer", "")),  # the test sets have no answers
            type=str(r.get("type", "")),
            level=str(r.get("level", "")),
            supporting_facts=tuple((str(t), int(i)) for t, i in r.get("supporting_facts", [])),
            context=tuple((str(t), tuple(str(s) for s in sents)) for t, sents in r.get("context", [])),
            template=str(r.get("template", "")),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(
            f"not a HotpotQA record ({e!r}); expected keys _id, question, answer, supporting_facts, context"
        ) from e


def load_hotpotqa(path: str | Path, limit: int | None = None) -> list[QATask]:
    """Load HotpotQA questions from the original JSON list or from JSON Lines (.gz ok)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"HotpotQA file {path} does not exist; pass the path of hotpot_dev_distractor_v1.json or similar")
    with _open_text(path) as f:
        head = f.read(1)
        while head and head.isspace():
            head = f.read(1)
    if head == "[":
        with _open_text(path) as f:
            rows: Iterable[dict[str, Any]] = json.load(f)
    else:
        rows = iter_jsonl(path)
    tasks = []
    for r in rows:
        tasks.append(_task(r))
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
        if "contents" not in r:
            raise ConfigError(f"{path}: row without 'contents' ({sorted(r)}); expected {{'id', 'contents'}} rows")
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
