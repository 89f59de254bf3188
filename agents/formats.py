"""ReAct formats per environment: system prompts, stop sequences, chat messages.

A `ReActFormat` is everything a backend needs to turn a `Conversation` into model input
and to end an assistant turn right after its action:

- ``system``: the instructions (how to search, run code, call tools, answer);
- ``stop``: plain stop strings, one per action tag, so a turn ends right after
  ``</search>``, ``</python>`` / a closing code fence, ``</tool_call>`` or ``</answer>``;
- ``obs_role``: the chat role observations are appended as (``"user"``, or ``"tool"``
  for function calling, where chat templates wrap results in their tool-response
  markers);
- ``tools``: whether the env's reset info carries a tools schema; backends pass it
  through the chat template's native ``tools=`` argument when the template supports it,
  and otherwise `system_prompt` writes the schemas into the system prompt.

**Stop strings are kept.** The stop string is part of the action the env parses, so
every backend keeps it, in the text *and* in the token ids: a turn's text is always the
decoding of its token ids. When the last sampled token runs past the stop string (one
BPE token such as ``"</answer>\\n"``), the extra characters stay on both sides; they are
never cut from one side only. Text-only backends (OpenAI-compatible servers) that strip
the stop string get it appended back (`restore_stop`).

The parsing contract is the envs' own (each env parses its action tags leniently and
answers malformed actions with an observation); this module only has to agree on the
tags.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trace_gym.errors import ConfigError
from trace_gym.policy import Conversation

__all__ = [
    "FORMATS",
    "ReActFormat",
    "chat_messages",
    "find_stop",
    "format_for",
    "formats_with",
    "restore_stop",
    "system_prompt",
    "tools_of",
]

MATH_SYSTEM = """\
You are a careful mathematician with a Python interpreter.
Think step by step. To run code, write one Python block and stop:
<python>
print(2 + 2)
</python>
The interpreter keeps its variables between blocks and answers with what the code prints.
When you know the answer, write it as \\boxed{ANSWER} (for example \\boxed{42}) and stop."""

QA_SYSTEM = """\
You answer multi-hop questions with a search engine over Wikipedia.
To search, write a query and stop: <search>your query</search>
The results come back as numbered passages. Search as often as you need.
When you know the answer, give it in a few words and stop: <answer>the answer</answer>"""

BFCL_SYSTEM = """\
You are an assistant that completes the user's requests by calling functions.
To call a function, write the call as JSON and stop:
<tool_call>
{"name": "function_name", "arguments": {"arg": "value"}}
</tool_call>
You may make several calls in one turn, each in its own <tool_call> block.
The results come back as tool responses. When the request is done, answer the user in plain
text without a tool call."""

SIM_SYSTEM = """\
You are solving a synthetic task. Each turn, reply with one move, 'action N', or with
'answer' to finish; the observation describes where you stand."""

GENERIC_SYSTEM = "You are a helpful assistant. Act one step at a time."


@dataclass(frozen=True)
class ReActFormat:
    """How one environment's conversation becomes chat messages and where a turn stops."""

    #: short name ("math", "qa", "bfcl", ...)
    name: str
    #: system prompt (tool schemas are added by `system_prompt` when needed)
    system: str
    #: stop strings (kept in the output; see the module docstring)
    stop: tuple[str, ...] = ()
    #: chat role observations are appended as
    obs_role: str = "user"
    #: the env's reset info carries a tools schema under "tools"
    tools: bool = False
    #: maximum tokens of one assistant turn (backends may lower it)
    max_new_tokens: int = 512
    #: how tools are shown: "full" schemas (native `tools=` when the template has it) or
    #: "names" only, in the system prompt (for tiny models with short contexts)
    tool_detail: str = "full"
    #: extra keyword arguments for `apply_chat_template` (e.g. enable_thinking)
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.obs_role not in ("user", "tool"):
            raise ConfigError(f"obs_role must be 'user' or 'tool', got {self.obs_role!r}")
        if any(not s for s in self.stop):
            raise ConfigError(f"format {self.name!r}: empty stop string; remove it")
        if self.tool_detail not in ("full", "names"):
            raise ConfigError(f"tool_detail must be 'full' or 'names', got {self.tool_detail!r}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


#: env id -> format (env ids as registered in trace_gym.registration)
FORMATS: dict[str, ReActFormat] = {
    "trace/Math-v0": ReActFormat("math", MATH_SYSTEM, ("</python>", "\n```\n", "</answer>")),
    "trace/HotpotQA-v0": ReActFormat(
        "qa", QA_SYSTEM, ("</search>", "</answer>"), max_new_tokens=256
    ),
    "trace/BFCL-v0": ReActFormat(
        "bfcl", BFCL_SYSTEM, ("</tool_call>",), obs_role="tool", tools=True
    ),
    "trace/Sim-v0": ReActFormat("sim", SIM_SYSTEM, (), max_new_tokens=32),
}

GENERIC = ReActFormat("generic", GENERIC_SYSTEM)


def format_for(env_id: str) -> ReActFormat:
    """The format of `env_id` (a generic one, with no stop strings, for unknown ids)."""
    return FORMATS.get(env_id, GENERIC)


def formats_with(overrides: dict[str, dict[str, Any]] | None) -> dict[str, ReActFormat]:
    """Formats with per-env field overrides (e.g. from a model directory's formats file)."""
    out = {}
    for env_id, changes in (overrides or {}).items():
        changes = {k: tuple(v) if k == "stop" else v for k, v in changes.items()}
        out[env_id] = replace(format_for(env_id), **changes)
    return out


def tools_of(conv: Conversation, fmt: ReActFormat) -> list[dict[str, Any]] | None:
    """The tool schemas of a conversation in OpenAI function format, or None."""
    if not fmt.tools:
        return None
    tools = conv.reset_info.get("tools")
    if not tools:
        return None
    out = []
    for t in tools:
        # accept bare function schemas as well as {"type": "function", "function": {...}}
        out.append(
            t
            if isinstance(t, dict) and t.get("type") == "function"
            else {"type": "function", "function": t}
        )
    return out


def system_prompt(conv: Conversation, fmt: ReActFormat, *, native_tools: bool) -> str:
    """The system prompt; writes the tool schemas into it when the template cannot."""
    tools = tools_of(conv, fmt)
    if not tools or (native_tools and fmt.tool_detail == "full"):
        return fmt.system
    if fmt.tool_detail == "names":
        return f"{fmt.system}\n\nAvailable functions: {', '.join(t['function']['name'] for t in tools)}"
    listing = "\n".join(json.dumps(t["function"], sort_keys=True) for t in tools)
    return f"{fmt.system}\n\nAvailable functions:\n{listing}"


def chat_messages(
    conv: Conversation, fmt: ReActFormat, *, native_tools: bool = True
) -> list[dict[str, str]]:
    """OpenAI/transformers chat messages of the whole conversation (text backends).

    An observation's role is the env's (``turn.info["obs_role"]``) or the format's.
    """
    msgs = [
        {"role": "system", "content": system_prompt(conv, fmt, native_tools=native_tools)},
        {"role": "user", "content": conv.prompt},
    ]
    for t in conv.turns:
        msgs.append({"role": "assistant", "content": t.action})
        role = (t.info or {}).get("obs_role") or fmt.obs_role
        if role == "tool" and not native_tools:
            # text-level tool calls have no tool_call_id: results go back as a user turn
            msgs.append(
                {"role": "user", "content": f"<tool_response>\n{t.observation}\n</tool_response>"}
            )
        else:
            msgs.append({"role": role, "content": t.observation})
    return msgs


def find_stop(text: str, stop: Sequence[str], start: int = 0) -> int | None:
    """End index of the earliest stop string found at or after `start` (None if none)."""
    best: int | None = None
    for s in stop:
        i = text.find(s, start)
        if i >= 0 and (best is None or i + len(s) < best):
            best = i + len(s)
    return best


def restore_stop(text: str, matched_stop: str | None) -> str:
    """Append the stop string a server stripped, so text backends keep it like the others."""
    if matched_stop and not text.endswith(matched_stop):
        return text + matched_stop
    return text
