"""Deprecated import paths of moved modules: a thin alias that warns, for one release.

A module that moved leaves a stub at its old path whose only line is::

    __getattr__ = moved(__name__, "trace_gym.bench.learn")

Reading any attribute of the old module warns once (`DeprecationWarning`, naming the new
path) and returns the new module's attribute. The aliases are listed in
`DEPRECATED_ALIASES` (the architecture test allows their outward strings and nothing
else) and go in 0.3. A name that left a package which stays (`MOVED_NAMES`) is
forwarded the same way by the package's ``__getattr__ = moved_names(__name__)``.

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

__all__ = [
    "DEPRECATED_ALIASES",
    "MOVED_NAMES",
    "REMOVED_IN",
    "moved",
    "moved_names",
    "old_names",
    "renamed_fields",
]

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
    "trace_gym.predict.oracle": "trace_gym.sim.oracle",
}

#: package -> (module the names moved to, the names): a few names left a package that stays
MOVED_NAMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "trace_gym.predict": ("trace_gym.sim.oracle", ("NoisyOraclePredictor", "OraclePredictor")),
}


def moved(old: str, new: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the stub left at `old`: warn, then read from `new`."""
    if DEPRECATED_ALIASES.get(old) != new:
        raise ValueError(f"{old} -> {new} is not in trace_gym.compat.DEPRECATED_ALIASES")
    return _forward(old, new, None)


def moved_names(package: str) -> Callable[[str], Any]:
    """A package ``__getattr__`` that forwards the names `MOVED_NAMES` lists for it (warning)."""
    new, names = MOVED_NAMES[package]
    return _forward(package, new, frozenset(names))


def _forward(old: str, new: str, names: frozenset[str] | None) -> Callable[[str], Any]:
    """``__getattr__`` of `old`: read the attribute (one of `names`, if given) from `new`,
    warning once per stub (once per name for moved names)."""
    warned: set[str | None] = set()

    def __getattr__(name: str) -> Any:
        if (name.startswith("__") and name.endswith("__")) or (names and name not in names):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        key = None if names is None else name
        if key not in warned:
            warned.add(key)
            what = f"{old} moved to {new}" if names is None else f"{old}.{name} moved to {new}"
            warnings.warn(
                f"{what}; the old path goes in {REMOVED_IN}", DeprecationWarning, stacklevel=2
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
        init = vars(cls).get("__init__") or cls.__init__  # type: ignore[misc]

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
