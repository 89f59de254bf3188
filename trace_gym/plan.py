"""Stages 1-2 and 4 of a runner step: what gets budget, pure of execution.

The planner runs no env and no policy. Its functions read the step (`StepContext`, the
trees of finished roots) and *return* their decisions; they change no record they did
not build:

- `allocate_roots`: score the candidate prompts and allocate the root rollouts (a
  `RootAllocation`); `root_works` builds one fresh `PromptWork` per selected prompt (a
  new tree with the root's value and allocation info, and its root `Episode`s);
  `plan_roots` is the two in one; before the predictor has any data
  (`StepContext.cold_start`) roots go uniformly in the allocator's fixed groups
  (`uniform_roots`), except for allocators on true values (`cold_uniform`);
- `replay_shares`: share the step's continuation budget over the selected prompts in
  proportion to their root counts (largest remainder, sums exactly); in a mixture with
  per-env rollout costs, its cost in proportion to the cost-weighted roots, each replay
  costing its env's rollout cost times the replay cost (`split_costed_budget`);
- `plan_replays`: score one prompt's prefixes and allocate its replays (a `ReplayPlan`:
  prefix values, the replay `Episode`s, each replay's charge).

Two functions apply a decision, each through the records' own methods: `expand` (the
scheduler's ``on_roots_done`` hook) is `plan_replays` then `PromptWork.take_replays`,
which writes the prefix values into the tree and the charges into the step's report;
`split_replays` writes each work's ``replay_budget``. The runner (`trace_gym.runner`)
does the rest: it records the plan in the report and the skipped candidates (for the
viewer) on the step's first tree.

Every allocator answer is checked here: counts of the wrong shape or sign (or a
cost-aware split that spends more than its budget) raise `AllocationError`, which is
mid-step (rollouts may already have run), not a configuration error.

Randomness: the root allocation draws from (seed, step), each prompt's prefix
allocation from (seed, step, prompt id), and every replay's env seed is its branch
seed, so a plan does not depend on how its execution is batched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from trace_gym.alloc import split_budget, split_costed_budget
from trace_gym.alloc.base import (
    BatchPrefixAllocator,
    Candidate,
    PrefixCandidate,
    PrefixColumns,
    VisitHistory,
)
from trace_gym.alloc.candidates import prefix_candidates, walk_prefixes
from trace_gym.alloc.policies import uniform_roots
from trace_gym.budget import Stopwatch
from trace_gym.errors import AllocationError
from trace_gym.mixture import env_id_of  # re-exported (its home is the mixture now)
from trace_gym.predict.base import Predictor, State, UncertainPredictor
from trace_gym.seeding import branch_seed, stable_seed
from trace_gym.step import Episode, EpisodeSpec, PromptWork, ReplayPlan, StepContext
from trace_gym.tree import RolloutTree, success_threshold_for

__all__ = [
    "Described",
    "RootAllocation",
    "allocate_roots",
    "concentration_fn",
    "cold_uniform",
    "env_id_of",
    "expand",
    "is_cost_aware",
    "plan_replays",
    "plan_roots",
    "predictor_fn",
    "prefix_nodes",
    "replay_shares",
    "root_works",
    "split_replays",
]

log = logging.getLogger(__name__)

#: cost-aware splits may overspend by rounding only
_COST_TOLERANCE = 1e-9


class Described(NamedTuple):
    """A candidate prompt as the env describes it at reset."""

    task_id: str
    prompt: str
    reset_info: dict[str, Any]
    #: exact success probability (simulator only)
    true_value: float | None


def predictor_fn(
    predictor: Predictor | None, stopwatch: Stopwatch
) -> Callable[[list[State]], np.ndarray]:
    """The step's ``predict``: values in [0, 1], 0.5 everywhere without a predictor."""

    def predict(states: list[State]) -> np.ndarray:
        if predictor is None or not states:
            return np.full(len(states), 0.5)
        with stopwatch("predictor"):
            v = np.asarray(predictor.predict(states), dtype=float)
        return np.clip(v, 0.0, 1.0)

    return predict


def concentration_fn(
    predictor: Predictor | None, stopwatch: Stopwatch
) -> Callable[[list[State]], np.ndarray] | None:
    """The step's ``concentration`` for an `UncertainPredictor` (None for point predictors)."""
    if not isinstance(predictor, UncertainPredictor):
        return None

    def concentration(states: list[State]) -> np.ndarray:
        with stopwatch("predictor"):
            return np.asarray(predictor.concentration(states), dtype=float)

    return concentration


