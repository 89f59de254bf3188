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

# Every block is found in linear time (an action may be a flood of unclosed openers): an
# opener's block ends at the first closer after it, as a non-greedy regex would match.
_FENCED = (re.compile(r"```(?:python|py|python3)[ \t]*\n", re.I), re.compile(r"```"))
_TAGGED = (re.compile(r"<python>", re.I), re.compile(r"</python>", re.I))
_ANSWER_TAG = (re.compile(r"<answer>", re.I), re.compile(r"</answer>", re.I))
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")

FORMAT_HINT = (
    "I found no code and no final answer in your message. To run Python, put the code in a "
    "```python ... ``` block (or <python>...</python>); the output comes back in the next "
    "message. To finish, write the final answer as \\boxed{...}."
)


class ParsedAction(NamedTuple):
    """What an assistant turn asks for."""

    #: 'code', 'answer' or 'invalid'
    kind: str
    code: str | None
    answer: str | None
    #: how many code blocks the turn contained (only the first is run)
    code_blocks: int


def _blocks(text: str, pair: tuple[re.Pattern[str], re.Pattern[str]]) -> list[tuple[int, int, str]]:
    """(start, end, body) of each non-overlapping ``opener body closer`` block, in order."""
    opener, closer = pair
    out, pos = [], 0
    while (o := opener.search(text, pos)) is not None:
        c = closer.search(text, o.end())
        if c is None:  # no closer after this opener, so none after any later one
            break
        out.append((o.start(), c.end(), text[o.end() : c.start()]))
        pos = c.end()
    return out


def extract_boxed(text: str) -> tuple[str, int] | None:
    """The content of the last ``\\boxed{...}`` (balanced braces) and where it starts.

    One pass with a stack of open braces: a boxed group ends where its own brace is
    matched, exactly as counting depth from each opener would find, in linear time.
    """
    starts = {m.end() - 1: m.start() for m in _BOXED.finditer(text)}
    if not starts:
        return None
    found, stack = None, []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            j = stack.pop()
            if j in starts and (found is None or starts[j] > found[1]):
                found = (text[j + 1 : i].strip(), starts[j])
    return found


def parse_action(text: str) -> ParsedAction:
    """Split an assistant turn into a code cell, a final answer, or neither."""
    blocks = sorted(_blocks(text, _FENCED) + _blocks(text, _TAGGED))
    answer_at, answer = -1, None
    tags = _blocks(text, _ANSWER_TAG)
    if tags:
        answer_at, answer = tags[-1][0], tags[-1][2].strip()
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


def format_cell(
    status: str, output: str, total_chars: int, error: str | None, *, timeout_s: float, cpu_s: float
) -> str:
    """The observation for one executed cell: output, truncation marker, error or limit."""
    parts = []
    if output:
        text = output.rstrip("\n")
        if total_chars > len(output):
            text += (
                f"\n... [output truncated: {total_chars - len(output)} more characters not shown]"
            )
        parts.append(text)
    if error:
        parts.append(error.rstrip("\n"))
    if status == "timeout" and error:  # the CPU limit stopped it: the error already says so
        parts.append("The interpreter state was rolled back to what it was before this cell.")
    elif status == "timeout":
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
    elif status == "compromised":
        parts.append(
            "SandboxViolation: the interpreter sent the env a message outside its protocol (the cell "
            "wrote into the env's channel), so nothing it reported is shown. The sandbox was "
            "restarted and the interpreter state rolled back to what it was before this cell."
        )
    body = "\n".join(parts) if parts else "(no output)"
    return f"```output\n{body}\n```"
