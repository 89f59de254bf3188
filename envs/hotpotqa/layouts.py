"""The HotpotQA record layouts users actually have, each read into a `QATask`.

- ``original``: the HotpotQA release (``_id``, ``question``, ``answer``,
  ``supporting_facts: [[title, sent_id], ...]``, ``context: [[title, [sentences]], ...]``).
  The variant whose supporting-fact rows are ``[title, [sent_ids], [sentences], doc]``
  (one row per paragraph, several sentence ids) is read the same way.
- ``hf``: the Hugging Face ``hotpot_qa`` dataset (parquet or JSON): ``id``,
  ``context: {title: [...], sentences: [[...]]}``,
  ``supporting_facts: {title: [...], sent_id: [...]}``.
- ``flashrag``: FlashRAG / Search-R1 JSONL (``id``, ``question``, ``golden_answers``):
  no context, so the env needs ``corpus=`` or a retriever index for these.

`detect_layout` picks the layout from a record's keys; `record_to_task` reads one
record and raises `RecordError` naming the field that is wrong; the loader adds the
file and the record number.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trace_gym.envs.hotpotqa.task import QATask

from trace_gym.errors import TraceGymError

__all__ = ["RecordError", "detect_layout", "record_to_task"]


class RecordError(TraceGymError, ValueError):
    """One record does not fit its layout; `field` names the offending key."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _is_seq(x: Any) -> bool:
    # parquet rows come back as lists; numpy arrays appear when read through pandas
    return (
        isinstance(x, Sequence) and not isinstance(x, (str, bytes)) or type(x).__name__ == "ndarray"
    )


def detect_layout(r: Mapping[str, Any]) -> str:
    """The layout of record `r`; `RecordError` if it is none of them."""
    if "question" not in r:
        raise RecordError("question", "no 'question' field")
    if "golden_answers" in r and "answer" not in r:
        return "flashrag"
    if isinstance(r.get("context"), Mapping) or isinstance(r.get("supporting_facts"), Mapping):
        return "hf"
    if "_id" in r or "id" in r:
        return "original"
    raise RecordError("_id", "no '_id' (original HotpotQA) or 'id' (Hugging Face, FlashRAG) field")


def _facts_original(rows: Any) -> tuple[tuple[str, int], ...]:
    if not _is_seq(rows):
        raise RecordError(
            "supporting_facts",
            f"expected a list of [title, sent_id] rows, got {type(rows).__name__}",
        )
    out: list[tuple[str, int]] = []
    for j, row in enumerate(rows):
        if not _is_seq(row) or len(row) < 2 or not isinstance(row[0], str):
            raise RecordError(
                "supporting_facts",
                f"row {j} is not [title, sent_id] or [title, [sent_ids], ...]: {row!r:.80}",
            )
        ids = (
            row[1] if _is_seq(row[1]) else [row[1]]
        )  # the [title, [sent_ids], [sentences], doc] variant
        for i in ids:
            out.append((row[0], _int(i, "supporting_facts", j)))
    return tuple(out)


def _int(x: Any, field: str, j: int) -> int:
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, str) and re.fullmatch(r"[0-9]{1,9}", x.strip()):
        return int(x)
    raise RecordError(field, f"row {j}: sentence id {x!r:.40} is not an integer")


def _context_original(rows: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not _is_seq(rows):
        raise RecordError(
            "context", f"expected a list of [title, [sentences]] rows, got {type(rows).__name__}"
        )
    out = []
    for j, row in enumerate(rows):
        if not _is_seq(row) or len(row) != 2 or not isinstance(row[0], str) or not _is_seq(row[1]):
            raise RecordError("context", f"row {j} is not [title, [sentences]]: {row!r:.80}")
        out.append((row[0], tuple(str(s) for s in row[1])))
    return tuple(out)


def _columns(d: Any, field: str, a: str, b: str) -> list[tuple[Any, Any]]:
    if not isinstance(d, Mapping) or a not in d or b not in d:
        keys = sorted(d) if isinstance(d, Mapping) else type(d).__name__
        raise RecordError(field, f"expected {{{a!r}: [...], {b!r}: [...]}}, got {keys}")
    if not _is_seq(d[a]) or not _is_seq(d[b]) or len(d[a]) != len(d[b]):
        raise RecordError(field, f"{a!r} and {b!r} must be lists of the same length")
    return list(zip(d[a], d[b], strict=True))


def _hf_fields(r: Mapping[str, Any]) -> dict[str, Any]:
    facts = _columns(
        r.get("supporting_facts", {"title": [], "sent_id": []}),
        "supporting_facts",
        "title",
        "sent_id",
    )
    ctx = _columns(
        r.get("context", {"title": [], "sentences": []}), "context", "title", "sentences"
    )
    for j, (_, sents) in enumerate(ctx):
        if not _is_seq(sents):
            raise RecordError("context", f"sentences[{j}] is not a list of strings")
    return {
        "supporting_facts": tuple(
            (str(t), _int(i, "supporting_facts", j)) for j, (t, i) in enumerate(facts)
        ),
        "context": tuple((str(t), tuple(str(s) for s in sents)) for t, sents in ctx),
    }


def _golden(r: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    g = r["golden_answers"]
    if isinstance(g, str):
        return g, ()
    if not _is_seq(g) or not all(isinstance(a, str) for a in g) or len(g) == 0:
        raise RecordError("golden_answers", f"expected a non-empty list of strings, got {g!r:.80}")
    return g[0], tuple(g[1:])


def record_to_task(r: Any, layout: str | None = None):
    """One record of any layout as a `QATask` (`RecordError` says which field is wrong)."""
    if not isinstance(r, Mapping):
        raise RecordError("(record)", f"expected a JSON object, got {type(r).__name__}")
    layout = layout or detect_layout(r)
    if not isinstance(r["question"], str):
        raise RecordError("question", f"expected a string, got {type(r['question']).__name__}")
    if layout == "flashrag":
        answer, aliases = _golden(r)
        meta = r.get("metadata") if isinstance(r.get("metadata"), Mapping) else {}
        extra: dict[str, Any] = {
            "answer": answer,
            "aliases": aliases,
            "type": str(meta.get("type", "")),
            "level": str(meta.get("level", "")),
        }
    else:
        answer = r.get("answer", "")  # the test sets have no answers
        if not isinstance(answer, str):
            raise RecordError("answer", f"expected a string, got {type(answer).__name__}")
        aliases = r.get("answer_aliases", ())
        if not _is_seq(aliases) or not all(isinstance(a, str) for a in aliases):
            raise RecordError("answer_aliases", "expected a list of strings")
        extra = {
            "answer": answer,
            "aliases": tuple(aliases),
            "type": str(r.get("type", "")),
            "level": str(r.get("level", "")),
        }
        if layout == "hf":
            extra.update(_hf_fields(r))
        else:
            extra["supporting_facts"] = _facts_original(r.get("supporting_facts", []))
            extra["context"] = _context_original(r.get("context", []))
    rid = r.get("_id", r.get("id"))
    if rid is None or isinstance(rid, (dict, list)):
        raise RecordError(
            "_id" if layout == "original" else "id", f"missing or not a scalar: {rid!r:.40}"
        )
    return QATask(id=str(rid), question=r["question"], template=str(r.get("template", "")), **extra)
