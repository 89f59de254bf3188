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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from trace_gym.budget import DEFAULT_REPLAY_COST

__all__ = ["Allocator", "Candidate", "PrefixCandidate", "VisitHistory"]


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
        prefixes: Sequence[Sequence[PrefixCandidate]],
        budgets: Sequence[float],
        rngs: Sequence[np.random.Generator],
    ) -> list[np.ndarray]:
        """`allocate_prefixes(prefixes[g], budgets[g], rngs[g])` for every prompt g, in order."""
        ...
