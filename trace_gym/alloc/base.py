"""The allocation protocol: how a policy decides where the rollout budget goes.

Two decisions per step (docs/alloc.md):

- roots: given the candidate pool, how many fresh rollouts each prompt gets
  (0 skips it; otherwise at least 2, at most ``m_max``), summing to the root budget;
- prefixes: given one prompt's finished rollouts, how many replays each visited
  prefix gets, summing to that prompt's continuation budget.

Allocators receive *records*, not bare numbers, so a policy can use visit history
(GRESO, Knapsack-RL), true values (the oracle, simulator only) or randomness
(TreePO) without changing the protocol. Randomness comes only from the `rng` passed
in, which the runner derives from (step, prompt id), so allocation is reproducible.

Prefixes also come as columns (`PrefixColumns`: one numpy array per `PrefixCandidate`
field, every prompt's rows one after another), which the runner's global expansion
builds from the trees (`trace_gym.alloc.candidates.walk_prefixes`) and
`BatchPrefixAllocator.allocate_prefixes_batch` takes besides record lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from itertools import starmap
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from trace_gym.budget import DEFAULT_REPLAY_COST
from trace_gym.errors import AllocationError

__all__ = ["Allocator", "Candidate", "PrefixCandidate", "PrefixColumns", "VisitHistory"]


@dataclass(frozen=True)
class VisitHistory:
    """What past steps saw of one prompt."""

    #: leaf rewards of each past visit, oldest first
    rewards: tuple[tuple[float, ...], ...] = ()
    #: consecutive most recent visits that were all-success / all-failure
    all_success_streak: int = 0
    all_failure_streak: int = 0

    @property
    def visits(self) -> int:
        return len(self.rewards)

    @property
    def last_mean(self) -> float | None:
        if not self.rewards or not self.rewards[-1]:
            return None
        return float(np.mean(self.rewards[-1]))


@dataclass(frozen=True)
class Candidate:
    """A candidate prompt at the root stage."""

    id: str
    #: predicted success probability in [0, 1]
    value: float
    history: VisitHistory = field(default_factory=VisitHistory)
    #: exact success probability (simulator only; None elsewhere)
    true_value: float | None = None
    #: cost of one root rollout of this prompt relative to the step's mean (1: flat). In a
    #: multi-env mixture a long-horizon env's rollouts cost more (`trace_gym.mixture`);
    #: a cost-aware root solver then keeps sum(cost x rollouts) within the budget
    cost: float = 1.0
    #: how sure the predictor is of `value`: the a + b of its Beta(a, b) belief with mean
    #: `value` (`trace_gym.predict.base.UncertainPredictor`); None for a point estimate.
    #: The posterior objective (TRACE ``objective="posterior"``) reads it
    concentration: float | None = None


@dataclass(frozen=True)
class PrefixCandidate:
    """A visited prefix (a turn boundary strictly inside a finished rollout)."""

    #: index of the finished rollout (leaf) this prefix lies on, within its prompt
    rollout: int
    #: node id of the prefix in the prompt's `RolloutTree`
    node: int
    #: turns completed at this prefix (>= 1)
    depth: int
    #: reward of the rollout the prefix lies on
    reward: float
    #: predicted success probability from this prefix
    value: float
    #: cost of one replay from here, in trajectory-equivalents: the flat replay cost
    #: (0.5), or for a cost-aware allocator the share of turns a replay regenerates
    cost: float = DEFAULT_REPLAY_COST
    #: exact success probability from this prefix (simulator only)
    true_value: float | None = None
    #: total turns of the rollout the prefix lies on
    rollout_turns: int = 0
    #: a + b of the predictor's Beta belief about `value` (None: a point estimate)
    concentration: float | None = None


#: the integer and float columns, in `PrefixCandidate`'s field order
INT_FIELDS = ("rollout", "node", "depth", "rollout_turns")
FLOAT_FIELDS = ("reward", "value", "cost", "true_value", "concentration")


@dataclass(frozen=True, eq=False)
class PrefixColumns:
    """Every prompt's prefix candidates of one step, one array per field (checked).

    `bounds` (int64, prompts + 1, from 0 to the prefix count, non-decreasing) cuts the
    rows into prompts; every other field has one entry per prefix, as in
    `PrefixCandidate`. ``true_value`` NaN and ``concentration`` inf stand for None.
    Bad input raises `AllocationError` naming the field.
    """

    bounds: np.ndarray
    rollout: np.ndarray
    node: np.ndarray
    depth: np.ndarray
    reward: np.ndarray
    value: np.ndarray
    cost: np.ndarray
    true_value: np.ndarray
    rollout_turns: np.ndarray
    concentration: np.ndarray

    def __post_init__(self) -> None:
        bounds = _ints(self.bounds, "bounds")
        n = int(bounds[-1]) if bounds.size else -1
        if bounds.size < 1 or bounds[0] != 0 or np.any(np.diff(bounds) < 0):
            raise AllocationError(
                "PrefixColumns.bounds must start at 0 and never decrease (one entry per prompt "
                f"plus one); got {bounds[:6].tolist()}"
            )
        object.__setattr__(self, "bounds", bounds)
        for name in INT_FIELDS:
            object.__setattr__(self, name, _ints(getattr(self, name), name, n))
        for name in FLOAT_FIELDS:
            object.__setattr__(self, name, _floats(getattr(self, name), name, n))
        _check_ranges(self)

    @property
    def prompts(self) -> int:
        return int(self.bounds.size - 1)

    @property
    def sizes(self) -> np.ndarray:
        """Prefixes per prompt (int64)."""
        return np.diff(self.bounds)

    def __len__(self) -> int:
        """The number of prompts (as for a list of record lists)."""
        return self.prompts

    @classmethod
    def from_records(cls, prompts: Sequence[Sequence[PrefixCandidate]]) -> PrefixColumns:
        """The columns of a list of record lists (one list per prompt)."""
        flat = [p for ps in prompts for p in ps]
        cols: dict[str, object] = {f: [getattr(p, f) for p in flat] for f in INT_FIELDS}
        for f in FLOAT_FIELDS:
            fill = np.nan if f == "true_value" else np.inf
            cols[f] = [fill if (x := getattr(p, f)) is None else x for p in flat]
        bounds = np.r_[0, np.cumsum([len(ps) for ps in prompts], dtype=np.int64)]
        return cls(bounds=bounds, **cols)  # type: ignore[arg-type]

    def records(self) -> list[list[PrefixCandidate]]:
        """One `PrefixCandidate` list per prompt: the records these columns hold."""
        cols = {f.name: getattr(self, f.name).tolist() for f in fields(self) if f.name != "bounds"}
        cols["true_value"] = [None if x != x else x for x in cols["true_value"]]
        cols["concentration"] = [None if x == np.inf else x for x in cols["concentration"]]
        flat = list(starmap(PrefixCandidate, zip(*cols.values(), strict=True)))  # field order
        b = self.bounds.tolist()
        return [flat[lo:hi] for lo, hi in zip(b[:-1], b[1:], strict=True)]


def _ints(x, name: str, n: int | None = None) -> np.ndarray:
    try:
        a = np.asarray(x)
        out = a.astype(np.int64)
    except (TypeError, ValueError, OverflowError) as e:
        raise AllocationError(f"PrefixColumns.{name} must be integers; {e}") from e
    if out.ndim != 1 or (n is not None and out.size != n):
        raise AllocationError(
            f"PrefixColumns.{name} must be a flat array of {n} entries (one per prefix, "
            f"bounds[-1]); got shape {out.shape}"
        )
    if a.dtype.kind not in "iub" and out.size and not np.array_equal(out, a):
        raise AllocationError(f"PrefixColumns.{name} must be whole numbers; got {a[:5].tolist()}")
    return out


def _floats(x, name: str, n: int) -> np.ndarray:
    try:
        out = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as e:
        raise AllocationError(f"PrefixColumns.{name} must be numbers; {e}") from e
    if out.shape != (n,):
        raise AllocationError(
            f"PrefixColumns.{name} must be a flat array of {n} entries (one per prefix, "
            f"bounds[-1]); got shape {out.shape}"
        )
    return out


def _check_ranges(c: PrefixColumns) -> None:
    """Each column's domain: the field named in the error."""
    bad = {
        "reward": ~((c.reward >= 0) & (c.reward <= 1)),
        "value": ~((c.value >= 0) & (c.value <= 1)),
        "cost": ~np.isfinite(c.cost) | (c.cost < 0),
        "true_value": (c.true_value < 0) | (c.true_value > 1) | np.isinf(c.true_value),
        "concentration": np.isnan(c.concentration) | (c.concentration <= 0),
        "depth": c.depth < 1,
        "rollout": c.rollout < 0,
    }
    for name, mask in bad.items():
        if mask.any():
            at = np.flatnonzero(mask)[:5]
            raise AllocationError(
                f"PrefixColumns.{name} is out of its range at rows {at.tolist()}: "
                f"{getattr(c, name)[at].tolist()} (see `PrefixCandidate.{name}`)"
            )


