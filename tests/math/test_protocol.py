"""Parsing assistant turns and wrapping interpreter output."""

from __future__ import annotations

import pytest
from trace_gym.envs.math._proc import REFUSED, Malformed, decode, reply_schema
from trace_gym.envs.math.protocol import extract_boxed, format_cell, parse_action


@pytest.mark.parametrize(
    "text,kind,code,answer",
    [
        ("```python\nx = 1\n```", "code", "x = 1", None),
        ("Let me see.\n```py\nprint(2)\n```\nthen more", "code", "print(2)", None),
        ("<python>\nimport math\nmath.pi\n</python>", "code", "import math\nmath.pi", None),
        ("The answer is \\boxed{\\frac{1}{2}}.", "answer", None, "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}} and \\boxed{3}", "answer", None, "3"),
        ("<answer> 42 </answer>", "answer", None, "42"),
        ("```python\nx = 2\n```\nSo \\boxed{4}", "answer", None, "4"),
        (
            "Guess \\boxed{4}, let me check:\n```python\nprint(2 + 2)\n```",
            "code",
            "print(2 + 2)",
            None,
        ),
        ("no action here", "invalid", None, None),
        ("```\nprint(1)\n```", "invalid", None, None),
        ("\\boxed{unbalanced", "invalid", None, None),
    ],
)
def test_parse_action(text, kind, code, answer):
    parsed = parse_action(text)
    assert (parsed.kind, parsed.code, parsed.answer) == (kind, code, answer)


def test_nested_braces_in_boxed():
    assert extract_boxed("x \\boxed{\\frac{a}{b^{2}}} y") == ("\\frac{a}{b^{2}}", 2)


def test_output_truncation_marker_and_limits():
    obs = format_cell("ok", "abc", 1003, None, timeout_s=5, cpu_s=5)
    assert obs == "```output\nabc\n... [output truncated: 1000 more characters not shown]\n```"
    assert "(no output)" in format_cell("ok", "", 0, None, timeout_s=5, cpu_s=5)
    assert "longer than 5 s" in format_cell("timeout", "", 0, None, timeout_s=5, cpu_s=5)
    assert "died" in format_cell("crashed", "", 0, None, timeout_s=5, cpu_s=5)


def _reference_parse(text):
    """The regex parser this module used before it was made linear (for equivalence)."""
    import re

    fenced = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)```", re.S | re.I)
    tagged = re.compile(r"<python>(.*?)</python>", re.S | re.I)
    answer_tag = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
    boxed_re = re.compile(r"\\(?:boxed|fbox)\s*\{")
    blocks = sorted(
        [(m.start(), m.end(), m.group(1)) for m in fenced.finditer(text)]
        + [(m.start(), m.end(), m.group(1)) for m in tagged.finditer(text)]
    )
    answer_at, answer = -1, None
    tags = list(answer_tag.finditer(text))
    if tags:
        answer_at, answer = tags[-1].start(), tags[-1].group(1).strip()
    found = None
    for m in boxed_re.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found = (text[m.end() : i - 1].strip(), m.start())
    if found is not None and found[1] > answer_at:
        answer, answer_at = found
    if blocks and (answer is None or answer_at < blocks[-1][1]):
        return ("code", blocks[0][2].strip("\n"), None, len(blocks))
    if answer is not None:
        return ("answer", None, answer, len(blocks))
    return ("invalid", None, None, 0)


def test_linear_parser_matches_the_regex_parser_on_random_text():
    import random

    from trace_gym.envs.math.protocol import parse_action

    pieces = [
        "\\boxed{",
        "\\fbox {",
        "{",
        "}",
        "```python\n",
        "```py \n",
        "```",
        "<python>",
        "</python>",
        "<PYTHON>",
        "<answer>",
        "</answer>",
        "x = 1\n",
        "42",
        " ",
        "\n",
    ]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        got = parse_action(text)
        assert (got.kind, got.code, got.answer, got.code_blocks) == _reference_parse(text), text


def test_a_flood_of_unclosed_openers_is_parsed_in_linear_time():
    from trace_gym.envs.math.protocol import parse_action

    # 200k characters of openers: the old parser took minutes here; this must finish at once
    # (no timing assertion: a quadratic parser would simply not finish within the test timeout)
    for opener, kind in (
        ("\\boxed{", "invalid"),
        ("<python>", "invalid"),
        ("<answer>", "invalid"),
        ("```python\n", "code"),
    ):  # each fence closes the one before
        assert parse_action(opener * (200_000 // len(opener))).kind == kind


# ----------------------------------------------------------------------------- host-side decoding
REPLY = (
    b'{"output": "hi\\n", "total_chars": 3, "error": null, "threads": 0, "limit": null, "seq": 7}'
)


@pytest.mark.parametrize(
    "data",
    [
        b'{"output": ' + b"[" * 100_000 + b"]" * 100_000 + b', "seq": 7}',
        REPLY.replace(b'"total_chars": 3', b'"total_chars": Infinity'),
        REPLY.replace(b'"threads": 0', b'"threads": 1e400'),
        REPLY.replace(b'"threads": 0', b'"threads": NaN'),
        REPLY.replace(b'"threads": 0', b'"threads": 2.0'),
        REPLY.replace(b'"threads": 0', b'"threads": true'),
        REPLY.replace(b'"total_chars": 3', b'"total_chars": 1'),  # fewer than the output has
        REPLY.replace(b'"hi\\n"', b'"' + b"A" * 4001 + b'"'),  # over max_output_chars
        REPLY.replace(b'"seq": 7', b'"seq": 7, "pid": 1'),
        REPLY.replace(b'"limit": null', b'"limit": "memory"'),
        b'{"output": "x"}',
        b"[1, 2]",
        b"\xff\xfe",
        b" " * (5 << 20),
    ],
    ids=lambda d: d[:24].decode("latin-1"),
)
def test_every_malformed_reply_is_refused(data):
    with pytest.raises(Malformed):
        decode(data, (reply_schema(4000), REFUSED))


def test_a_valid_reply_decodes():
    assert decode(REPLY, (reply_schema(4000), REFUSED))["output"] == "hi\n"
    assert decode(b'{"refused": "why", "seq": 1}', (reply_schema(4000), REFUSED))["seq"] == 1
