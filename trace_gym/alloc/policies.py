"""Allocation policies: TRACE, its ablations, and every baseline, one small class each.

Each class implements the `Allocator` protocol of `trace_gym.alloc.base`:
`allocate_roots(candidates, budget, rng)` returns rollouts per candidate (0, or
2..m_max; fixed-group policies use exactly `group_size`), and
`allocate_prefixes(prefixes, budget, rng)` returns replays per prefix. Flat policies
(`branching = False`) return zeros from the latter. Randomness comes only from `rng`.

Fixed-group policies (grpo, pcl, treepo's roots, greso) spend
`group_size * (budget // group_size)` rollouts; the remainder (< group_size) is left
unspent rather than bending the group size. They also leave budget unspent when the
pool holds too few candidates. TRACE, the oracle and the ablation mixes spend the
root budget exactly (or raise `AllocationError` when it is infeasible).

Adding a policy = writing one class with `name`, `branching` (and `cost_aware`) and the
two methods, usually by subclassing `BaseAllocator`, then registering it (`ALLOCATORS[MyPolicy.name] = MyPolicy`); see docs/alloc.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, ClassVar

import numpy as np

from trace_gym.alloc.base import Candidate, PrefixCandidate, PrefixColumns
from trace_gym.alloc.solvers import (
    OBJECTIVES,
    root_increments,
    root_value,
    solve_prefixes,
    solve_prefixes_batch,
    solve_roots,
    solve_roots_costed,
    whole_number,
)
from trace_gym.errors import AllocationError, ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "BaseAllocator",
    "FlatAllocator",
    "GRESOAllocator",
    "GRPOAllocator",
    "KnapsackAllocator",
    "OracleAllocator",
    "PCLAllocator",
    "TraceAllocator",
    "TraceRootsRandomPrefixes",
    "TreePOAllocator",
    "UniformRootsTracePrefixes",
    "random_prefixes",
    "uniform_roots",
]


# ----------------------------------------------------------------------------- building blocks
def _check_pool(n: int, budget, what: str = "root") -> int:
    budget = whole_number(budget, f"{what} budget")
    if n == 0 and budget > 0:
        raise AllocationError(
            f"cannot spend a {what} budget of {budget} on an empty pool; pass candidates"
        )
    return budget


def uniform_roots(num: int, budget: int, group_size: int, rng: np.random.Generator) -> np.ndarray:
    """`group_size` rollouts for each of budget // group_size candidates drawn uniformly at random."""
    counts = np.zeros(num, dtype=np.int64)
    take = min(num, budget // group_size)
    counts[rng.permutation(num)[:take]] = group_size
    return counts


def random_prefixes(num: int, budget: int, rng: np.random.Generator) -> np.ndarray:
    """Each replay goes to a prefix chosen uniformly at random (with replacement)."""
    if num == 0:
        return np.zeros(0, dtype=np.int64)
    return np.bincount(rng.integers(num, size=budget), minlength=num).astype(np.int64)


def _prefix_split(
    prefixes: Sequence[PrefixCandidate],
    budget: float,
    *,
    use_true: bool,
    cost_aware: bool,
    posterior: bool = False,
) -> np.ndarray:
    """TRACE's prefix rule on predicted (or true) values; per-prefix costs when cost-aware.

    `posterior`: the posterior objective on each prefix's `concentration`.
    """
    if not prefixes:
        return np.zeros(0, dtype=np.int64)
    values, rewards, costs, conc = _prefix_inputs(prefixes, use_true, cost_aware, posterior)
    if cost_aware:
        return solve_prefixes(values, rewards, budget, costs, concentrations=conc).counts
    b = whole_number(budget, "prefix budget")
    return solve_prefixes(values, rewards, b, concentrations=conc).counts


def _prefix_inputs(
    prefixes: Sequence[PrefixCandidate], use_true: bool, cost_aware: bool, posterior: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, list | None]:
    """The solver's inputs read off the records: values (true ones for the oracle),
    rewards, costs (cost-aware only) and concentrations (the posterior objective only)."""
    if use_true:
        values = _column((_true(p, "prefix") for p in prefixes), len(prefixes), "true_value")
    else:
        values = _column(map(attrgetter("value"), prefixes), len(prefixes), "value")
    rewards = _column(map(attrgetter("reward"), prefixes), len(prefixes), "reward")
    costs = (
        _column(map(attrgetter("cost"), prefixes), len(prefixes), "cost") if cost_aware else None
    )
    conc = _concentrations(prefixes) if posterior and not use_true else None
    return values, rewards, costs, conc


def _column_inputs(
    cols: PrefixColumns, use_true: bool, cost_aware: bool, posterior: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """`_prefix_inputs` read off `PrefixColumns` (no record touched): the same arrays."""
    values = cols.value
    if use_true:
        if np.isnan(cols.true_value).any():
            _true(PrefixCandidate(0, 0, 1, 0.0, 0.0), "prefix")  # raises the oracle's error
        values = cols.true_value
    conc = cols.concentration if posterior and not use_true else None
    return values, cols.reward, cols.cost if cost_aware else None, conc


def _column(items, n: int, field: str) -> np.ndarray:
    """One numeric field of `n` records as a float array (one C-level pass, no list)."""
    try:
        return np.fromiter(items, float, n)
    except (TypeError, ValueError) as e:
        raise AllocationError(f"every prefix's {field} must be a number; {e}") from e


def _concentrations(records: Sequence[Candidate] | Sequence[PrefixCandidate]) -> list | None:
    """The records' concentrations, or None when every one is a point value."""
    conc = [r.concentration for r in records]
    return None if all(c is None for c in conc) else conc


def _true(record, what: str) -> float:
    if record.true_value is None:
        raise AllocationError(
            f"the oracle needs true success probabilities, but a {what} has none; only the "
            "simulator (trace/Sim-v0) provides them - use 'trace' on other envs"
        )
    return record.true_value


# ----------------------------------------------------------------------------- base classes
class BaseAllocator:
    """Common constructor for every policy; flat policies get zero replays.

    Declares the `Allocator` protocol's flags at their defaults: no replays
    (``branching = False``) and a prefix budget in replays (``cost_aware = False``).
    """

    name: ClassVar[str] = "flat"
    branching: ClassVar[bool] = False
    #: a plain attribute, not a ClassVar: `TraceAllocator` sets it per instance
    cost_aware: bool = False
    #: `allocate_prefixes_batch` takes `PrefixColumns` too (the runner then builds them)
    accepts_columns: ClassVar[bool] = True

    def __init__(self, *, m_max: int = 16, group_size: int = 8):
        if m_max < 2:
            raise ConfigError(f"m_max must be >= 2 (a kept prompt needs 2 rollouts); got {m_max}")
        if group_size < 2:
            raise ConfigError(
                f"group_size must be >= 2 (a group of one has no contrast); got {group_size}"
            )
        self.m_max = int(m_max)
        self.group_size = int(group_size)

    def allocate_roots(
        self, candidates: Sequence[Candidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        budget = _check_pool(len(candidates), budget)
        return uniform_roots(len(candidates), budget, self.group_size, rng)

    def allocate_prefixes(
        self, prefixes: Sequence[PrefixCandidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        return np.zeros(len(prefixes), dtype=np.int64)

    def allocate_prefixes_batch(
        self,
        prefixes: Sequence[Sequence[PrefixCandidate]] | PrefixColumns,
        budgets: Sequence[float],
        rngs: Sequence[np.random.Generator],
    ) -> list[np.ndarray]:
        """`allocate_prefixes` for every prompt, in order (`BatchPrefixAllocator`): on a list
        of record lists or on `PrefixColumns` (turned back into records here); a policy
        whose split vectorises across prompts overrides it (TRACE does)."""
        if isinstance(prefixes, PrefixColumns):
            prefixes = prefixes.records()
        return [
            self.allocate_prefixes(p, b, r)  # type: ignore[arg-type]
            for p, b, r in zip(prefixes, budgets, rngs, strict=True)
        ]

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


#: the base class's old name (kept as an alias)
FlatAllocator = BaseAllocator


class TraceAllocator(BaseAllocator):
    """TRACE (Zou et al. 2026, arXiv 2606.11119): both exact solvers on predicted values.

    Roots: m_i in {0, 2..m_max} with sum m_i = budget maximising the expected number of
    mixed groups sum (1 - v^m - (1 - v)^m) (`solve_roots`). Prefixes: the prompt's
    continuation budget split over its visited prefixes maximising sum (1 - q^k)
    (`solve_prefixes`). `cost_aware=True` declares that its prefix budget is in
    trajectory-equivalents and that each replay costs its prefix's `cost`: the runner
    then passes ``replays * replay_cost`` and each prefix's remaining-turn cost
    (`trace_gym.budget.Budget.prefix_budget`), and charges every replay that cost, so the
    count of replays may differ from the replay budget but the accounted cost cannot
    exceed it. `exact_budget=False` lets the root counts sum to less than the budget.
    Candidates whose rollouts cost differently (`Candidate.cost`, a multi-env mixture)
    are solved under sum cost x m <= budget instead (`solve_roots_costed`).

    `objective="posterior"` maximises the expected gains under each record's Beta belief
    (`Candidate.concentration`, `PrefixCandidate.concentration`; records without one
    keep the plug-in gain, so with a point-value predictor it is "plugin" exactly).
    `max_prompts` opens at most that many prompts per step (default None: no cap), so
    a comparison can hold distinct prompts equal to a fixed-group baseline's.
    """

    name: ClassVar[str] = "trace"
    branching: ClassVar[bool] = True
    use_true_roots: ClassVar[bool] = False
    use_true_prefixes: ClassVar[bool] = False

    def __init__(
        self,
        *,
        m_max: int = 16,
        group_size: int = 8,
        exact_budget: bool = True,
        cost_aware: bool = False,
        objective: str = "plugin",
        max_prompts: int | None = None,
    ):
        super().__init__(m_max=m_max, group_size=group_size)
        if objective not in OBJECTIVES:
            raise ConfigError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        if max_prompts is not None and (isinstance(max_prompts, bool) or int(max_prompts) < 1):
            raise ConfigError(f"max_prompts must be None or an integer >= 1, got {max_prompts!r}")
        self.exact_budget = bool(exact_budget)
        self.cost_aware = bool(cost_aware)
        self.objective = objective
        self.max_prompts = None if max_prompts is None else int(max_prompts)

    def allocate_roots(
        self, candidates: Sequence[Candidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        budget = _check_pool(len(candidates), budget)
        if not candidates:
            return np.zeros(0, dtype=np.int64)
        values = [_true(c, "candidate") if self.use_true_roots else c.value for c in candidates]
        posterior = self.objective == "posterior" and not self.use_true_roots
        conc = _concentrations(candidates) if posterior else None
        costs = [c.cost for c in candidates]
        if any(abs(x - 1.0) > 1e-12 for x in costs):  # a mixture: sum(cost x rollouts) <= budget
            if self.max_prompts is not None:
                raise AllocationError(
                    "max_prompts is not supported with per-candidate rollout costs (a mixture "
                    "with rollout_cost != 'flat'); drop max_prompts or use flat costs"
                )
            return solve_roots_costed(
                values, costs, float(budget), self.m_max, concentrations=conc
            ).counts
        return solve_roots(
            values,
            budget,
            self.m_max,
            exact_budget=self.exact_budget,
            concentrations=conc,
            max_prompts=self.max_prompts,
        ).counts

    def allocate_prefixes(
        self, prefixes: Sequence[PrefixCandidate], budget: float, rng: np.random.Generator
    ) -> np.ndarray:
        return _prefix_split(
            prefixes,
            budget,
            use_true=self.use_true_prefixes,
            cost_aware=self.cost_aware,
            posterior=self.objective == "posterior",
        )

    def allocate_prefixes_batch(
        self,
        prefixes: Sequence[Sequence[PrefixCandidate]] | PrefixColumns,
        budgets: Sequence[float],
        rngs: Sequence[np.random.Generator],
    ) -> list[np.ndarray]:
        """Every prompt's `allocate_prefixes` at once (`solve_prefixes_batch`): same counts.

        `PrefixColumns` are read as they are; record lists one `np.fromiter` per field."""
        if type(self).allocate_prefixes is not TraceAllocator.allocate_prefixes:
            return super().allocate_prefixes_batch(prefixes, budgets, rngs)  # own prefix rule
        posterior = self.objective == "posterior"
        inputs: tuple[np.ndarray, np.ndarray, np.ndarray | None, Any]
        if isinstance(prefixes, PrefixColumns):
            sizes: Any = prefixes.sizes
            inputs = _column_inputs(prefixes, self.use_true_prefixes, self.cost_aware, posterior)
        else:
            flat = [p for ps in prefixes for p in ps]
            sizes = [len(ps) for ps in prefixes]
            inputs = _prefix_inputs(flat, self.use_true_prefixes, self.cost_aware, posterior)
        values, rewards, costs, conc = inputs
        if not len(values):
            return [np.zeros(0, dtype=np.int64) for _ in range(len(prefixes))]
        batch = solve_prefixes_batch(
            values, rewards, sizes, list(budgets), costs, concentrations=conc
        )
        return batch.per_prompt()


class OracleAllocator(TraceAllocator):
    """Oracle (docs/alloc.md "The policies"): the TRACE rule on true probabilities.

    Needs `Candidate.true_value` / `PrefixCandidate.true_value`, which only the simulator
    provides: the upper bound every learned allocator is measured against.
    """

    name: ClassVar[str] = "oracle"
    use_true_roots: ClassVar[bool] = True
    use_true_prefixes: ClassVar[bool] = True


class TraceRootsRandomPrefixes(TraceAllocator):
    """Ablation "adaptive / uniform" (TRACE paper, Table on prompt/prefix stages): TRACE roots, random prefixes."""

    name: ClassVar[str] = "trace_roots_random_prefixes"

    def allocate_prefixes(
        self, prefixes: Sequence[PrefixCandidate], budget: float, rng: np.random.Generator
    ) -> np.ndarray:
        return random_prefixes(len(prefixes), whole_number(budget, "prefix budget"), rng)


class UniformRootsTracePrefixes(TraceAllocator):
    """Ablation "uniform / adaptive" (TRACE paper): fixed groups at random, TRACE prefix split."""

    name: ClassVar[str] = "uniform_roots_trace_prefixes"

    def allocate_roots(
        self, candidates: Sequence[Candidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        budget = _check_pool(len(candidates), budget)
        return uniform_roots(len(candidates), budget, self.group_size, rng)


class TreePOAllocator(BaseAllocator):
    """TreePO as the TRACE paper runs it (docs/alloc.md "The policies"): same trees, random branch points.

    Roots: `group_size` rollouts for as many randomly drawn prompts as the budget allows;
    prefixes: every replay picks a visited prefix uniformly at random. This is also the
    paper's "uniform / uniform" ablation row.
    """

    name: ClassVar[str] = "treepo"
    branching: ClassVar[bool] = True

    def allocate_prefixes(
        self, prefixes: Sequence[PrefixCandidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        return random_prefixes(len(prefixes), whole_number(budget, "prefix budget"), rng)


class GRPOAllocator(BaseAllocator):
    """GRPO / uniform (Shao et al. 2024, DeepSeekMath): a fixed group per prompt, no branching.

    `group_size` rollouts for each of budget // group_size prompts drawn uniformly at
    random from the pool (the pool order never biases the batch).
    """

    name: ClassVar[str] = "grpo"


class PCLAllocator(BaseAllocator):
    """PCL, Prompt Curriculum Learning (Gao et al. 2025, arXiv 2510.01135).

    Wants m = budget // group_size prompts: draws a pool of k * m candidates at random
    (all of them if fewer), keeps the m whose predicted value is closest to 0.5 (ties to
    the earlier draw) and gives each a fixed group of `group_size`.
    """

    name: ClassVar[str] = "pcl"

    def __init__(self, *, m_max: int = 16, group_size: int = 8, pool_factor: int = 4):
        super().__init__(m_max=m_max, group_size=group_size)
        if pool_factor < 1:
            raise ConfigError(f"pool_factor (k of the k*m pool) must be >= 1; got {pool_factor}")
        self.pool_factor = int(pool_factor)

    def allocate_roots(
        self, candidates: Sequence[Candidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        budget = _check_pool(len(candidates), budget)
        n = len(candidates)
        want = min(n, budget // self.group_size)
        pool = rng.permutation(n)[: self.pool_factor * want]
        distance = np.abs(np.array([candidates[i].value for i in pool]) - 0.5)
        keep = pool[np.argsort(distance, kind="stable")[:want]]
        counts = np.zeros(n, dtype=np.int64)
        counts[keep] = self.group_size
        return counts


class GRESOAllocator(BaseAllocator):
    """GRESO, selective rollouts (Zheng et al. 2025, "Act Only When It Pays", arXiv 2506.02177).

    A prompt whose last c visits were all-correct is kept with probability
    max(p_easy^c, p_min) (all-wrong: p_hard); others are always kept. The kept prompts,
    in random order, fill budget // group_size fixed groups. Before each allocation
    p_easy (p_hard) moves by `step` toward `target_easy` (`target_hard`): down when the
    share of visited candidates whose last visit was all-correct (all-wrong) is above
    the target, up otherwise. This history-based estimate of the zero-variance ratio is
    our reading; the defaults are ours. The policy is stateful (p_easy, p_hard).
    """

    name: ClassVar[str] = "greso"

    def __init__(
        self,
        *,
        m_max: int = 16,
        group_size: int = 8,
        p_easy: float = 0.5,
        p_hard: float = 0.5,
        target_easy: float = 0.125,
        target_hard: float = 0.125,
        step: float = 0.01,
        p_min: float = 0.01,
    ):
        super().__init__(m_max=m_max, group_size=group_size)
        for key, val in dict(
            p_easy=p_easy,
            p_hard=p_hard,
            target_easy=target_easy,
            target_hard=target_hard,
            p_min=p_min,
        ).items():
            if not 0.0 <= val <= 1.0:
                raise ConfigError(f"{key} must be a probability in [0, 1]; got {val}")
        self.p_easy, self.p_hard = float(p_easy), float(p_hard)
        self.target_easy, self.target_hard = float(target_easy), float(target_hard)
        self.step, self.p_min = float(step), float(p_min)

    def _adapt(self, candidates: Sequence[Candidate]) -> None:
        visited = [c.history for c in candidates if c.history.visits]
        if not visited:
            return
        easy = float(np.mean([h.all_success_streak > 0 for h in visited]))
        hard = float(np.mean([h.all_failure_streak > 0 for h in visited]))
        self.p_easy = self._toward(self.p_easy, easy, self.target_easy)
        self.p_hard = self._toward(self.p_hard, hard, self.target_hard)

    def _toward(self, p: float, ratio: float, target: float) -> float:
        # too many zero-variance prompts got through: keep fewer of them (lower p)
        p = p - self.step if ratio > target else p + self.step
        return float(min(max(p, self.p_min), 1.0))

    def keep_probability(self, candidate: Candidate) -> float:
        """Chance that `candidate` survives the pre-rollout filter."""
        h = candidate.history
        if h.all_success_streak > 0:
            return max(self.p_easy**h.all_success_streak, self.p_min)
        if h.all_failure_streak > 0:
            return max(self.p_hard**h.all_failure_streak, self.p_min)
        return 1.0

    def allocate_roots(
        self, candidates: Sequence[Candidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        budget = _check_pool(len(candidates), budget)
        self._adapt(candidates)
        n = len(candidates)
        order = rng.permutation(n)
        keep = rng.random(n) < np.array([self.keep_probability(candidates[i]) for i in order])
        chosen = order[keep][: budget // self.group_size]
        counts = np.zeros(n, dtype=np.int64)
        counts[chosen] = self.group_size
        return counts


class KnapsackAllocator(BaseAllocator):
    """Knapsack-RL (Li et al. 2025, "Knapsack RL", arXiv 2509.25849): value-weighted rollout counts.

    Value of N rollouts for a prompt with success rate p:
    (1 - p^N - (1 - p)^N) * p (1 - p)^2, p from the prompt's last visit (the predicted
    value for a prompt never visited - our choice). Every prompt with 0 < p < 1 gets at
    least 2 (the best ones by value at N = 2 when the budget cannot cover all), then
    the rest is distributed up to m_max; per prompt the value is concave for N >= 2, so
    taking the largest marginal values is the exact optimum of that DP. Prompts with
    p in {0, 1} get nothing; budget beyond every prompt's m_max stays unspent.
    """

    name: ClassVar[str] = "knapsack"

    @staticmethod
    def success_rate(candidate: Candidate) -> float:
        last = candidate.history.last_mean
        return candidate.value if last is None else last

    def allocate_roots(
        self, candidates: Sequence[Candidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        budget = _check_pool(len(candidates), budget)
        n = len(candidates)
        counts = np.zeros(n, dtype=np.int64)
        p = np.array([self.success_rate(c) for c in candidates], dtype=float)
        eligible = np.flatnonzero((p > 0) & (p < 1))
        if eligible.size == 0 or budget < 2:
            return counts
        weight = p * (1 - p) ** 2
        first = weight[eligible] * root_value(p[eligible], 2)
        chosen = eligible[np.argsort(-first, kind="stable")[: budget // 2]]
        counts[chosen] = 2
        rest = budget - 2 * chosen.size
        if rest and self.m_max > 2:
            gains = (
                weight[chosen, None] * root_increments(p[chosen], self.m_max)[:, 2:]
            )  # steps 3..m_max
            flat = gains.ravel()
            top = np.argsort(-flat, kind="stable")[:rest]  # concave rows: top gains form prefixes
            counts[chosen] += np.bincount(top // gains.shape[1], minlength=chosen.size)
        return counts
