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

Parsing is linear in the message and bounded (`ParseLimits`): python-style call text is
pre-scanned in one pass (string literals skipped by a pattern that cannot backtrack,
then tokens and bracket depth counted) before ``ast.parse``, whose cost per token is
~100 times JSON's; a message over a limit is refused whole with a readable error
(`ParsedAction.limit` says which), never cut short and never executed in part.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from trace_gym.errors import ConfigError, TraceGymError

__all__ = ["Call", "ParseLimits", "ParsedAction", "parse_action", "parse_python_calls"]

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S)
# a python call attempt: "(" right after the name, so prose like "Sure (done)." is a reply
_LOOKS_LIKE_CALL = re.compile(r"^\[?\s*[A-Za-z_][\w.]*\(")
_ERR = "Error during execution: "
# a '...' or "..." literal, or an unclosed one up to the end of its line: every quote
# starts a match and the loop's two branches are disjoint and possessive, so the scan
# never backtracks (a pattern that can fail after a long run re-scans it from every
# later quote: quadratic on "'\\'\\'...")
_STRING = re.compile(
    r"""'(?:[^'\\\n]|\\(?:.|\Z))*+(?:'|$)|"(?:[^"\\\n]|\\(?:.|\Z))*+(?:"|$)""", re.S | re.M
)
_TOKEN = re.compile(r"\w+|[^\w\s]")
_BRACKET = re.compile(r"[][(){}]")
#: longest source text of a non-literal argument quoted in its error
_SHOWN_CHARS = 200


@dataclass(frozen=True)
class ParseLimits:
    """Bounds on the work one message may cost to parse; a message over one is refused.

    The defaults sit far above BFCL's ground truth (at most 34 calls in a turn, bracket
    depth 2, a few dozen tokens per call) and keep any parse within the env's length cap
    to a few milliseconds (`trace-gym bench bfcl-parse`; docs/bfcl.md).
    """

    #: calls in one message (malformed ``<tool_call>`` blocks count too)
    max_calls: int = 256
    #: bracket nesting of python-style calls, outside string literals
    max_depth: int = 32
    #: tokens of python-style calls outside string literals (a string literal is one);
    #: ``ast`` costs 2-5 us a token, JSON's C decoder far less, so JSON has no such limit
    max_tokens: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_calls", "max_depth", "max_tokens"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"ParseLimits.{name} must be >= 1, got {getattr(self, name)}")


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
    #: the `ParseLimits` field that refused the message ("max_calls", ...), else None
    limit: str | None = None

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


class _TooManyCalls(TraceGymError):
    """More calls than `ParseLimits.max_calls` (the message is refused where it is caught)."""


def _calls_from_json(obj: Any, max_calls: int | None = None) -> list[Call]:
    """Calls from any of the OpenAI / Hermes / BFCL JSON shapes (raises ValueError, or
    `_TooManyCalls` as soon as more than `max_calls` are found: none past it are built)."""
    calls: list[Call] = []
    _collect_json_calls(obj, calls, max_calls)
    return calls


def _collect_json_calls(obj: Any, calls: list[Call], max_calls: int | None) -> None:
    if isinstance(obj, list):
        for item in obj:
            _collect_json_calls(item, calls, max_calls)
        return
    if not isinstance(obj, dict):
        raise ValueError(f"a tool call must be a JSON object, got {type(obj).__name__}")
    if "tool_calls" in obj:
        _collect_json_calls(obj["tool_calls"] or [], calls, max_calls)
        return
    fn = obj.get("function")
    if isinstance(fn, dict):
        name, raw = fn.get("name"), fn.get("arguments", fn.get("parameters"))
    elif isinstance(fn, str):
        name, raw = fn, obj.get("parameters", obj.get("arguments"))
    else:
        name, raw = obj.get("name"), obj.get("arguments", obj.get("parameters"))
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call needs a 'name' (string)")
    calls.append(Call(name, (), _arguments(raw)))
    if max_calls is not None and len(calls) > max_calls:
        raise _TooManyCalls


def _shown(node: ast.expr) -> str:
    """The source of `node` for an error message, cut to `_SHOWN_CHARS`."""
    try:
        text = ast.unparse(node)
    except RecursionError:
        return "an expression too deep to show"
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}..."


def _literal(node: ast.expr, what: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(
            f"{what} is not a literal value ({_shown(node)}); arguments must be literals"
        ) from None


def _func_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_func_name(node.value)}.{node.attr}"
    raise ValueError(f"not a function name: {_shown(node)}")


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
            raise ValueError(f"not a function call: {_shown(el)}")
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


