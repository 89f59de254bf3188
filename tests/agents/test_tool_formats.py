"""Llama 3.1/3.2 tool calls (llama3_json, pythonic, optional <|python_tag|>) through a locally
built tokenizer carrying a Llama-style template with tools=, round trip, and the BFCL env's parser."""

from __future__ import annotations

import json

import pytest
from trace_gym.agents.tool_formats import (
    LLAMA3_SPECIAL_TOKENS,
    LLAMA3_TOOL_TEMPLATE,
    ToolCall,
    parse_llama3_json,
    parse_pythonic,
    render_llama3_json,
    render_pythonic,
)
from trace_gym.envs.bfcl.parsing import parse_action

CALLS = [
    ToolCall("cd", {"folder": "docs"}),
    ToolCall("mv", {"source": "a b.txt", "destination": "x/", "n": 2}),
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "cd",
            "description": "change directory",
            "parameters": {"type": "object", "properties": {"folder": {"type": "string"}}},
        },
    }
]
FORMATS = [(render_llama3_json, parse_llama3_json), (render_pythonic, parse_pythonic)]


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [
        render_llama3_json(CALLS),
        render_pythonic(CALLS),
        json.dumps(TOOLS),
        "Move the file to x.",
    ] * 8
    tok.train_from_iterator(
        texts,
        trainer=trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=LLAMA3_SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|eot_id|>",
        pad_token="<|eom_id|>",
        additional_special_tokens=LLAMA3_SPECIAL_TOKENS,
    )
    fast.chat_template = LLAMA3_TOOL_TEMPLATE
    return fast


@pytest.mark.parametrize("render,parse", FORMATS)
@pytest.mark.parametrize("tag", [False, True])
def test_round_trip_through_the_tokenizer(tokenizer, render, parse, tag):
    text = render(CALLS, python_tag=tag)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert (
        tokenizer.convert_tokens_to_ids("<|python_tag|>") in ids
    ) == tag  # the tag is one special token
    # the model's text as a backend sees it: special tokens kept, or skipped (the tag drops out)
    for decoded in (tokenizer.decode(ids), tokenizer.decode(ids, skip_special_tokens=True)):
        assert parse(decoded) == CALLS
        parsed = parse_action(decoded)  # the BFCL env accepts it
        assert [(c.name, c.kwargs) for c in parsed.calls] == [(c.name, c.arguments) for c in CALLS]
        assert not parsed.errors


def test_tools_go_through_the_tokenizers_own_template(tokenizer):
    msgs = [
        {"role": "system", "content": "You call functions."},
        {"role": "user", "content": "Move the file to x."},
        {"role": "assistant", "content": render_llama3_json(CALLS, python_tag=True)},
        {"role": "tool", "content": "done"},
    ]
    text = tokenizer.apply_chat_template(
        msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert (
        "Environment: ipython" in text
        and '"name": "cd"' in text
        and '"description": "change directory"' in text
    )
    assert "<|start_header_id|>ipython<|end_header_id|>\n\ndone<|eot_id|>" in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    plain = tokenizer.apply_chat_template(msgs[:2], tokenize=False)
    assert "Environment: ipython" not in plain and '"name": "cd"' not in plain
    # the assistant turn parses back out of the rendered conversation
    turn = text.split("<|start_header_id|>assistant<|end_header_id|>\n\n")[1].split("<|eot_id|>")[0]
    assert parse_llama3_json(turn) == CALLS


@pytest.mark.parametrize(
    "bad", ["hello there", "[f(x)]", "[f(a=open('x'))]", '{"parameters": {}}', "[]"]
)
def test_malformed_calls_are_errors_not_crashes(bad):
    for parse in (parse_llama3_json, parse_pythonic):
        with pytest.raises(ValueError):
            parse(bad)