def is_cost_aware(allocator: Any) -> bool:
    """Whether `allocator` spends a cost budget on prefixes that each carry their own cost."""
    return bool(allocator.cost_aware)


def _name(allocator: Any) -> str:
    return repr(getattr(allocator, "name", allocator))


def _check_counts(counts: Any, n: int, allocator: Any, what: str) -> np.ndarray:
    out = np.asarray(counts, dtype=int)
    if out.shape != (n,) or (out < 0).any():
        raise AllocationError(
            f"allocator {_name(allocator)} returned {what} counts of shape {out.shape} "
            f"(need {n} non-negative ints, one per record, in order)"
        )
    return out


# ---------------------------------------------------------------------- roots
class RootAllocation(NamedTuple):
    """The root decision of one step: each candidate, its env and its root rollouts."""

    candidates: list[Candidate]
    #: root rollouts per candidate, in candidate order
    counts: np.ndarray
    #: each candidate's env id (its mixture member, or the pool's env)
    env_ids: list[str]

    @property
    def skipped(self) -> list[list[Any]]:
        """[id, value] of every candidate that got no rollout (the viewer's skipped list)."""
        return [
            [c.id, c.value] for c, m in zip(self.candidates, self.counts, strict=True) if m == 0
        ]


def plan_roots(
    ctx: StepContext, described: Sequence[Described], history: Mapping[str, VisitHistory]
) -> list[PromptWork]:
    """Score and allocate the root rollouts; one fresh `PromptWork` per selected prompt."""
    return root_works(ctx, described, allocate_roots(ctx, described, history))


def allocate_roots(
    ctx: StepContext, described: Sequence[Described], history: Mapping[str, VisitHistory]
) -> RootAllocation:
    """Score the candidates and ask the allocator for their root rollouts (checked)."""
    env_ids = [ctx.pool.task_env_id(d.reset_info) for d in described]
    states = [State(d.task_id, d.prompt, (), e) for d, e in zip(described, env_ids, strict=True)]
    values = ctx.predict(states)
    costs = ctx.root_costs(env_ids) if ctx.root_costs is not None else [1.0] * len(described)
    conc = _concentrations(ctx, states)
    cands = [
        Candidate(
            id=d.task_id,
            value=float(v),
            history=history.get(d.task_id, VisitHistory()),
            true_value=d.true_value,
            cost=float(c),
            concentration=k,
        )
        for d, v, c, k in zip(described, values, costs, conc, strict=True)
    ]
    rng = np.random.default_rng(stable_seed("roots", ctx.seed, ctx.step))
    with ctx.stopwatch("allocator"):
        if cold_uniform(ctx):
            group = int(getattr(ctx.allocator, "group_size", 8))  # the baseline's groups
            raw = uniform_roots(len(cands), ctx.budget.roots, group, rng)
        else:
            raw = ctx.allocator.allocate_roots(cands, ctx.budget.roots, rng)
    counts = _check_counts(raw, len(cands), ctx.allocator, "root")
    spent = float(counts @ np.asarray(costs, dtype=float)) if len(cands) else 0.0
    if spent > ctx.budget.roots + 1e-6 or (
        ctx.root_costs is None and counts.sum() != ctx.budget.roots
    ):
        log.warning(
            "allocator placed %d root rollouts costing %.4g of a budget of %d",
            counts.sum(),
            spent,
            ctx.budget.roots,
        )
    return RootAllocation(cands, counts, env_ids)


def root_works(
    ctx: StepContext, described: Sequence[Described], allocation: RootAllocation
) -> list[PromptWork]:
    """One fresh `PromptWork` (a new tree and its root `Episode`s) per selected candidate."""
    works: list[PromptWork] = []
    for cand, d, m, e in zip(
        allocation.candidates, described, allocation.counts, allocation.env_ids, strict=True
    ):
        if m > 0:
            works.append(_root_work(ctx, len(works), cand, d, int(m), e))
    return works


def _concentrations(ctx: StepContext, states: list[State]) -> list[float | None]:
    """Each state's Beta concentration (None everywhere for a point predictor)."""
    if ctx.concentration is None or not states:
        return [None] * len(states)
    return [float(x) for x in ctx.concentration(states)]


def cold_uniform(ctx: StepContext) -> bool:
    """Whether the roots go uniformly this step: the predictor has no data yet and the
    allocator ranks on predicted values (not true ones; `cold_start_uniform` overrides)."""
    a = ctx.allocator
    default = not getattr(a, "use_true_roots", False)
    return ctx.cold_start and bool(getattr(a, "cold_start_uniform", default))