def _python_refusal(text: str, limits: ParseLimits, syntax: str) -> ParsedAction | None:
    """The refusal of python-style call text over `limits` (tokens, then depth), or None.

    One linear pass each, in C but for the bracket walk, which runs only when there are
    more opening brackets than `max_depth` and sees at most `max_tokens` brackets."""
    bare, strings = _STRING.subn(" 0 ", text)
    # count= stops the scan at the first token over the limit
    if _TOKEN.subn("", bare, count=limits.max_tokens + 1)[1] > limits.max_tokens:
        return _refusal(
            syntax,
            "max_tokens",
            f"your python-style calls have more than {limits.max_tokens} tokens outside "
            f"string literals (the limit; {strings} string literals count one each). "
            "Send fewer or smaller calls.",
        )
    if sum(bare.count(c) for c in "([{") > limits.max_depth:
        depth = 0
        for m in _BRACKET.finditer(bare):
            depth = depth + 1 if m.group() in "([{" else max(depth - 1, 0)
            if depth > limits.max_depth:
                return _refusal(
                    syntax,
                    "max_depth",
                    f"your calls nest brackets more than {limits.max_depth} deep (the "
                    "limit). Send flatter arguments.",
                )
    return None


def _too_many_calls(limits: ParseLimits, syntax: str) -> ParsedAction:
    return _refusal(
        syntax,
        "max_calls",
        f"your message has more than {limits.max_calls} calls (the limit per message). "
        "Send fewer calls per message.",
    )


def _refusal(syntax: str, limit: str, reason: str) -> ParsedAction:
    return ParsedAction((), (_ERR + reason,), syntax, limit)


def _parse_hermes(text: str, limits: ParseLimits) -> ParsedAction:
    """Every ``<tool_call>`` block: JSON, or python syntax as a fallback (pre-scanned
    together, so many small python blocks share one token budget)."""
    blocks = _tool_blocks(text, limits.max_calls)
    if len(blocks) > limits.max_calls:
        return _too_many_calls(limits, "hermes")
    parsed: list[list[Call] | str] = []  # per block: its calls, or its error
    python: list[int] = []  # blocks that are python syntax (parsed below, after one pre-scan)
    used = 0  # calls and errors of the blocks so far (a python block counts one for now)
    for block in blocks:
        try:
            calls = _calls_from_json(json.loads(block), limits.max_calls - used)
        except _TooManyCalls:
            return _too_many_calls(limits, "hermes")
        except json.JSONDecodeError as json_error:
            if _LOOKS_LIKE_CALL.match(block.strip()):
                python.append(len(parsed))
            parsed.append(_ERR + str(json_error))
            used += 1
        except (ValueError, RecursionError) as e:
            parsed.append(_ERR + str(e))
            used += 1
        else:
            parsed.append(calls)
            used += len(calls)
    if python:
        refusal = _python_refusal("\n".join(blocks[i] for i in python), limits, "hermes")
        if refusal is not None:
            return refusal
        for i in python:
            try:
                parsed[i] = parse_python_calls(blocks[i])
            except (ValueError, SyntaxError, RecursionError, MemoryError) as e:
                parsed[i] = _ERR + str(e)
    calls = [c for p in parsed if not isinstance(p, str) for c in p]
    errors = [p for p in parsed if isinstance(p, str)]
    if len(calls) + len(errors) > limits.max_calls:
        return _too_many_calls(limits, "hermes")
    return ParsedAction(tuple(calls), tuple(errors), "hermes")


def _tool_blocks(text: str, limit: int | None = None) -> list[str]:
    """The stripped body of every ``<tool_call>`` block (an unclosed last one runs to the
    end), by `str.find`: linear in the message (a regex with whitespace on both sides of a
    lazy body backtracks quadratically on long whitespace runs); stops once there are
    more than `limit`."""
    blocks: list[str] = []
    pos = 0
    while (start := text.find("<tool_call>", pos)) >= 0 and len(blocks) <= (limit or len(text)):
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


def parse_action(text: str, limits: ParseLimits = ParseLimits()) -> ParsedAction:
    """Parse an assistant message into calls (see the module docstring for the syntaxes);
    a message over `limits` comes back refused: one error, no calls, ``limit`` set."""
    # Llama 3.x: an optional <|python_tag|> before the call, <|eom_id|> after it
    text = (
        _THINK.sub("", text)
        .strip()
        .removeprefix("<|python_tag|>")
        .removesuffix("<|eom_id|>")
        .strip()
    )
    if "<tool_call>" in text:
        return _parse_hermes(text, limits)
    body = _unfence(text)
    if body[:1] in "{[" and body:
        obj = _json_sequence(body)
        if isinstance(obj, dict) or (
            isinstance(obj, list) and obj and all(isinstance(o, dict) for o in obj)
        ):
            try:
                calls = _calls_from_json(obj, limits.max_calls)
            except _TooManyCalls:
                return _too_many_calls(limits, "json")
            except ValueError as e:
                return ParsedAction((), (_ERR + str(e),), "json")
            return ParsedAction(tuple(calls), (), "json")
    if _LOOKS_LIKE_CALL.match(body) or body.replace(" ", "") == "[]":
        refusal = _python_refusal(body, limits, "python")
        if refusal is not None:
            return refusal
        try:
            calls = parse_python_calls(body)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            return ParsedAction((), (_ERR + str(e),), "python")
        if len(calls) > limits.max_calls:
            return _too_many_calls(limits, "python")
        return ParsedAction(tuple(calls), (), "python")
    return ParsedAction()
