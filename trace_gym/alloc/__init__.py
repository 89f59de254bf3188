"""Where the rollout budget goes: exact TRACE solvers and every allocation policy.

- `solve_roots` / `solve_roots_reference`: exact root allocation (fast / reference DP);
- `solve_prefixes`: exact split of one prompt's continuation budget over its prefixes;
- `solve_prefixes_batch`: the same split for many prompts in one vectorised call;
- `split_budget`: largest-remainder rounding that sums exactly;
- `prefix_candidates`: replayable prefixes of a finished rollout tree;
- `ALLOCATORS` / `make_allocator(name, **kwargs)`: the policies of `policies.py`;
- `metrics`: expected mixed groups and accounted / measured cost.

See docs/alloc.md for the design and how to add a policy.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from trace_gym.alloc.base import Allocator, Candidate, PrefixCandidate, VisitHistory
from trace_gym.alloc.candidates import prefix_candidates, remaining_turn_cost
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
)
from trace_gym.errors import ConfigError, unknown

logger = logging.getLogger(__name__)

__all__ = [
    "ALLOCATORS",
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
    "PrefixSolution",
    "RootSolution",
    "TraceAllocator",
    "TraceRootsRandomPrefixes",
    "TreePOAllocator",
    "UniformRootsTracePrefixes",
    "VisitHistory",
    "accounted_cost",
    "expected_flips",
    "expected_mixed_groups",
    "make_allocator",
    "measured_cost",
    "prefix_candidates",
    "remaining_turn_cost",
    "root_value",
    "solve_prefixes",
    "solve_prefixes_batch",
    "solve_roots",
    "solve_roots_reference",
    "split_budget",
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


def _keywords(cls: type) -> set[str]:
    params = inspect.signature(cls).parameters.values()  # __init__'s, without self
    return {
        p.name
        for p in params
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    }


def make_allocator(name: str, **kwargs: Any) -> Allocator:
    """Build the allocation policy registered as `name`.

    Keywords the policy does not take but another registered policy does (e.g. `m_max`
    for `grpo`, `pool_factor` for `trace`) are ignored with a logged warning that names
    them, so one config can build any policy and nobody thinks the option took effect;
    a keyword no policy knows is a typo and raises `ConfigError`.
    """
    if name not in ALLOCATORS:
        raise unknown("allocator", name, ALLOCATORS)
    cls = ALLOCATORS[name]
    own = _keywords(cls)
    known = set().union(*(_keywords(c) for c in ALLOCATORS.values()))
    typos = sorted(set(kwargs) - known)
    if typos:
        raise ConfigError(
            f"allocator option(s) {typos} are not known to any policy; known: {sorted(known)}"
        )
    ignored = sorted(set(kwargs) - own)
    if ignored:
        logger.warning(
            "allocator %r ignores option(s) %s (other policies take them)", name, ignored
        )
    return cls(**{k: v for k, v in kwargs.items() if k in own})
