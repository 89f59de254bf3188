"""Scripted HotpotQA policies: reference behaviour for tests, benchmarks and the demo.

- `next_action(question, observations)`: a *text-only* two-hop searcher for the bundled
  set. It reads the question (whose templates `trace_gym.corpora.build_hotpotqa`
  defines), searches the first-hop entity, reads the bridge entity out of the retrieved
  passage, searches it, and reads the answer out of that passage (for comparisons: both
  entities, then compares). It sees only what an agent sees, so when retrieval misses,
  it misses: its EM measures the retriever, not a lookup of the gold answer.
- `oracle_next_action(task, observations)`: for real HotpotQA (no templates to parse).
  Searches the question, then each gold paragraph title not yet retrieved (a missed
  title once more with the question added, never the same query twice), and answers
  the gold answer only if the retrieved passages contain it (yes/no: if every gold
  paragraph was retrieved), else the title of the first retrieved passage. Its EM is an
  upper bound for a reader given this retriever.
- `no_search_action(question)`: answers at once with a guess from the question (the
  first option of a comparison, else the question's last capitalised phrase): the
  baseline showing the bundled set needs retrieval.

All three are pure functions of what they are given, so the agents package can wrap
them as a `Policy` over `Conversation`s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from trace_gym.envs.hotpotqa.data import QATask
from trace_gym.envs.hotpotqa.metrics import normalize_answer

__all__ = [
    "next_action",
    "no_search_action",
    "oracle_next_action",
    "parse_documents",
    "question_from_prompt",
]

_DOC_START = re.compile(r"(?:^|\n)Doc \d+\(Title: ")
_QUESTION = re.compile(r"Question:\s*(?P<q>.*?)\s*$", re.S)
_GIVE_UP = 5

#: bridge template -> (pattern for the bridge entity in hop 1, pattern for the answer in hop 2, answer suffix)
_BRIDGE_READ = {
    "film_director_birthplace": (r"directed by (?P<x>[^.]+)\.", r"was born in (?P<x>[^.]+)\.", ""),
    "film_director_birthyear": (r"directed by (?P<x>[^.]+)\.", r"\(born (?P<x>\d{4})\)", ""),
    "company_founder_birthplace": (r"founded by (?P<x>[^.]+)\.", r"was born in (?P<x>[^.]+)\.", ""),
    "band_singer_birthyear": (r"lead singer is (?P<x>[^.]+)\.", r"\(born (?P<x>\d{4})\)", ""),
    "person_birthplace_river": (
        r"was born in (?P<x>[^.]+)\.",
        r"banks of the (?P<x>.+?) River\.",
        " River",
    ),
    "company_hq_province": (
        r"headquarters are in (?P<x>[^.]+)\.",
        r"province of (?P<x>[^.]+)\.",
        "",
    ),
    "film_location_founded": (r"was shot in (?P<x>[^.]+)\.", r"was founded in (?P<x>\d{4})\.", ""),
    "band_origin_province": (
        r"was formed in (?P<x>.+?) in \d{4}\.",
        r"province of (?P<x>[^.]+)\.",
        "",
    ),
}
#: comparison template -> (pattern for the compared number, True when the smaller wins)
_COMPARE_READ = {
    "person_born_first": (r"\(born (?P<x>\d{4})\)", True),
    "town_larger_population": (r"population of (?P<x>\d+)", False),
    "film_released_first": (r"is an? (?P<x>\d{4}) ", True),
    "company_founded_first": (r"founded in (?P<x>\d{4})", True),
}


@lru_cache(maxsize=1)
def _question_patterns() -> list[tuple[str, str, re.Pattern]]:
    from trace_gym.corpora.build_hotpotqa import BRIDGE_TEMPLATES, COMPARISON_TEMPLATES

    out = []
    for kind, tpl in BRIDGE_TEMPLATES.items():
        rx = re.escape(tpl).replace(re.escape("{e}"), "(?P<e>.+?)")
        out.append(("bridge", kind, re.compile(f"^{rx}$")))
    for kind, tpl in COMPARISON_TEMPLATES.items():
        rx = (
            re.escape(tpl)
            .replace(re.escape("{a}"), "(?P<a>.+?)")
            .replace(re.escape("{b}"), "(?P<b>.+?)")
        )
        out.append(("comparison", kind, re.compile(f"^{rx}$")))
    return out


def question_from_prompt(prompt: str) -> str:
    """The question inside a Search-R1 prompt (the text after 'Question:')."""
    m = _QUESTION.search(prompt)
    return m.group("q") if m else prompt.strip()


def _split_title(part: str) -> tuple[str, str]:
    """'Title) text' -> (title, text); the title ends at its first unbalanced ')'.

    Titles may hold parentheses and ") " ("The Five(ish) Doctors Reboot"), so the first
    ") " is not the end; a title with an unbalanced '(' falls back to the first ") ".
    """
    depth = 0
    for i, ch in enumerate(part):
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                return part[:i], part[i + 1 :].removeprefix(" ")
            depth -= 1
    title, _, text = part.partition(") ")
    return title, text


def parse_documents(observations: Sequence[str]) -> dict[str, str]:
    """title -> text of every passage in the `<information>` blocks seen so far."""
    docs: dict[str, str] = {}
    for obs in observations:
        for block in re.findall(r"<information>(.*?)</information>", obs, re.S):
            for part in _DOC_START.split(block)[1:]:
                title, text = _split_title(part)
                docs.setdefault(title.strip(), text.strip())
    return docs


def _search(query: str) -> str:
    return f"<think>I need to look up {query}.</think>\n<search>{query}</search>"


def _answer(text: str) -> str:
    return f"<think>I have what I need.</think>\n<answer>{text}</answer>"


def _read(docs: dict[str, str], title: str, pattern: str) -> str | None:
    text = docs.get(title)
    m = re.search(pattern, text) if text else None
    return m.group("x").strip() if m else None


def _lookup(entity: str, attempts: int, question: str) -> str:
    # first try the bare name; if that missed, add the question's context words
    return _search(entity if attempts == 0 else f"{entity} {question}")


def next_action(question: str, observations: Sequence[str]) -> str:
    """The scripted two-hop searcher's next turn on a bundled-set question."""
    docs = parse_documents(observations)
    searches = len(observations)
    for qtype, kind, rx in _question_patterns():
        m = rx.match(question.strip())
        if not m:
            continue
        if qtype == "bridge":
            hop1, hop2, suffix = _BRIDGE_READ[kind]
            entity = m.group("e")
            bridge = _read(docs, entity, hop1)
            if bridge is None:
                return (
                    _lookup(entity, searches, question)
                    if searches < _GIVE_UP
                    else _answer("unknown")
                )
            answer = _read(docs, bridge, hop2)
            if answer is None:
                return (
                    _lookup(bridge, searches - 1, question)
                    if searches < _GIVE_UP
                    else _answer(bridge)
                )
            return _answer(answer + suffix)
        pattern, smaller = _COMPARE_READ[kind]
        a, b = m.group("a"), m.group("b")
        va, vb = _read(docs, a, pattern), _read(docs, b, pattern)
        if searches >= _GIVE_UP:
            return _answer(a)
        if va is None:
            return _lookup(a, searches, question)
        if vb is None:
            return _lookup(b, 0 if searches <= 1 else 1, question)
        a_wins = (int(va) < int(vb)) == smaller
        return _answer(a if a_wins else b)
    # not a bundled template: search once with the question, then give up
    return _search(question) if not observations else _answer(next(iter(docs), "unknown"))


