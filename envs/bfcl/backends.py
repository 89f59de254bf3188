"""The eight bfcl-eval backends: per-episode instances and BFCL-faithful call dispatch.

Each episode gets fresh instances built from the entry's initial config exactly as
BFCL's ``execute_multi_turn_func_call`` builds them (``cls()``, then
``_load_scenario(deepcopy(config), long_context=...)`` for stateful classes) - but
never through its module-global instance cache. Calls are dispatched by name to a
public method of an involved class (a later class wins a name clash, as in BFCL's
method mapping), never through `eval`; the result text matches what BFCL's executor
returns: strings as they are, dicts as JSON, anything else through ``str``, and
``Error during execution: <exception>`` when the call fails.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from trace_gym.envs.bfcl.data import BFCLEntry, require_bfcl
from trace_gym.envs.bfcl.parsing import Call

__all__ = [
    "BACKEND_CLASSES",
    "CallOutcome",
    "call_signature",
    "execute_call",
    "make_backends",
    "method_table",
    "public_attributes",
]

_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
#: class name -> module under bfcl_eval's func_source_code (the eight multi-turn backends)
BACKEND_CLASSES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
#: classes without a scenario (BFCL's STATELESS_CLASSES)
_STATELESS = frozenset({"MathAPI"})
#: names BFCL's executor refuses before evaluating a call
_FORBIDDEN = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})
_ERR = "Error during execution: "


class CallOutcome(NamedTuple):
    """One executed call: BFCL's string form, the result text, and how it went."""

    call: str
    result: str
    #: ok | error (the backend raised) | unknown_function | bad_arguments | refused
    status: str


@functools.cache
def _backend_class(name: str) -> type:
    require_bfcl()
    return getattr(importlib.import_module(f"{_PREFIX}.{BACKEND_CLASSES[name]}"), name)


@functools.cache
def _public_methods(name: str) -> tuple[str, ...]:
    # BFCL maps the public bound methods of an instance; a bare instance has the same set
    instance = _backend_class(name)()
    return tuple(
        m
        for m, _ in inspect.getmembers(instance, predicate=inspect.ismethod)
        if not m.startswith("_")
    )


@functools.cache
def method_table(involved_classes: tuple[str, ...]) -> Mapping[str, str]:
    """Method name -> class name for an entry's classes (later classes win, as in BFCL)."""
    table: dict[str, str] = {}
    for cls in involved_classes:
        for m in _public_methods(cls):
            table[m] = cls
    return table


@functools.cache
def call_signature(cls: str, method: str) -> inspect.Signature:
    return inspect.signature(getattr(_backend_class(cls), method))


def make_backends(entry: BFCLEntry) -> dict[str, Any]:
    """Fresh backend instances for `entry`, loaded from its initial config."""
    backends = {}
    for cls in entry.involved_classes:
        instance = _backend_class(cls)()
        if cls not in _STATELESS:
            instance._load_scenario(
                copy.deepcopy(entry.initial_config.get(cls, {})), long_context=entry.long_context
            )
        backends[cls] = instance
    return backends


def public_attributes(instance: Any) -> dict[str, Any]:
    """The attributes BFCL's state check compares (``vars`` without ``_``-names)."""
    return {k: v for k, v in vars(instance).items() if not k.startswith("_")}


def _result_text(value: Any) -> str:
    # exactly BFCL's conversion (note: `type(...) ==`, so dict subclasses go through str)
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:
            return str(value)
    return str(value)


def _too_expensive(method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """Guard against arguments that would hang the process (BFCL has no timeout)."""
    values = list(args) + list(kwargs.values())
    if method == "power" and len(values) == 2 and all(isinstance(v, int) for v in values):
        if abs(values[0]) > 1 and abs(values[1]) > 10_000:
            return "exponent too large (integer powers are limited to exponents of 10000 here)"
    if method == "square_root":
        precision = kwargs.get("precision", args[1] if len(args) > 1 else 0)
        if isinstance(precision, int) and precision > 10_000:
            return "precision too large (at most 10000 digits here)"
    return None


def execute_call(backends: Mapping[str, Any], call: Call, table: Mapping[str, str]) -> CallOutcome:
    """Run one call on the episode's backends; failures become BFCL's error text."""
    text = call.to_bfcl()
    name = call.name
    if name.split(".")[-1] in _FORBIDDEN:
        return CallOutcome(
            text, f"{_ERR}Function call {name.split('.')[-1]} is not allowed.", "refused"
        )
    cls = table.get(name)
    if cls is None:
        # BFCL evaluates the call string: an unmapped name is a NameError
        return CallOutcome(
            text, f"{_ERR}name '{name.split('.')[0]}' is not defined", "unknown_function"
        )
    method: Callable[..., Any] = getattr(backends[cls], name)
    try:
        call_signature(cls, name).bind(None, *call.args, **call.kwargs)
        arguments_fit = True
    except TypeError:
        arguments_fit = False
    if arguments_fit:
        guard = _too_expensive(name, call.args, call.kwargs)
        if guard is not None:
            return CallOutcome(text, _ERR + guard, "refused")
    try:
        # when the arguments do not fit, the call raises Python's exact TypeError text
        # (the one BFCL's eval shows) before the method body runs
        value = method(*call.args, **call.kwargs)
    except TypeError as e:
        return CallOutcome(text, f"{_ERR}{e}", "error" if arguments_fit else "bad_arguments")
    except Exception as e:  # a backend error is data (BFCL catches Exception too)
        return CallOutcome(text, f"{_ERR}{e}", "error")
    return CallOutcome(text, _result_text(value), "ok")
