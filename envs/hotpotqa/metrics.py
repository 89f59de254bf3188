"""HotpotQA answer metrics: the official normalisation, exact match and token F1.

Ported from the official evaluation script (``hotpot_evaluate_v1.py``): lower-case,
drop punctuation and the articles a/an/the, collapse whitespace. F1 gives 0 when
either side is yes/no/noanswer and the two differ, as the official script does.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import NamedTuple

__all__ = ["AnswerScore", "exact_match", "f1_score", "normalize_answer", "score_answer"]

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    """The official HotpotQA/SQuAD answer normalisation."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> bool:
    """Exact match after normalisation."""
    return normalize_answer(prediction) == normalize_answer(gold)


class AnswerScore(NamedTuple):
    """F1 with its precision and recall (token level, after normalisation)."""

    f1: float
    precision: float
    recall: float


def f1_score(prediction: str, gold: str) -> AnswerScore:
    """Token-level F1 as in the official script (yes/no/noanswer must match exactly)."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if (p in _SPECIAL or g in _SPECIAL) and p != g:
        return AnswerScore(0.0, 0.0, 0.0)
    pt, gt = p.split(), g.split()
    common = Counter(pt) & Counter(gt)
    same = sum(common.values())
    if same == 0:
        return AnswerScore(0.0, 0.0, 0.0)
    precision, recall = same / len(pt), same / len(gt)
    return AnswerScore(2 * precision * recall / (precision + recall), precision, recall)


def score_answer(prediction: str, gold: str) -> dict[str, float]:
    """EM and F1 as a JSON-friendly dict (what the env puts in info)."""
    f1 = f1_score(prediction, gold)
    return {
        "em": float(exact_match(prediction, gold)),
        "f1": round(f1.f1, 6),
        "precision": round(f1.precision, 6),
        "recall": round(f1.recall, 6),
    }