def _root_work(
    ctx: StepContext, order: int, cand: Candidate, d: Described, m: int, env_id: str
) -> PromptWork:
    tree = RolloutTree(
        cand.id,
        d.prompt,
        env_id=env_id,
        step=ctx.step,
        success_threshold=success_threshold_for(d.reset_info),
    )
    tree.root.value = cand.value
    tree.root.true_value = cand.true_value
    tree.info.update(root_count=m, candidate_value=cand.value)
    if cand.cost != 1.0:
        tree.info["rollout_cost"] = cand.cost
    w = PromptWork(order=order, tree=tree)
    w.roots = [
        Episode(
            w,
            EpisodeSpec(
                kind="rollout",
                anchor=0,
                child=i,
                prompt=d.prompt,
                reset_info=d.reset_info,
                env_seed=branch_seed(ctx.step, cand.id, 0, i, turn=0, base=ctx.seed),
            ),
        )
        for i in range(m)
    ]
    return w


def split_replays(ctx: StepContext, works: Sequence[PromptWork]) -> int:
    """Give each prompt its share of the step's replays; returns the step's replay budget.

    Flat allocators (``branching = False``) get none. Writes each work's ``replay_budget``
    (the shares of `replay_shares`).
    """
    total, shares = replay_shares(ctx, works)
    for w, b in zip(works, shares, strict=True):
        w.replay_budget = b
    return total


def root_cost(w: PromptWork) -> float:
    """Cost of one of the prompt's rollouts relative to the step's mean (1 unless a mixture)."""
    return float(w.tree.info.get("rollout_cost", 1.0))


def replay_shares(ctx: StepContext, works: Sequence[PromptWork]) -> tuple[int, list[int]]:
    """The step's replay budget and each prompt's share of it, by root count (changes nothing).

    With per-env rollout costs (a mixture) a replay of prompt i costs its c_i times a flat
    one, and the budget's cost is shared by cost-weighted roots (`split_costed_budget`):
    the shares then sum to at most the budget, spending at most its cost. Flat allocators
    (``branching = False``) get none.
    """
    branching = bool(ctx.allocator.branching)
    total = ctx.budget.replays if branching and works else 0
    if not total:
        return 0, [0] * len(works)
    with ctx.stopwatch("allocator"):
        roots = [len(w.roots) for w in works]
        costs = [root_cost(w) for w in works]
        if any(c != 1.0 for c in costs):
            shares = split_costed_budget(roots, costs, total)
        else:
            shares = split_budget(roots, total)
    return total, [int(b) for b in shares]


# ---------------------------------------------------------------------- prefixes
def expand(ctx: StepContext, w: PromptWork) -> list[Episode]:
    """The scheduler's hook: `plan_replays`, recorded by `PromptWork.take_replays`; the replays."""
    return w.take_replays(plan_replays(ctx, w), ctx.report)


def plan_replays(ctx: StepContext, w: PromptWork) -> ReplayPlan:
    """Score `w`'s prefixes and allocate its replays (changes nothing)."""
    return plan_replays_batch(ctx, [w], batched=False)[0]


def expand_all(ctx: StepContext, works: Sequence[PromptWork]) -> list[list[Episode]]:
    """The scheduler's global-expansion hook: `plan_replays_batch` over every held prompt,
    each recorded by `PromptWork.take_replays`; each prompt's replays, in order."""
    plans = plan_replays_batch(ctx, works)
    return [w.take_replays(p, ctx.report) for w, p in zip(works, plans, strict=True)]


