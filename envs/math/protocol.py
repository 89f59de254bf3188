"""The text protocol of trace/Math-v0: parsing assistant turns and wrapping tool output.

An assistant turn may contain one Python code block (a fenced python block or
``<python>...</python>``), which the env runs, or a final answer in ``\\boxed{...}``
(or ``<answer>...</answer>``), which ends the episode. When a turn has both, the one
that comes last wins: a boxed answer written *after* the code is final, while code
written after a boxed expression is run (the model is still working).
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "FORMAT_HINT",
    "ParsedAction",
    "extract_boxed",
    "format_cell",
    "parse_action",
]

_FENCED = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)```", re.S | re.I)
_TAGGED = re.compile(r"<python>(.*?)</python>", re.S | re.I)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")

FORMAT_HINT = (
    "I found no code and no final answer in your message. To run Python, put the code in a "
    "```python ... ``` block (or <python>...</python>); the output comes back in the next "
    "message. To finish, write the final answer as \\boxed{...}."
)


class ParsedAction(NamedTuple):
    """What an assistant turn asks for."""

    kind: str
    """'code', 'answer' or 'invalid'"""
    code: str | None
    answer: str | None
    code_blocks: int
    """how many code blocks the turn contained (only the first is run)"""


def extract_boxed(text: str) -> tuple[str, int] | None:
    """The content of the last ``\\boxed{...}`` (balanced braces) and where it starts."""
    found = None
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found = (text[m.end() : i - 1].strip(), m.start())
    return found


def parse_action(text: str) -> ParsedAction:
    """Split an assistant turn into a code cell, a final answer, or neither."""
    blocks = sorted(
        [(m.start(), m.end(), m.group(1)) for m in _FENCED.finditer(text)]
        + [(m.start(), m.end(), m.group(1)) for m in _TAGGED.finditer(text)]
    )
    answer_at, answer = -1, None
    tags = list(_ANSWER_TAG.finditer(text))
    if tags:
        answer_at, answer = tags[-1].start(), tags[-1].group(1).strip()
    boxed = extract_boxed(text)
    if boxed is not None and boxed[1] > answer_at:
        answer, answer_at = boxed
    if blocks:
        last_end = blocks[-1][1]
        if answer is None or answer_at < last_end:
            return ParsedAction("code", blocks[0][2].strip("\n"), None, len(blocks))
    if answer is not None:
        return ParsedAction("answer", None, answer, len(blocks))
    return ParsedAction("invalid", None, None, 0)


def format_cell(status: str, output: str, total_chars: int, error: str | None, *, timeout_s: float, cpu_s: float) -> str:
    """The observation for one executed cell: output, truncation marker, error or limit."""
    parts = []
    if output:
        text = output.rstrip("\n")
        if total_chars > len(output):
            text += f"\n... [output truncated: {total_chars - len(output)} more characters not shown]"
        parts.append(text)
    if error:
        parts.append(error.rstrip("\n"))
    if status == "timeout":
        parts.append(
            f"TimeoutError: the cell ran longer than {timeout_s:g} s and was stopped. The interpreter "
            "state was rolled back to what it was before this cell."
        )
    elif status == "crashed":
        parts.append(
            "InterpreterCrash: the Python process died while running this cell (a crash, os._exit, "
            f"a signal, or the {cpu_s:g} s CPU / memory limit). The interpreter state was rolled back "
            "to what it was before this cell."
        )
    body = "\n".join(parts) if parts else "(no output)"
    return f"```output\n{body}\n```"
