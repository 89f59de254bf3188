"""Names a user brings from outside the project: "module:Class" strings and entry points.

A registry (allocation policies, predictors) resolves a name in three places, in order:
its own table; the entry points that installed packages declare in the registry's group
(``[project.entry-points."trace_gym.allocators"] half_sure = "mypkg.policies:HalfSure"``,
read with `importlib.metadata`, nothing imported until a name is used); then a
``"module:Class"`` string, imported as written (its module on ``sys.path``, e.g. through
``PYTHONPATH``). So a policy defined in a user's file reaches every process a command
starts, not only the one that ran ``ALLOCATORS[name] = cls``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trace_gym.errors import ConfigError, did_you_mean

__all__ = ["check_kwargs", "installed", "is_entry_point", "keywords", "load"]

#: "package.module:Attr" (the attribute may be dotted: "mod:Outer.Inner")
_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_entry_point(spec: str) -> bool:
    """True if `spec` is written "module:Attr" (nothing is imported)."""
    return bool(_ENTRY_POINT.match(str(spec)))


def installed(group: str) -> dict[str, str]:
    """Name -> "module:Attr" of every entry point installed packages declare in `group`."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)}


def load(spec: str, kind: str) -> Any:
    """Import the object a "module:Attr" `spec` names; a missing one is a `ConfigError`
    that names `kind` and `spec` (an import error *inside* the module keeps its traceback)."""
    if not is_entry_point(spec):
        raise ConfigError(f"{kind} {spec!r} is not a 'module:Class' string")
    module, attr = spec.split(":")
    try:
        obj: Any = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            raise ConfigError(
                f"{kind} {spec!r}: no module named {module!r} (install it, or put its "
                "folder on PYTHONPATH)"
            ) from e
        raise
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as e:
        raise ConfigError(f"{kind} {spec!r}: module {module} has no {attr!r}") from e
    return obj


def keywords(target: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword arguments `target` (a function or a class) takes; None: any.

    A constructor that takes ``**options`` and names the dataclass that reads them as
    ``options_class`` (``HotpotQAEnv``) takes that dataclass's fields.
    """
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return None
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {
        "self"
    }
    if any(p.kind is p.VAR_KEYWORD for p in params):
        options = getattr(target, "options_class", None)
        if options is None or not dataclasses.is_dataclass(options):
            return None
        named |= {f.name for f in dataclasses.fields(options)}
    return frozenset(named)


def check_kwargs(
    where: str, target: Callable[..., Any], kwargs: Mapping[str, Any], also: Iterable[str] = ()
) -> None:
    """Raise a one-line `ConfigError` if `kwargs` holds a key `target` does not take.

    `where` names the setting (``rollout.env_kwargs``); `also` lists keys taken on the
    way (``gym.make``'s own, like ``max_episode_steps``). Checked before anything is
    built, so a typo fails at start-up, not after the first rollouts.
    """
    known = keywords(target)
    if known is None:
        return
    known = known | set(also)
    for key in sorted(kwargs):
        if key not in known:
            name = getattr(target, "__qualname__", repr(target))
            raise ConfigError(
                f"{where}: {name} takes no option {key!r}{did_you_mean(key, known)}; "
                f"it takes: {', '.join(sorted(known))}"
            )
