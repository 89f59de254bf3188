"""Parsing assistant turns and wrapping interpreter output."""

from __future__ import annotations

import pytest
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
        ("Guess \\boxed{4}, let me check:\n```python\nprint(2 + 2)\n```", "code", "print(2 + 2)", None),
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
