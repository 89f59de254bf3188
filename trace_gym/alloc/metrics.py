"""What an allocation is expected to buy and what it costs (docs/alloc.md "Metrics").

- expected mixed groups: sum f(v_i, m_i) of the root allocation, under the predicted
  values and (simulator only) the true ones; v is the probability of the success event
  (reward >= the tree's ``success_threshold``), so with graded rewards this counts
  *success-mixed* groups (`TreeMetrics.success_mixed`), a lower bound on mixed groups
  (raw rewards not all equal, `TreeMetrics.mixed`); for {0, 1} rewards they are equal;
- expected flips: sum (1 - q_j^k_j) of a prefix allocation, likewise;
- accounted cost: roots cost 1 trajectory, a replay `replay_cost` (0.5 as in the paper),
  the arithmetic of `trace_gym.budget.Budget`;
- measured cost: turns and tokens actually generated, split into root and replay turns,
  read from the finished trees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trace_gym.alloc.base import Candidate, PrefixCandidate
from trace_gym.alloc.solvers import VALUE_EPS, prefix_value, root_value, whole_number
from trace_gym.budget import DEFAULT_REPLAY_COST, Budget
from trace_gym.errors import AllocationError
from trace_gym.tree import RolloutTree

__all__ = [
    "ExpectedGain",
    "MeasuredCost",
    "accounted_cost",
    "expected_flips",
    "expected_mixed_groups",
    "measured_cost",
]


@dataclass(frozen=True)
class ExpectedGain:
    """An expected count under predicted values and, when every record has one, true values."""

    predicted: float
    true: float | None


@dataclass(frozen=True)
class MeasuredCost:
    """Turns and tokens generated, by who asked for them (fresh rollouts vs replays)."""

    turns: int
    tokens: int
    root_turns: int
    replay_turns: int
    root_tokens: int
    replay_tokens: int


def _counts(counts, n: int) -> np.ndarray:
    c = np.asarray(counts)
    if c.shape != (n,) or not np.issubdtype(c.dtype, np.integer) or (c < 0).any():
        raise AllocationError(
            f"need {n} non-negative integer counts (one per record); got {c!r:.80}"
        )
    return c


def expected_mixed_groups(candidates: Sequence[Candidate], counts) -> ExpectedGain:
    """Expected number of mixed groups of a root allocation (skipped prompts count 0)."""
    c = _counts(counts, len(candidates))
    predicted = float(root_value([x.value for x in candidates], c).sum())
    if any(x.true_value is None for x in candidates):
        return ExpectedGain(predicted, None)
    return ExpectedGain(predicted, float(root_value([x.true_value for x in candidates], c).sum()))


def _repeat(value: float, reward: float) -> float:
    v = min(max(value, VALUE_EPS), 1.0 - VALUE_EPS)
    return reward * v + (1.0 - reward) * (1.0 - v)


def expected_flips(prefixes: Sequence[PrefixCandidate], counts) -> ExpectedGain:
    """Expected number of prefixes whose replays flip the known outcome at least once."""
    c = _counts(counts, len(prefixes))
    predicted = float(prefix_value([_repeat(p.value, p.reward) for p in prefixes], c).sum())
    true = [p.true_value for p in prefixes if p.true_value is not None]
    if len(true) < len(prefixes):
        return ExpectedGain(predicted, None)
    repeats = [_repeat(t, p.reward) for t, p in zip(true, prefixes, strict=True)]
    return ExpectedGain(predicted, float(prefix_value(repeats, c).sum()))


def accounted_cost(
    root_counts, replay_counts=(), replay_cost: float = DEFAULT_REPLAY_COST
) -> float:
    """Trajectory-equivalents: every root rollout costs 1, every replay `replay_cost`.

    `root_counts` and `replay_counts` are counts (arrays or ints); M roots with N
    replays each cost M (1 + N replay_cost), docs/alloc.md "The budget an allocator is handed".
    """
    if not replay_cost >= 0:
        raise AllocationError(f"replay_cost must be >= 0; got {replay_cost}")
    roots = (
        int(np.sum(root_counts))
        if np.ndim(root_counts)
        else whole_number(root_counts, "root count")
    )
    replays = (
        int(np.sum(replay_counts))
        if np.ndim(replay_counts)
        else whole_number(replay_counts, "replay count")
    )
    return Budget(roots, replays, replay_cost).accounted()


def measured_cost(trees: Sequence[RolloutTree]) -> MeasuredCost:
    """Turns and tokens generated in `trees`, split by node origin ("rollout" vs "replay")."""
    turns = {"rollout": 0, "replay": 0}
    tokens = {"rollout": 0, "replay": 0}
    for tree in trees:
        for node in tree.nodes:
            if node.turn is None:
                continue
            key = "replay" if node.origin == "replay" else "rollout"
            turns[key] += 1
            tokens[key] += node.turn.num_tokens
    return MeasuredCost(
        turns=turns["rollout"] + turns["replay"],
        tokens=tokens["rollout"] + tokens["replay"],
        root_turns=turns["rollout"],
        replay_turns=turns["replay"],
        root_tokens=tokens["rollout"],
        replay_tokens=tokens["replay"],
    )
