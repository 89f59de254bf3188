"""The two records of the HotpotQA env: a retrievable `Passage` and a `QATask`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Passage", "QATask"]


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
    #: further accepted answers (FlashRAG's `golden_answers` after the first)
    aliases: tuple[str, ...] = ()

    @property
    def answers(self) -> tuple[str, ...]:
        """Every accepted answer: `answer` first, then the aliases."""
        return (self.answer, *self.aliases)

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
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "type": self.type,
            "level": self.level,
            "supporting_facts": [list(f) for f in self.supporting_facts],
            "supporting_titles": list(self.supporting_titles),
            "template": self.template,
            "aliases": list(self.aliases),
        }

    def to_record(self) -> dict[str, Any]:
        """The task in the original HotpotQA layout (what `trace-gym data convert` writes)."""
        rec: dict[str, Any] = {
            "_id": self.id,
            "question": self.question,
            "answer": self.answer,
            "type": self.type,
            "level": self.level,
            "supporting_facts": [list(f) for f in self.supporting_facts],
            "context": [[t, list(s)] for t, s in self.context],
        }
        if self.aliases:
            rec["answer_aliases"] = list(self.aliases)
        if self.template:
            rec["template"] = self.template
        return rec