def plan_replays_batch(
    ctx: StepContext, works: Sequence[PromptWork], *, batched: bool = True
) -> list[ReplayPlan]:
    """`plan_replays` of many prompts with one predictor call and, for an allocator that is
    a `BatchPrefixAllocator` (and `batched`), one allocator call: the same plans. An
    allocator that ``accepts_columns`` gets `PrefixColumns` (`_plan_columns`)."""
    if batched and len(works) > 1 and getattr(ctx.allocator, "accepts_columns", False):
        return _plan_columns(ctx, works)
    todo = [(w, prefix_nodes(w.tree)) for w in works]
    todo = [(w, ids) for w, ids in todo if w.replay_budget > 0 and ids]
    states = [
        State(
            w.tree.prompt_id,
            w.tree.prompt,
            tuple((t.action, t.observation) for t in w.tree.turns(n)),
            w.tree.env_id,
        )
        for w, ids in todo
        for n in ids
    ]
    flat_values = list(ctx.predict(states)) if states else []
    flat_conc: Sequence[float | None] = _concentrations(ctx, states) if states else []
    records, at = [], 0
    for w, ids in todo:
        values = {n: float(v) for n, v in zip(ids, flat_values[at : at + len(ids)], strict=True)}
        conc = dict(zip(ids, flat_conc[at : at + len(ids)], strict=True))
        records.append((w, values, *_prefix_records(ctx, w, values, conc)))
        at += len(ids)
    counts = _allocate_all(ctx, [r[2:] for r in records], batched)
    plans = {}
    for (w, values, cands, budget, _), c in zip(records, counts, strict=True):
        costs = np.array([x.cost for x in cands])
        checked = _checked_prefix_counts(ctx, w, costs, c, budget)
        rows = [(x.node, x.rollout, x.cost) for x in cands]
        plans[id(w)] = ReplayPlan(values, *_replay_episodes(ctx, w, rows, checked))
    return [plans.get(id(w), ReplayPlan({}, [], [])) for w in works]


def _plan_columns(ctx: StepContext, works: Sequence[PromptWork]) -> list[ReplayPlan]:
    """`plan_replays_batch` through `PrefixColumns`: one walk of the trees gives the
    prefixes as arrays (`walk_prefixes`, the rows `prefix_candidates` gives), one predictor
    call their values, one allocator call the counts: the same plans as the records'."""
    live = [w for w in works if w.replay_budget > 0]
    walk = walk_prefixes([w.tree for w in live])
    sizes = np.diff(walk.bounds)
    live = [w for w, k in zip(live, sizes.tolist(), strict=True) if k]
    walk = walk._replace(bounds=np.r_[0, np.cumsum(sizes[sizes > 0])])
    b, nodes = walk.bounds.tolist(), walk.node.tolist()
    states = [
        State(w.tree.prompt_id, w.tree.prompt, _turn_pairs(w.tree, n), w.tree.env_id)
        for w, lo, hi in zip(live, b[:-1], b[1:], strict=True)
        for n in nodes[lo:hi]
    ]
    values = np.asarray(ctx.predict(states) if states else [], dtype=float)
    cost_aware = is_cost_aware(ctx.allocator)
    cols = walk.columns(
        values,
        [ctx.budget.prefix_cost(cost_aware, root_cost(w)) for w in live],
        _concentrations(ctx, states) if states else None,
    )
    budgets = [ctx.budget.prefix_budget(w.replay_budget, cost_aware, root_cost(w)) for w in live]
    rngs = [
        np.random.default_rng(stable_seed("prefixes", ctx.seed, ctx.step, w.tree.prompt_id))
        for w in live
    ]
    counts = _allocate_batch(ctx, cols, budgets, rngs)
    vals, rollouts, costs = values.tolist(), cols.rollout.tolist(), cols.cost.tolist()
    plans = {}
    for g, w in enumerate(live):
        lo, hi = b[g], b[g + 1]
        checked = _checked_prefix_counts(ctx, w, cols.cost[lo:hi], counts[g], budgets[g])
        rows = list(zip(nodes[lo:hi], rollouts[lo:hi], costs[lo:hi], strict=True))
        plan_values = dict(zip(nodes[lo:hi], vals[lo:hi], strict=True))
        plans[id(w)] = ReplayPlan(plan_values, *_replay_episodes(ctx, w, rows, checked))
    return [plans.get(id(w), ReplayPlan({}, [], [])) for w in works]


def _turn_pairs(tree: RolloutTree, node: int) -> tuple[tuple[str, str], ...]:
    """The (action, observation) of every turn up to `node`: a prefix `State`'s history."""
    return tuple((t.action, t.observation) for t in tree.turns(node))


def _prefix_records(
    ctx: StepContext, w: PromptWork, values: Mapping[int, float], conc: Mapping[int, float | None]
) -> tuple[list[PrefixCandidate], float, np.random.Generator]:
    """The prompt's prefix records (with `conc`, node -> Beta concentration), its prefix
    budget and the allocator's random stream for it."""
    tree, cost_aware = w.tree, is_cost_aware(ctx.allocator)
    leaves = [_chain_leaf(tree, first) for first in tree.root.children]
    scale = root_cost(w)
    cost = ctx.budget.prefix_cost(cost_aware, scale)
    cands = prefix_candidates(tree, leaves, values, cost=cost)
    if conc and any(k is not None for k in conc.values()):
        cands = [replace(c, concentration=conc.get(c.node)) for c in cands]
    budget = ctx.budget.prefix_budget(w.replay_budget, cost_aware, scale)
    rng = np.random.default_rng(stable_seed("prefixes", ctx.seed, ctx.step, tree.prompt_id))
    return cands, budget, rng


