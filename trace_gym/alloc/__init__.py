"""Where the rollout budget goes: exact TRACE solvers and every allocation policy.

- `solve_roots` / `solve_roots_reference`: exact root allocation (fast / reference DP);
- `solve_prefixes`: exact split of one prompt's continuation budget over its prefixes;
- `solve_prefixes_batch`: the same split for many prompts in one vectorised call;
- `split_budget`: largest-remainder rounding that sums exactly;
- `prefix_candidates`: replayable prefixes of a finished rollout tree;
- `PrefixColumns` / `walk_prefixes`: a step's prefixes as arrays, built from the trees
  in one pass, which `allocate_prefixes_batch` takes besides record lists;
- `ALLOCATORS` / `make_allocator(name, **kwargs)`: the policies of `policies.py`, and
  by name an installed package's (entry-point group ``trace_gym.allocators``) or any
  "module:Class" (`allocator_class`);
- `metrics`: expected mixed groups and accounted / measured cost.

See docs/alloc.md for the design and how to add a policy.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

from trace_gym.alloc.base import Allocator, Candidate, PrefixCandidate, PrefixColumns, VisitHistory
from trace_gym.alloc.candidates import (
    PrefixWalk,
    prefix_candidates,
    remaining_turn_cost,
    walk_prefixes,
)
from trace_gym.alloc.metrics import (
    ExpectedGain,
    MeasuredCost,
    accounted_cost,
    expected_flips,
    expected_mixed_groups,
    measured_cost,
)
from trace_gym.alloc.policies import (
    BaseAllocator,
    FlatAllocator,
    GRESOAllocator,
    GRPOAllocator,
    KnapsackAllocator,
    OracleAllocator,
    PCLAllocator,
    TraceAllocator,
    TraceRootsRandomPrefixes,
    TreePOAllocator,
    UniformRootsTracePrefixes,
)
from trace_gym.alloc.solvers import (
    VALUE_EPS,
    PrefixSolution,
    RootSolution,
    root_value,
    solve_prefixes,
    solve_prefixes_batch,
    solve_roots,
    solve_roots_reference,
    split_budget,
    split_costed_budget,
)
from trace_gym.errors import ConfigError, did_you_mean, unknown
from trace_gym.plugins import installed, is_entry_point, load

logger = logging.getLogger(__name__)

__all__ = [
    "ALLOCATORS",
    "ENTRY_POINT_GROUP",
    "VALUE_EPS",
    "Allocator",
    "BaseAllocator",
    "Candidate",
    "ExpectedGain",
    "FlatAllocator",
    "GRESOAllocator",
    "GRPOAllocator",
    "KnapsackAllocator",
    "MeasuredCost",
    "OracleAllocator",
    "PCLAllocator",
    "PrefixCandidate",
    "PrefixColumns",
    "PrefixWalk",
    "PrefixSolution",
    "RootSolution",
    "TraceAllocator",
    "TraceRootsRandomPrefixes",
    "TreePOAllocator",
    "UniformRootsTracePrefixes",
    "VisitHistory",
    "accounted_cost",
    "allocator_class",
    "allocator_options",
    "check_allocator_kwargs",
    "expected_flips",
    "expected_mixed_groups",
    "make_allocator",
    "measured_cost",
    "prefix_candidates",
    "walk_prefixes",
    "remaining_turn_cost",
    "root_value",
    "solve_prefixes",
    "solve_prefixes_batch",
    "solve_roots",
    "solve_roots_reference",
    "split_budget",
    "split_costed_budget",
]

#: name -> policy class; add your own with ALLOCATORS[MyPolicy.name] = MyPolicy
ALLOCATORS: dict[str, type] = {
    cls.name: cls
    for cls in (
        TraceAllocator,
        GRPOAllocator,
        PCLAllocator,
        TreePOAllocator,
        GRESOAllocator,
        KnapsackAllocator,
        OracleAllocator,
        TraceRootsRandomPrefixes,
        UniformRootsTracePrefixes,
    )
}


def _takes_any(cls: type) -> bool:
    """True if the constructor takes ``**kwargs``."""
    params = inspect.signature(cls).parameters.values()
    return any(p.kind is p.VAR_KEYWORD for p in params)


def allocator_options(cls: type) -> frozenset[str] | None:
    """The keyword options a policy's constructor takes (None: any, it has ``**kwargs``)."""
    return None if _takes_any(cls) else frozenset(_keywords(cls))


def _keywords(cls: type) -> set[str]:
    params = inspect.signature(cls).parameters.values()  # __init__'s, without self
    return {
        p.name
        for p in params
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    }


#: the entry-point group an installed package declares its policies in
ENTRY_POINT_GROUP = "trace_gym.allocators"


def allocator_class(name: str) -> type:
    """The policy class `name` stands for: a name in `ALLOCATORS`, an installed entry point
    of the ``trace_gym.allocators`` group, or a "module:Class" string (imported as written).

    So a policy in a user's file reaches a shell command (``bench alloc --policies
    mypkg.policies:HalfSure``), which `ALLOCATORS[name] = cls` in another process cannot.
    Unknown names raise `UnknownNameError` listing the known ones, with close matches.
    """
    if name in ALLOCATORS:
        return ALLOCATORS[name]
    found = installed(ENTRY_POINT_GROUP)
    if name in found:
        return load(found[name], "allocator")
    if is_entry_point(name):
        return load(name, "allocator")
    raise unknown("allocator", name, [*ALLOCATORS, *found])


def check_allocator_kwargs(name: str, kwargs: Mapping[str, Any], where: str = "allocator") -> None:
    """Raise a one-line `ConfigError` for a keyword no policy takes (`name`'s own included)."""
    cls = allocator_class(name)
    if _takes_any(cls):
        return
    known = _keywords(cls).union(*(_keywords(c) for c in ALLOCATORS.values()))
    typos = sorted(set(kwargs) - known)
    if typos:
        raise ConfigError(
            f"{where} option(s) {typos} are not known to any policy"
            f"{did_you_mean(typos[0], known)}; known: {', '.join(sorted(known))}"
        )


def make_allocator(name: str, **kwargs: Any) -> Allocator:
    """Build the allocation policy `name` (see `allocator_class`) with keyword options.

    Keywords the policy does not take but another registered policy does (e.g. `m_max`
    for `grpo`, `pool_factor` for `trace`) are ignored with a logged warning that names
    them, so one config can build any policy and nobody thinks the option took effect;
    a keyword no policy knows is a typo and raises `ConfigError`. A policy whose
    constructor takes ``**kwargs`` gets every keyword.
    """
    cls = allocator_class(name)
    if _takes_any(cls):
        return cls(**kwargs)
    check_allocator_kwargs(name, kwargs)
    own = _keywords(cls)
    ignored = sorted(set(kwargs) - own)
    if ignored:
        logger.warning(
            "allocator %r ignores option(s) %s (other policies take them)", name, ignored
        )
    return cls(**{k: v for k, v in kwargs.items() if k in own})
