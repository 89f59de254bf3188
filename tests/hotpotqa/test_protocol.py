"""Search-R1 action parsing and observation format; malformed turns are explained."""

from __future__ import annotations

import pytest
from trace_gym.envs.hotpotqa.data import Passage
from trace_gym.envs.hotpotqa.protocol import (
    format_information,
    invalid_observation,
    make_prompt,
    parse_action,
)
from trace_gym.envs.hotpotqa.retrievers import Hit
from trace_gym.envs.hotpotqa.scripted import parse_documents, question_from_prompt


def test_search_and_answer_are_parsed_and_think_is_ignored():
    a = parse_action("<think>maybe <answer>x</answer>?</think>\n<search>  who   directed X </search>")
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
    hits = [Hit(Passage("1", "Alpha Town", "Alpha is a town."), 3.0), Hit(Passage("2", "Beta", "Beta text."), 1.0)]
    obs = format_information(hits)
    assert obs == "\n\n<information>Doc 1(Title: Alpha Town) Alpha is a town.\nDoc 2(Title: Beta) Beta text.</information>\n\n"
    assert parse_documents([obs]) == {"Alpha Town": "Alpha is a town.", "Beta": "Beta text."}
    assert "No results." in format_information([])


def test_prompt_carries_the_question():
    p = make_prompt("Who was born first, A or B?")
    assert "<search> query </search>" in p and question_from_prompt(p) == "Who was born first, A or B?"