@runtime_checkable
class Allocator(Protocol):
    """An allocation policy. Each is a small class; see `trace_gym.alloc.policies`."""

    name: ClassVar[str]
    #: False for flat policies (GRPO, PCL, GRESO, Knapsack): at equal accounted cost the
    #: harness gives them the whole budget as roots and no replays
    branching: ClassVar[bool]
    #: True when `allocate_prefixes` takes a cost budget (trajectory-equivalents, a float)
    #: and prefixes that each carry their own `cost`; False (the `BaseAllocator` default)
    #: when it takes a count of replays. A plain attribute: a policy may set it per instance
    cost_aware: bool

    def allocate_roots(
        self, candidates: Sequence[Candidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Rollouts per candidate (int array, same order): each 0 or in [2, m_max]."""
        ...

    def allocate_prefixes(
        self, prefixes: Sequence[PrefixCandidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Replays per prefix (int array, same order), summing to `budget`.

        An allocator whose `cost_aware` is true gets `budget` in
        trajectory-equivalents instead (a float) and prefixes that each carry their own
        `cost`; its counts may then sum to anything whose total cost fits the budget.
        """
        ...


@runtime_checkable
class BatchPrefixAllocator(Protocol):
    """An allocator that splits many prompts' replays in one call (`BaseAllocator` is one).

    The runner's global expansion (``expansion = "global"``: every prompt's roots are done
    before any prefix is expanded) calls it once per step instead of `allocate_prefixes`
    once per prompt; answers must equal the per-prompt calls'.
    """

    def allocate_prefixes_batch(
        self,
        prefixes: Sequence[Sequence[PrefixCandidate]] | PrefixColumns,
        budgets: Sequence[float],
        rngs: Sequence[np.random.Generator],
    ) -> list[np.ndarray]:
        """`allocate_prefixes(prefixes[g], budgets[g], rngs[g])` for every prompt g, in order.

        `prefixes` is a list of record lists or, where the allocator sets
        ``accepts_columns = True`` (every `BaseAllocator` does), `PrefixColumns`: the same
        records as one array per field."""
        ...
