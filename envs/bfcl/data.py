"""BFCL v4 multi-turn data from the installed `bfcl-eval` package: entries, docs, tools.

The four multi-turn categories (base, miss_func, miss_param, long_context; 200 entries
each) are read from the package's own data files, together with the ground truth and
the function docs of the eight backends. Nothing is copied into this project.
`bfcl-eval` is installed without its dependencies (its full set pins numpy 1.26 and
pulls many API clients), plus `mpmath`, which the math backend imports.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError, DependencyNotInstalled, TaskNotFound

__all__ = [
    "ADDITIONAL_FUNCTION_PROMPT",
    "BFCL_EVAL_VERSION",
    "CATEGORIES",
    "INSTALL",
    "BFCLEntry",
    "function_docs",
    "get_entry",
    "load_entries",
    "require_bfcl",
    "to_openai_tool",
]

#: the version whose data, backends and checker this env was written against
BFCL_EVAL_VERSION = "2026.3.23"
INSTALL = f"pip install --no-deps bfcl-eval=={BFCL_EVAL_VERSION} && pip install mpmath"
#: the BFCL v4 multi-turn categories this env serves (200 entries each)
CATEGORIES: tuple[str, ...] = ("base", "miss_func", "miss_param", "long_context")
#: the user message BFCL sends when held-out functions appear (miss_func), FC mode
ADDITIONAL_FUNCTION_PROMPT = (
    "I have updated some more functions you can choose from. What about now?"
)

#: backend class -> function-doc file (bfcl_eval.constants.executable_backend_config)
_DOC_FILES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}

#: BFCL's GORILLA_TO_OPENAPI type mapping (the types these docs use)
_OPENAI_TYPES: dict[str, str] = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
}


def require_bfcl() -> Path:
    """The `bfcl_eval` data folder; raises `DependencyNotInstalled` with the install command."""
    try:
        module = importlib.import_module("bfcl_eval")
        importlib.import_module("mpmath")
    except ImportError as e:
        raise DependencyNotInstalled(
            "bfcl-eval (BFCL v4 data and backends, installed without its dependencies, plus mpmath)",
            INSTALL,
        ) from e
    return Path(module.__file__).resolve().parent / "data"


@dataclass(frozen=True)
class BFCLEntry:
    """One BFCL multi-turn entry: user turns, backend config and ground truth (read-only)."""

    #: BFCL's id, e.g. ``multi_turn_miss_func_12``
    id: str
    #: base | miss_func | miss_param | long_context
    category: str
    #: the user messages of each turn, as BFCL stores them (empty for a held-out-function turn)
    questions: tuple[tuple[dict[str, str], ...], ...]
    #: class name -> scenario, loaded into each backend with ``_load_scenario`` (do not mutate)
    initial_config: dict[str, Any]
    #: backend classes of this entry, in BFCL's order
    involved_classes: tuple[str, ...]
    #: turn index -> names of the functions that appear at that turn (miss_func only)
    missed_function: dict[int, tuple[str, ...]]
    #: per turn, the ground-truth calls in BFCL's python syntax (an empty turn expects none)
    ground_truth: tuple[tuple[str, ...], ...]

    @property
    def num_turns(self) -> int:
        return len(self.questions)

    @property
    def long_context(self) -> bool:
        """BFCL loads backends with ``long_context=True`` for this category."""
        return "long_context" in self.category

    def user_text(self, turn: int) -> str:
        """The user's message(s) of `turn` joined into one observation."""
        return "\n\n".join(m["content"] for m in self.questions[turn])

    def functions_at(self, turn: int) -> list[dict[str, Any]]:
        """The function docs the model is shown at `turn`, in BFCL's order.

        BFCL lists the involved classes' docs, removes the held-out ones, and appends
        each held-out group at the end when its turn comes.
        """
        held = {name for names in self.missed_function.values() for name in names}
        docs = [d for c in self.involved_classes for d in function_docs(c) if d["name"] not in held]
        by_name = {d["name"]: d for c in self.involved_classes for d in function_docs(c)}
        for t in sorted(self.missed_function):
            if t <= turn:
                docs += [by_name[n] for n in self.missed_function[t] if n in by_name]
        return docs


@functools.cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one backend class (treat as read-only)."""
    if class_name not in _DOC_FILES:
        raise ConfigError(
            f"unknown BFCL backend class {class_name!r}; known: {', '.join(_DOC_FILES)}"
        )
    path = require_bfcl() / "multi_turn_func_doc" / _DOC_FILES[class_name]
    return tuple(json.loads(line) for line in path.read_text().splitlines() if line.strip())


def _openai_properties(props: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in props.items():
        value = dict(value)
        value["type"] = _OPENAI_TYPES.get(value.get("type", "string"), "string")
        if "properties" in value:
            value["properties"] = _openai_properties(value["properties"])
        if isinstance(value.get("items"), dict):
            items = dict(value["items"])
            items["type"] = _OPENAI_TYPES.get(items.get("type", "string"), "string")
            if "properties" in items:
                items["properties"] = _openai_properties(items["properties"])
            value["items"] = items
        out[key] = value
    return out


def to_openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI-style tool schema (``{"type": "function", ...}``).

    Types are mapped as BFCL's ``convert_to_tool`` maps them (``dict`` -> ``object``,
    ``float`` -> ``number``, ``tuple`` -> ``array``); the doc's ``response`` field is
    left out, as OpenAI schemas have no place for it.
    """
    params = copy.deepcopy(doc.get("parameters", {}))
    params["type"] = "object"
    params["properties"] = _openai_properties(params.get("properties", {}))
    return {
        "type": "function",
        "function": {
            "name": doc["name"],
            "description": doc.get("description", ""),
            "parameters": params,
        },
    }


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.cache
def _category_entries(category: str) -> tuple[BFCLEntry, ...]:
    data = require_bfcl()
    questions = _read_jsonl(data / f"BFCL_v4_multi_turn_{category}.json")
    answers = {
        a["id"]: a["ground_truth"]
        for a in _read_jsonl(data / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")
    }
    entries = []
    for q in questions:
        gt = answers[q["id"]]
        if len(gt) != len(q["question"]):
            raise ConfigError(
                f"{q['id']}: {len(q['question'])} user turns but {len(gt)} ground-truth turns"
            )
        entries.append(
            BFCLEntry(
                id=q["id"],
                category=category,
                questions=tuple(tuple(turn) for turn in q["question"]),
                initial_config=q.get("initial_config", {}),
                involved_classes=tuple(q["involved_classes"]),
                missed_function={int(k): tuple(v) for k, v in q.get("missed_function", {}).items()},
                ground_truth=tuple(tuple(t) for t in gt),
            )
        )
    return tuple(entries)


def load_entries(categories: Sequence[str] = CATEGORIES) -> list[BFCLEntry]:
    """The entries of `categories`, in BFCL's order (category by category)."""
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown or not categories:
        raise ConfigError(f"unknown BFCL categories {unknown}; choose from {', '.join(CATEGORIES)}")
    return [e for c in categories for e in _category_entries(c)]


@functools.cache
def _entry_index() -> dict[str, BFCLEntry]:
    return {e.id: e for e in load_entries(CATEGORIES)}


def get_entry(entry_id: str) -> BFCLEntry:
    """The entry with BFCL id `entry_id` (e.g. ``multi_turn_base_0``)."""
    try:
        return _entry_index()[entry_id]
    except KeyError:
        raise TaskNotFound(
            f"unknown BFCL entry id {entry_id!r}; ids look like 'multi_turn_base_0'"
        ) from None
