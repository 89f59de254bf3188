"""Function calls parsed out of an assistant message - literals only, never `eval`.

Three syntaxes are recognised, tried in this order:

1. Hermes / Qwen3 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
   (one call per block; an unclosed last block is accepted);
2. OpenAI-style tool-call JSON, the whole message (optionally in a code fence):
   ``{"name": ..., "arguments": ...}``, ``{"type": "function", "function": {...}}``,
   ``{"tool_calls": [...]}``, BFCL's ``{"function": name, "parameters": {...}}``, or a
   list of these (or Llama 3's llama3_json: such objects separated by "; ");
   ``arguments`` may be a JSON string as OpenAI sends it;
3. BFCL's python-call syntax ``[f(a=1), g(b="x")]`` (brackets optional, as BFCL's
   decoder adds them), parsed with `ast`; argument values must be literals.

Llama 3.x's optional ``<|python_tag|>`` before a call (and ``<|eom_id|>`` after it) is
dropped first, so its llama3_json and pythonic calls parse as 2 and 3.
A message with none of these is a plain reply (it ends the user turn). A message that
tries one of them and fails is *malformed*: each failure becomes an error string in the
style the BFCL executor would print (``Error during execution: ...``).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "ParsedAction", "parse_action", "parse_python_calls"]

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S)
# a python call attempt: "(" right after the name, so prose like "Sure (done)." is a reply
_LOOKS_LIKE_CALL = re.compile(r"^\[?\s*[A-Za-z_][\w.]*\(")
_ERR = "Error during execution: "


@dataclass(frozen=True)
class Call:
    """One function call: a name, positional and keyword literal arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def to_bfcl(self) -> str:
        """The call in BFCL's executable-string form, ``name(a,k=v)`` with ``repr`` values."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({','.join(parts)})"


@dataclass(frozen=True)
class ParsedAction:
    """What an assistant message asks for: calls, malformed-call errors, or neither."""

    calls: tuple[Call, ...] = ()
    #: one ``Error during execution: ...`` string per malformed call
    errors: tuple[str, ...] = ()
    #: "hermes", "json", "python" or "text"
    syntax: str = "text"

    @property
    def is_reply(self) -> bool:
        """A plain reply: no call was attempted."""
        return not self.calls and not self.errors


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        raw = json.loads(raw) if raw.strip() else {}
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"function arguments must be a JSON object, got {type(raw).__name__}")
    return raw


def _calls_from_json(obj: Any) -> list[Call]:
    """Calls from any of the OpenAI / Hermes / BFCL JSON shapes (raises ValueError)."""
    if isinstance(obj, list):
        return [c for item in obj for c in _calls_from_json(item)]
    if not isinstance(obj, dict):
        raise ValueError(f"a tool call must be a JSON object, got {type(obj).__name__}")
    if "tool_calls" in obj:
        return _calls_from_json(obj["tool_calls"] or [])
    fn = obj.get("function")
    if isinstance(fn, dict):
        name, raw = fn.get("name"), fn.get("arguments", fn.get("parameters"))
    elif isinstance(fn, str):
        name, raw = fn, obj.get("parameters", obj.get("arguments"))
    else:
        name, raw = obj.get("name"), obj.get("arguments", obj.get("parameters"))
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call needs a 'name' (string)")
    return [Call(name, (), _arguments(raw))]


def _literal(node: ast.expr, what: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(
            f"{what} is not a literal value ({ast.unparse(node)}); arguments must be literals"
        ) from None


def _func_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_func_name(node.value)}.{node.attr}"
    raise ValueError(f"not a function name: {ast.unparse(node)}")


def parse_python_calls(text: str) -> list[Call]:
    """Calls from BFCL's python syntax ``[f(a=1), g("x")]``; raises SyntaxError/ValueError."""
    src = text.strip("`\n ")
    if not src.startswith("["):
        src = "[" + src
    if not src.endswith("]"):
        src = src + "]"
    tree = ast.parse(src, filename="<string>", mode="eval").body
    elements = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls = []
    for el in elements:
        if not isinstance(el, ast.Call):
            raise ValueError(f"not a function call: {ast.unparse(el)}")
        name = _func_name(el.func)
        args = tuple(
            _literal(a, f"positional argument {i} of {name}") for i, a in enumerate(el.args)
        )
        kwargs = {}
        for kw in el.keywords:
            if kw.arg is None:
                raise ValueError(f"**-arguments are not allowed in a call to {name}")
            kwargs[kw.arg] = _literal(kw.value, f"argument {kw.arg!r} of {name}")
        calls.append(Call(name, args, kwargs))
    return calls


