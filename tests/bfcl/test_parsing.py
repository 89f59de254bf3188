"""Call parsing: Hermes/Qwen3 tags, OpenAI JSON, BFCL python syntax; literals only."""

from __future__ import annotations

import random
import re

import pytest
from trace_gym.envs.bfcl.parsing import Call, parse_action, parse_python_calls


def test_hermes_blocks_each_give_a_call():
    text = (
        'Let me do that.\n<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call>\n'
        '<tool_call>{"name": "ls", "arguments": "{\\"a\\": true}"}</tool_call>'
    )
    parsed = parse_action(text)
    assert parsed.syntax == "hermes" and not parsed.errors
    assert parsed.calls == (Call("cd", (), {"folder": "document"}), Call("ls", (), {"a": True}))


def test_hermes_unclosed_last_block_and_think_are_handled():
    parsed = parse_action(
        '<think>maybe [rm(x=1)]</think><tool_call>{"name": "pwd", "arguments": {}}'
    )
    assert parsed.calls == (Call("pwd"),)


def test_malformed_hermes_block_is_an_error_next_to_good_ones():
    parsed = parse_action(
        '<tool_call>{"name": "cd", "arguments": {</tool_call><tool_call>{"name": "pwd"}</tool_call>'
    )
    assert parsed.calls == (Call("pwd"),)
    assert len(parsed.errors) == 1 and parsed.errors[0].startswith("Error during execution: ")
    assert not parsed.is_reply


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "mv", "arguments": {"source": "a", "destination": "b"}}',
        '{"type": "function", "function": {"name": "mv", "arguments": "{\\"source\\": \\"a\\", \\"destination\\": \\"b\\"}"}}',
        '{"tool_calls": [{"id": "x", "type": "function", "function": {"name": "mv", "arguments": {"source": "a", "destination": "b"}}}]}',
        '[{"function": "mv", "parameters": {"source": "a", "destination": "b"}}]',
        '```json\n{"name": "mv", "parameters": {"source": "a", "destination": "b"}}\n```',
    ],
)
def test_openai_style_json_shapes(text):
    parsed = parse_action(text)
    assert parsed.syntax == "json" and parsed.calls == (
        Call("mv", (), {"source": "a", "destination": "b"}),
    )


def test_bfcl_python_syntax_with_positional_and_nested_literals():
    parsed = parse_action(
        "[sort('report.pdf'), post_tweet(content=\"hi\", tags=['#a', '#b'], mentions=[])]"
    )
    assert parsed.syntax == "python"
    assert parsed.calls[0] == Call("sort", ("report.pdf",), {})
    assert parsed.calls[1].kwargs == {"content": "hi", "tags": ["#a", "#b"], "mentions": []}
    # BFCL's decoder adds missing brackets
    assert parse_action("cd(folder='x')").calls == (Call("cd", (), {"folder": "x"}),)


@pytest.mark.parametrize(
    "text",
    [
        "[cd(folder=__import__('os').getcwd())]",
        "[cd(folder=x)]",
        "[cd(folder='a' + 'b')]",
        "[cd(**{'folder': 'a'})]",
    ],
)
def test_non_literal_arguments_are_refused_not_evaluated(text):
    parsed = parse_action(text)
    assert not parsed.calls and len(parsed.errors) == 1
    assert parsed.errors[0].startswith("Error during execution: ")


def test_syntax_error_reads_like_pythons():
    parsed = parse_action("[cd(folder='x'")
    assert not parsed.calls and parsed.errors and "Error during execution: " in parsed.errors[0]


@pytest.mark.parametrize(
    "text",
    [
        "Done, the file is moved.",
        "",
        "   ",
        "[]",
        "I cannot do that (no such function).",
        "Sure (moved it).",
    ],
)
def test_plain_replies_and_empty_lists_have_no_calls(text):
    assert parse_action(text).is_reply


def test_to_bfcl_matches_bfcl_string_form_and_round_trips():
    call = Call("f", (1,), {"a": "x", "b": [1.5, True], "c": None})
    assert call.to_bfcl() == "f(1,a='x',b=[1.5, True],c=None)"
    assert parse_python_calls(call.to_bfcl()) == [call]


# the two patterns the parser used before it sliced by hand (kept here as the reference
# semantics on short messages, where their backtracking is harmless)
_OLD_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)
_OLD_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?\s*```$", re.S)


def test_block_and_fence_slicing_read_what_the_old_patterns_read():
    from trace_gym.envs.bfcl.parsing import _tool_blocks, _unfence

    rng = random.Random(7)
    pieces = ["<tool_call>", "</tool_call>", "```", "json", " ", "\n", "\t", "x", "{}", "ab c"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 9)))
        assert _tool_blocks(text) == _OLD_TOOL_CALL.findall(text), text
        m = _OLD_FENCE.match(text.strip())
        stripped = text.strip()
        assert _unfence(stripped) == (m.group(1).strip() if m else stripped), text


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "text",
    [
        "```json\n" + " " * 20_000 + "x",  # took hours: the fence pattern was cubic here
        "```" + " \n" * 10_000,
        "<tool_call>x" + " " * 20_000 + "y",
        "<tool_call>" + " \n" * 10_000 + "{",
        "[" + ",".join(["f(a=1)"] * 2_800) + "]",
        "{}; " * 5_000,
    ],
    ids=["open-fence-spaces", "fence-newlines", "block-spaces", "block-newlines", "calls", "semis"],
)
def test_long_actions_parse_to_an_answer(text):
    parsed = parse_action(text)
    assert isinstance(parsed.calls, tuple) and isinstance(parsed.errors, tuple)
