"""The Search-R1 text protocol: the prompt, action parsing and the observation format.

An assistant turn holds exactly one action block (``<think>`` blocks are ignored):

- ``<search>query</search>``: the env answers ``<information>Doc 1(Title: T) text ...
  </information>``, formatted as Search-R1's ``_passages2string``;
- ``<answer>text</answer>``: ends the episode.

Anything else (no block, an unclosed tag, an empty or huge query, both a search and an
answer) is answered with a short hint starting with Search-R1's "My previous action is
invalid." plus what exactly was wrong, and the episode goes on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from trace_gym.envs.hotpotqa.retrievers import Hit

__all__ = [
    "Action",
    "PROMPT_TEMPLATE",
    "format_information",
    "invalid_observation",
    "make_prompt",
    "parse_action",
]

#: Search-R1's instruction prompt (its `make_prefix` for instruct models)
PROMPT_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S | re.I)
_TAG = re.compile(r"<(/?)(search|answer)>", re.I)
_HINT = (
    "My previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again."
)


class Action(NamedTuple):
    """A parsed assistant turn."""

    #: "search", "answer" or "invalid"
    kind: str
    #: the query or the answer text (stripped); "" for invalid
    content: str = ""
    #: for invalid actions: what was wrong (a short machine-readable code)
    error: str = ""
    #: for invalid actions: a human-readable explanation
    detail: str = ""


def make_prompt(question: str) -> str:
    """The first observation of an episode."""
    return PROMPT_TEMPLATE.format(question=question.strip())


def _blocks(body: str) -> tuple[list[tuple[str, str]], list[tuple[bool, str]]]:
    """The ``<kind>...</kind>`` blocks of `body`, and every tag seen, in one linear pass.

    Same result as ``re.finditer(r"<(search|answer)>(.*?)</\\1>", body, re.S | re.I)`` (an
    opening tag without a later closing tag of its kind is skipped), but that regex
    rescans the rest of the text from every unclosed opening tag: quadratic time.
    """
    tags = [
        (m.start(), m.end(), m.group(1) == "/", m.group(2).lower()) for m in _TAG.finditer(body)
    ]
    # next_close[i]: index of the first closing tag of tags[i]'s kind after i (one backward pass)
    next_close: list[int | None] = [None] * len(tags)
    upcoming: dict[str, int | None] = {"search": None, "answer": None}
    for i in range(len(tags) - 1, -1, -1):
        next_close[i] = upcoming[tags[i][3]]
        if tags[i][2]:
            upcoming[tags[i][3]] = i
    blocks, cursor = [], 0
    for i, (start, end, closing, kind) in enumerate(tags):
        j = next_close[i]
        if closing or start < cursor or j is None:
            continue
        blocks.append((kind, body[end : tags[j][0]].strip()))
        cursor = tags[j][1]
    return blocks, [(closing, kind) for _, _, closing, kind in tags]


def parse_action(text: str, max_query_chars: int = 512) -> Action:
    """Parse one assistant turn into a search, an answer, or an invalid action with a reason.

    Runs in linear time. The length cap is the core's: `TraceEnv.step` answers a turn over
    the env's ``max_action_chars`` before it reaches the parser.
    """
    body = _THINK.sub(" ", text)
    blocks, tags = _blocks(body)
    kinds = {k for k, _ in blocks}
    if len(kinds) > 1:
        return Action(
            "invalid",
            error="both_tags",
            detail="The turn holds both <search> and <answer>; send one action per turn.",
        )
    if not blocks:
        opened = next((kind for closing, kind in tags if not closing), None)
        if opened:
            return Action(
                "invalid",
                error="unclosed_tag",
                detail=f"The <{opened}> tag is not closed; end it with </{opened}>.",
            )
        if tags:
            return Action(
                "invalid", error="unopened_tag", detail="A closing tag has no matching opening tag."
            )
        return Action(
            "invalid", error="no_action", detail="The turn holds no <search> or <answer> block."
        )
    kind, content = blocks[0]
    if kind == "search":
        if not content:
            return Action(
                "invalid",
                error="empty_query",
                detail="The search query is empty; put words between the tags.",
            )
        if len(content) > max_query_chars:
            return Action(
                "invalid",
                error="query_too_long",
                detail=f"The search query has {len(content)} characters; keep it under {max_query_chars}.",
            )
        return Action("search", " ".join(content.split()))
    if not content:
        return Action(
            "invalid",
            error="empty_answer",
            detail="The answer is empty; put the answer between the tags.",
        )
    return Action("answer", content)


def invalid_observation(action: Action) -> str:
    """What the agent reads after an invalid turn (Search-R1's hint plus the reason)."""
    return f"{_HINT} ({action.detail})"


def format_information(hits: Sequence[Hit]) -> str:
    """Search-R1's `<information>` block: one ``Doc i(Title: T) text`` line per hit.

    Without Search-R1's surrounding blank lines: they joined the block to the model's
    text in one stream, here it is a message of its own (a chat template separates it).
    """
    lines = [f"Doc {i + 1}(Title: {h.passage.title}) {h.passage.text}" for i, h in enumerate(hits)]
    body = "\n".join(lines) if lines else "No results."
    return f"<information>{body}</information>"