def _parse_block(block: str) -> list[Call]:
    """One <tool_call> block: JSON, or python syntax as a fallback."""
    try:
        return _calls_from_json(json.loads(block))
    except json.JSONDecodeError as json_error:
        if _LOOKS_LIKE_CALL.match(block.strip()):
            return parse_python_calls(block)
        raise ValueError(str(json_error)) from None


def _tool_blocks(text: str) -> list[str]:
    """The stripped body of every ``<tool_call>`` block (an unclosed last one runs to the
    end), by `str.find`: linear in the message (a regex with whitespace on both sides of a
    lazy body backtracks quadratically on long whitespace runs)."""
    blocks, pos = [], 0
    while (start := text.find("<tool_call>", pos)) >= 0:
        start += len("<tool_call>")
        end = text.find("</tool_call>", start)
        blocks.append(text[start : len(text) if end < 0 else end].strip())
        if end < 0:
            break
        pos = end + len("</tool_call>")
    return blocks


def _unfence(text: str) -> str:
    """The body of a message that is one code fence (```lang ... ```), stripped; else the
    message. Plain slicing: the regex it replaces backtracked cubically on whitespace
    (2,000 spaces after "```json" took 40 s)."""
    if len(text) < 6 or not (text.startswith("```") and text.endswith("```")):
        return text
    body = text[3:-3]
    tag = len(body) - len(body.lstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    return body[tag:].strip()


def _json_sequence(body: str) -> Any:
    """One JSON value, or Llama's "; "-separated objects (llama3_json) as a list; None if neither."""
    decoder, out, pos = json.JSONDecoder(), [], 0
    try:
        while pos < len(body):
            obj, pos = decoder.raw_decode(body, pos)
            out.append(obj)
            while pos < len(body) and body[pos] in "; \n":
                pos += 1
    except (json.JSONDecodeError, RecursionError):
        return None
    return out[0] if len(out) == 1 else out


def parse_action(text: str) -> ParsedAction:
    """Parse an assistant message into calls (see the module docstring for the syntaxes)."""
    # Llama 3.x: an optional <|python_tag|> before the call, <|eom_id|> after it
    text = (
        _THINK.sub("", text)
        .strip()
        .removeprefix("<|python_tag|>")
        .removesuffix("<|eom_id|>")
        .strip()
    )
    if "<tool_call>" in text:
        calls, errors = [], []
        for block in _tool_blocks(text):
            try:
                calls += _parse_block(block)
            except (ValueError, SyntaxError, RecursionError) as e:
                errors.append(_ERR + str(e))
        return ParsedAction(tuple(calls), tuple(errors), "hermes")
    body = _unfence(text)
    if body[:1] in "{[" and body:
        obj = _json_sequence(body)
        if isinstance(obj, dict) or (
            isinstance(obj, list) and obj and all(isinstance(o, dict) for o in obj)
        ):
            try:
                return ParsedAction(tuple(_calls_from_json(obj)), (), "json")
            except ValueError as e:
                return ParsedAction((), (_ERR + str(e),), "json")
    if _LOOKS_LIKE_CALL.match(body) or body.replace(" ", "") == "[]":
        try:
            return ParsedAction(tuple(parse_python_calls(body)), (), "python")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            return ParsedAction((), (_ERR + str(e),), "python")
    return ParsedAction()