def _next_query(task: QATask, observations: Sequence[str], asked: set[str | None]) -> str | None:
    if not observations:
        return task.question
    docs = parse_documents(observations)
    missing = [t for t in task.supporting_titles if t not in docs]
    if not missing or len(observations) > 2 * len(task.supporting_titles):
        return None
    fresh = [q for t in missing for q in (t, f"{t} {task.question}") if q not in asked]
    return fresh[0] if fresh else None


def _oracle_query(task: QATask, observations: Sequence[str]) -> str | None:
    """The oracle's next query, or None when it should answer now."""
    # the oracle is a pure function of the observations: replay it to know what it already asked
    asked: set[str | None] = set()
    for i in range(len(observations)):
        asked.add(_next_query(task, observations[:i], asked))
    return _next_query(task, observations, asked)


def oracle_next_action(task: QATask, observations: Sequence[str]) -> str:
    """An oracle-guided searcher for real HotpotQA (see the module docstring).

    A search that missed its gold paragraph is not repeated word for word: the oracle
    retries with the title plus the question, then moves on.
    """
    query = _oracle_query(task, observations)
    if query is not None:
        return _search(query)
    docs = parse_documents(observations)
    missing = [t for t in task.supporting_titles if t not in docs]
    gold = normalize_answer(task.answer)
    if gold in ("yes", "no"):
        found = not missing
    else:
        found = bool(gold) and any(gold in normalize_answer(f"{t} {x}") for t, x in docs.items())
    return _answer(task.answer if found else next(iter(docs), "unknown"))


def no_search_action(question: str) -> str:
    """Answer immediately with a guess taken from the question alone."""
    m = re.search(r",\s*(?P<a>.+?) or (?P<b>.+?)\?\s*$", question)
    if m:
        return _answer(m.group("a"))
    caps = re.findall(r"(?:[A-Z][\w'-]*)(?:\s+(?:of\s+)?[A-Z][\w'-]*)*", question)
    return _answer(caps[-1] if caps else "yes")
