"""Search-R1 action parsing and observation format; malformed turns are explained."""

from __future__ import annotations

import random
import re

import pytest
from trace_gym.envs.hotpotqa.data import Passage, QATask
from trace_gym.envs.hotpotqa.protocol import (
    _blocks,
    format_information,
    invalid_observation,
    make_prompt,
    parse_action,
)
from trace_gym.envs.hotpotqa.retrievers import Hit
from trace_gym.envs.hotpotqa.scripted import (
    oracle_next_action,
    parse_documents,
    question_from_prompt,
)


def test_search_and_answer_are_parsed_and_think_is_ignored():
    a = parse_action(
        "<think>maybe <answer>x</answer>?</think>\n<search>  who   directed X </search>"
    )
    assert (a.kind, a.content) == ("search", "who directed X")
    assert parse_action("<answer> Paris </answer>") == ("answer", "Paris", "", "")
    assert parse_action("<SEARCH>q</SEARCH>").kind == "search"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<search>who is", "unclosed_tag"),
        ("<answer>Paris", "unclosed_tag"),
        ("Paris</answer>", "unopened_tag"),
        ("I think it is Paris.", "no_action"),
        ("<search>   </search>", "empty_query"),
        ("<answer></answer>", "empty_answer"),
        ("<search>" + "word " * 400 + "</search>", "query_too_long"),
        ("<search>q</search><answer>a</answer>", "both_tags"),
    ],
)
def test_malformed_turns_are_invalid_with_a_reason(text, error):
    a = parse_action(text, max_query_chars=512)
    assert a.kind == "invalid" and a.error == error
    obs = invalid_observation(a)
    assert "My previous action is invalid" in obs and a.detail in obs


def test_information_block_follows_search_r1_and_round_trips():
    hits = [
        Hit(Passage("1", "Alpha Town", "Alpha is a town."), 3.0),
        Hit(Passage("2", "Beta", "Beta text."), 1.0),
    ]
    obs = format_information(hits)
    assert (
        obs
        == "<information>Doc 1(Title: Alpha Town) Alpha is a town.\nDoc 2(Title: Beta) Beta text.</information>"
    )
    assert parse_documents([obs]) == {"Alpha Town": "Alpha is a town.", "Beta": "Beta text."}
    assert "No results." in format_information([])


def test_prompt_carries_the_question():
    p = make_prompt("Who was born first, A or B?")
    assert (
        "<search> query </search>" in p and question_from_prompt(p) == "Who was born first, A or B?"
    )


def _regex_blocks(body: str) -> list[tuple[str, str]]:
    """The old, quadratic regex: the reference for which blocks a turn holds."""
    return [
        (m.group(1).lower(), m.group(2).strip())
        for m in re.finditer(r"<(search|answer)>(.*?)</\1>", body, re.S | re.I)
    ]


def test_linear_parser_finds_the_same_blocks_as_the_regex():
    rng = random.Random(17)
    pieces = [
        "<search>",
        "</search>",
        "<answer>",
        "</answer>",
        "<SEARCH>",
        "</Answer>",
        "a",
        " b ",
        "<",
        ">",
        "/",
    ]
    for _ in range(3000):
        body = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert _blocks(body)[0] == _regex_blocks(body), body


def test_adversarial_turns_parse_in_linear_time():
    # 200k characters of unclosed tags: quadratic parsing took seconds per 50k here
    flood = "<search>" * 25_000
    assert parse_action(flood).error == "unclosed_tag"
    assert parse_action("<search>" * 25_000 + "x</search>", max_query_chars=10**6).kind == "search"
    # the length cap is the core's (TraceEnv.step), not the parser's: see test_env.py
    assert parse_action("<answer>x</answer>" + " " * 200_000).kind == "answer"


def test_titles_with_parentheses_are_parsed_whole():
    hits = [
        Hit(Passage("1", "The Five(ish) Doctors Reboot", "A film (2013) by Davison."), 2.0),
        Hit(Passage("2", "Smith (actor)", "An actor."), 1.0),
    ]
    assert parse_documents([format_information(hits)]) == {
        "The Five(ish) Doctors Reboot": "A film (2013) by Davison.",
        "Smith (actor)": "An actor.",
    }


def test_oracle_never_repeats_a_failed_query():
    task = QATask(
        "q", "Where was Zed born?", "Ostra", supporting_facts=(("Zed Person", 0), ("Ostra", 0))
    )
    miss = format_information([Hit(Passage("9", "Unrelated", "Nothing here."), 1.0)])
    observations: list[str] = []
    queries = []
    for _ in range(8):
        action = oracle_next_action(task, observations)
        if "<answer>" in action:
            break
        queries.append(re.search(r"<search>(.*)</search>", action).group(1))
        observations.append(miss)
    assert len(queries) == len(set(queries)) >= 3
    assert queries[:3] == ["Where was Zed born?", "Zed Person", "Zed Person Where was Zed born?"]
    found = format_information([Hit(Passage("1", "Zed Person", "Zed was born in Ostra."), 1.0)])
    assert "<search>Ostra</search>" in oracle_next_action(task, [miss, found])