def _allocate_all(
    ctx: StepContext,
    records: Sequence[tuple[list[PrefixCandidate], float, np.random.Generator]],
    batched: bool,
) -> list[Any]:
    """The allocator's raw replays per prefix for each (cands, budget, rng) record."""
    allocator = ctx.allocator
    if batched and len(records) > 1 and isinstance(allocator, BatchPrefixAllocator):
        cands, budgets, rngs = (list(x) for x in zip(*records, strict=True))
        return _allocate_batch(ctx, cands, budgets, rngs)
    with ctx.stopwatch("allocator"):
        return [allocator.allocate_prefixes(c, b, r) for c, b, r in records]


def _allocate_batch(
    ctx: StepContext,
    prefixes: Sequence[list[PrefixCandidate]] | PrefixColumns,
    budgets: list[float],
    rngs: list[np.random.Generator],
) -> list[Any]:
    """One `allocate_prefixes_batch` call (records or columns), its answer's shape checked."""
    allocator = ctx.allocator
    with ctx.stopwatch("allocator"):
        raw = allocator.allocate_prefixes_batch(prefixes, budgets, rngs)
    if not isinstance(raw, list) or len(raw) != len(budgets):
        raise AllocationError(
            f"allocator {_name(allocator)}.allocate_prefixes_batch returned "
            f"{type(raw).__name__} for {len(budgets)} prompts; expected a list of "
            "one count array per prompt"
        )
    return raw


def _checked_prefix_counts(
    ctx: StepContext, w: PromptWork, costs: np.ndarray, raw: Any, budget: float
) -> np.ndarray:
    """The allocator's replays for `w` (one per prefix, whose replay `costs` are given),
    checked (shape, and a cost-aware budget kept)."""
    allocator = ctx.allocator
    counts = _check_counts(raw, len(costs), allocator, "prefix")
    if is_cost_aware(allocator):
        spent = float(counts @ costs) if len(costs) else 0.0
        if spent > budget + _COST_TOLERANCE:
            raise AllocationError(
                f"cost-aware allocator {_name(allocator)} spent {spent:.6g} trajectory-"
                f"equivalents on prompt {w.tree.prompt_id!r}, over its budget of {budget:.6g}"
            )
    return counts


def _replay_episodes(
    ctx: StepContext,
    w: PromptWork,
    rows: Sequence[tuple[int, int, float]],
    counts: np.ndarray,
) -> tuple[list[Episode], list[tuple[int, float]]]:
    """One replay `Episode` per allocated count, in prefix then child order, and its charge;
    `rows` gives each prefix's (node, rollout, cost)."""
    tree = w.tree
    out: list[Episode] = []
    charges: list[tuple[int, float]] = []
    for (anchor, rollout, cost), k in zip(rows, counts.tolist(), strict=True):
        if not k:
            continue
        node = tree.nodes[anchor]
        prefix_turns = tuple(tree.turns(anchor))
        root_ep = w.roots[rollout]
        for j in range(int(k)):
            child = len(node.children) + j
            seed = branch_seed(ctx.step, tree.prompt_id, anchor, child, turn=0, base=ctx.seed)
            spec = EpisodeSpec(
                kind="replay",
                anchor=anchor,
                child=child,
                prompt=root_ep.prompt,
                reset_info=root_ep.reset_info,
                env_seed=seed,
                prefix_turns=prefix_turns,
            )
            out.append(Episode(w, spec))
            charges.append((node.depth, cost))
    return out, charges


def _chain_leaf(tree: RolloutTree, node_id: int) -> int:
    """The leaf at the end of the single-child chain starting at `node_id`."""
    while tree.nodes[node_id].children:
        node_id = tree.nodes[node_id].children[0]
    return node_id


def prefix_nodes(tree: RolloutTree) -> list[int]:
    """Node ids of every replayable prefix of the root rollouts, rollout by rollout.

    Prefixes are the turn boundaries strictly inside a finished, non-failed rollout:
    after turn 1 up to before its last turn (docs/runner.md "What one step does").
    """
    out = []
    for first in tree.root.children:
        leaf = tree.nodes[_chain_leaf(tree, first)]
        if leaf.reward is not None:
            out += [n.id for n in tree.path(leaf.id)[:-1]]
    return out
