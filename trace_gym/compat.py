"""Deprecated import paths of moved modules: a thin alias that warns, for one release.

A module that moved leaves a stub at its old path whose only line is::

    __getattr__ = moved(__name__, "trace_gym.bench.learn")

Reading any attribute of the old module warns once (`DeprecationWarning`, naming the new
path) and returns the new module's attribute. The aliases are listed in
`DEPRECATED_ALIASES` (the architecture test allows their outward strings and nothing
else) and go in 0.3.

`renamed_fields` does the same for a dataclass field renamed to the name the rest of the
code uses (``BenchConfig.roots`` -> ``root_budget``): the old name stays a constructor
keyword and an attribute, without a warning, since command-line flags and JSON keys
still say it.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["DEPRECATED_ALIASES", "REMOVED_IN", "moved", "old_names", "renamed_fields"]

REMOVED_IN = "0.3"

#: old module -> new module (every alias stub in the tree, checked by tests/test_architecture.py)
DEPRECATED_ALIASES: dict[str, str] = {
    "trace_gym.demo": "trace_gym.bench.demo",
    "trace_gym.trainers.demo": "trace_gym.bench.demo_train",
    "trace_gym.trainers.learn_bench": "trace_gym.bench.learn",
    "trace_gym.trainers.learn_cli": "trace_gym.bench.learn_cli",
    "trace_gym.trainers.learn_lm": "trace_gym.bench.learn_lm",
    "trace_gym.trainers.learn_stats": "trace_gym.bench.learn_stats",
    "trace_gym.trainers.train_bench": "trace_gym.bench.train",
    "trace_gym.trainers.pipeline": "trace_gym.bench.pipeline",
    "trace_gym.trainers.sim_learner": "trace_gym.bench.sim_learner",
}


def moved(old: str, new: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the stub left at `old`: warn, then read from `new`."""
    if DEPRECATED_ALIASES.get(old) != new:
        raise ValueError(f"{old} -> {new} is not in trace_gym.compat.DEPRECATED_ALIASES")
    warned = False

    def __getattr__(name: str) -> Any:
        nonlocal warned
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if not warned:
            warned = True
            warnings.warn(
                f"{old} moved to {new}; the old path goes in {REMOVED_IN}",
                DeprecationWarning,
                stacklevel=2,
            )
        return getattr(importlib.import_module(new), name)

    return __getattr__


def renamed_fields(**old_to_new: str) -> Callable[[type], type]:
    """Class decorator of a dataclass: each old field name stays a keyword argument of the
    constructor and an attribute (read and set), both meaning the new field. Apply it to
    every dataclass of a hierarchy (a subclass's generated ``__init__`` is its own)."""

    def alias(new: str) -> property:
        def get(self: Any) -> Any:
            return getattr(self, new)

        def put(self: Any, value: Any) -> None:
            setattr(self, new, value)

        return property(get, put, doc=f"the old name of `{new}`")

    def decorate(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kw: Any) -> None:
            for old, new in old_to_new.items():
                if old in kw:
                    if new in kw:
                        raise TypeError(f"{cls.__name__}() got both {old!r} and {new!r}")
                    kw[new] = kw.pop(old)
            init(self, *args, **kw)

        cls.__init__ = __init__  # type: ignore[misc]
        renamed = {**getattr(cls, "__renamed__", {}), **{n: o for o, n in old_to_new.items()}}
        cls.__renamed__ = renamed  # type: ignore[attr-defined]
        for old, new in old_to_new.items():
            setattr(cls, old, alias(new))
        return cls

    return decorate


def old_names(obj: Any) -> dict[str, Any]:
    """`obj`'s attributes (``vars``), each renamed field under its old name (the JSON keys
    a `renamed_fields` class wrote before the rename)."""
    renamed = getattr(type(obj), "__renamed__", {})
    return {renamed.get(k, k): v for k, v in vars(obj).items()}
