"""Deprecated import paths of moved modules: a thin alias that warns, for one release.

A module that moved leaves a stub at its old path whose only line is::

    __getattr__ = moved(__name__, "trace_gym.bench.learn")

Reading any attribute of the old module warns once (`DeprecationWarning`, naming the new
path) and returns the new module's attribute. The aliases are listed in
`DEPRECATED_ALIASES` (the architecture test allows their outward strings and nothing
else) and go in 0.3.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["DEPRECATED_ALIASES", "REMOVED_IN", "moved"]

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
