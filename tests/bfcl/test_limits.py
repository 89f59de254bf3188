"""The parse limits (`ParseLimits`): refusals read as errors, nothing of a refused message
runs, the limits never bind on BFCL's ground truth, and the pre-scan stays linear."""

from __future__ import annotations

import ast
import json
import random

import gymnasium as gym
import pytest
from trace_gym.envs.bfcl.data import CATEGORIES, load_entries
from trace_gym.envs.bfcl.parsing import ParseLimits, parse_action, parse_python_calls

import trace_gym
from trace_gym.errors import ConfigError

_ERR = "Error during execution: "
_OPEN = ParseLimits(max_calls=10**9, max_depth=10**9, max_tokens=10**9)


@pytest.fixture(scope="module")
def ground_truth_turns() -> list[list[str]]:
    return [list(t) for e in load_entries(CATEGORIES) for t in e.ground_truth if t]


def test_every_ground_truth_turn_parses_within_the_default_limits(ground_truth_turns):
    for turn in ground_truth_turns:
        expected = [c for text in turn for c in parse_python_calls(text)]
        as_python = parse_action("[" + ", ".join(turn) + "]")
        as_hermes = parse_action("".join(f"<tool_call>{t}</tool_call>" for t in turn))
        for parsed in (as_python, as_hermes):
            assert parsed.limit is None and not parsed.errors, turn
            assert list(parsed.calls) == expected


def test_limits_change_nothing_they_do_not_refuse():
    rng = random.Random(3)
    pieces = ["<tool_call>", "</tool_call>", "[", "]", "(", ")", "{", "}", "f", "cd", "=", "a"]
    pieces += ["'x'", '"y"', "1", ",", " ", '{"name": "ls"}', "<think>", "</think>", "```", "\\"]
    for _ in range(4000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        assert parse_action(text) == parse_action(text, _OPEN), text


@pytest.mark.parametrize(
    ("text", "syntax"),
    [
        ("[" + ", ".join(["f(a=1)"] * 300) + "]", "python"),
        (json.dumps([{"name": "f", "arguments": {}}] * 300), "json"),
        ('<tool_call>{"name": "f"}</tool_call>' * 300, "hermes"),
        ("<tool_call>{</tool_call>" * 300, "hermes"),  # malformed blocks count too
        ("<tool_call>[" + ", ".join(["f()"] * 300) + "]</tool_call>", "hermes"),
    ],
    ids=["python", "json", "hermes", "hermes-malformed", "hermes-python"],
)
def test_too_many_calls_is_one_readable_refusal(text, syntax):
    parsed = parse_action(text)
    assert parsed.calls == () and parsed.syntax == syntax and parsed.limit == "max_calls"
    assert parsed.errors == (
        f"{_ERR}your message has more than 256 calls (the limit per message). Send fewer "
        "calls per message.",
    )
    assert len(parse_action(text, _OPEN).calls + parse_action(text, _OPEN).errors) == 300


def test_depth_and_token_limits_refuse_before_ast_runs(monkeypatch):
    def no_parse(*args, **kwargs):
        raise AssertionError("ast.parse ran on a message over a limit")

    deep = "f(a=" + "[" * 40 + "]" * 40 + ")"
    wide = "f(a=[" + ", ".join(["1"] * 5000) + "])"
    assert parse_action(deep, _OPEN).calls and parse_action(wide, _OPEN).calls
    monkeypatch.setattr(ast, "parse", no_parse)
    parsed = parse_action(deep)
    assert parsed.limit == "max_depth" and parsed.errors == (
        f"{_ERR}your calls nest brackets more than 32 deep (the limit). Send flatter arguments.",
    )
    parsed = parse_action(wide)
    assert parsed.limit == "max_tokens" and parsed.errors[0].startswith(
        f"{_ERR}your python-style calls have more than 4096 tokens outside string literals"
    )
    # in Hermes blocks the python fallbacks share one budget
    blocks = "".join(f"<tool_call>f(a=[{', '.join(['1'] * 40)}])</tool_call>" for _ in range(60))
    assert parse_action(blocks).limit == "max_tokens"


def test_string_literals_are_one_token_and_brackets_in_them_do_not_nest():
    text = "f(a='" + "([{" * 30_000 + "', b=\"" + "x, " * 30_000 + '")'
    parsed = parse_action(text)
    assert parsed.limit is None and parsed.calls[0].kwargs == {
        "a": "([{" * 30_000,
        "b": "x, " * 30_000,
    }


def test_custom_limits_and_their_validation():
    text = "[f(a=[[1]]), g()]"  # 2 calls, depth 4 ("[f([["), 16 tokens
    assert parse_action(text, ParseLimits(max_calls=1)).limit == "max_calls"
    assert parse_action(text, ParseLimits(max_depth=3)).limit == "max_depth"
    assert parse_action(text, ParseLimits(max_tokens=15)).limit == "max_tokens"
    assert parse_action(text, ParseLimits(max_calls=2, max_depth=4, max_tokens=16)).calls
    with pytest.raises(ConfigError, match="max_depth"):
        ParseLimits(max_depth=0)


def test_a_long_non_literal_argument_is_quoted_cut_short():
    parsed = parse_action("f(a=" + "x<" * 1000 + "x)")
    assert parsed.limit is None and len(parsed.errors) == 1
    assert len(parsed.errors[0]) < 400 and "...); arguments must be literals" in parsed.errors[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text",
    [
        "f(a='" + "\\'" * 200_000,  # an unclosed string of escaped quotes: no re-scan per quote
        "f(a=" + "'\\" * 200_000,
        'f(a="' + "'" * 200_000,
        "f(" + "\\" * 200_000,
        "f(" + "([{" * 100_000,
        "f(" + ")]}" * 100_000,
    ],
    ids=["escaped-quotes", "quote-backslash", "mixed-quotes", "backslashes", "opens", "closes"],
)
def test_the_pre_scan_is_linear_on_hostile_text(text):
    parsed = parse_action(text)
    assert parsed.errors and not parsed.calls


@pytest.mark.parametrize(
    ("on_malformed", "event"), [("error", "calls"), ("end_turn", "end_of_turn")]
)
def test_env_answers_a_refused_message_and_runs_none_of_it(on_malformed, event):
    env = gym.make("trace/BFCL-v0", categories=("base",), on_malformed=on_malformed)
    env.reset(options={"task": "multi_turn_base_0"})
    ck = trace_gym.checkpoint(env)
    action = "[" + ", ".join(f"mkdir(dir_name='d{i}')" for i in range(300)) + "]"
    obs, reward, term, _, info = env.step(action)
    assert info["event"] == event and not term and reward == 0.0
    assert info["error"] == "action_over_limit" and info["limit"] == "max_calls"
    assert info["malformed"][0].startswith(f"{_ERR}your message has more than 256 calls")
    if on_malformed == "error":
        assert obs == info["malformed"][0] and info["calls"] == []
        assert env.unwrapped.turn_calls == []  # nothing ran
    trace_gym.restore(env, ck)
    tight = gym.make("trace/BFCL-v0", categories=("base",), parse_limits=ParseLimits(max_calls=400))
    tight.reset(options={"task": "multi_turn_base_0"})
    assert len(tight.step(action)[4]["calls"]) == 300
