"""Stages 1-2 and 4 of a runner step: what gets budget, pure of execution.

- `plan_roots`: score the candidate prompts, allocate the root rollouts, and return
  one `PromptWork` (a fresh tree and its root `Episode`s) per selected prompt;
- `split_replays`: share the step's continuation budget over the selected prompts in
  proportion to their root counts (largest remainder, sums exactly);
- `expand`: the scheduler's ``on_roots_done`` hook - score one prompt's prefixes,
  allocate its replays and return them as `Episode`s to queue.

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
from typing import Any, NamedTuple

import numpy as np

from trace_gym.alloc import split_budget
from trace_gym.alloc.base import Candidate, PrefixCandidate, VisitHistory
from trace_gym.alloc.candidates import prefix_candidates
from trace_gym.budget import Stopwatch
from trace_gym.errors import AllocationError
from trace_gym.mixture import MEMBER_KEY
from trace_gym.predict.base import Predictor, State
from trace_gym.scheduling import Episode, PromptWork, StepContext
from trace_gym.seeding import branch_seed, stable_seed
from trace_gym.tree import RolloutTree, success_threshold_for

__all__ = [
    "Described",
    "expand",
    "env_id_of",
    "is_cost_aware",
    "plan_roots",
    "predictor_fn",
    "prefix_nodes",
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


def is_cost_aware(allocator: Any) -> bool:
    """Whether `allocator` spends a cost budget on prefixes that each carry their own cost."""
    return bool(getattr(allocator, "cost_aware", False))


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
def plan_roots(
    ctx: StepContext, described: Sequence[Described], history: Mapping[str, VisitHistory]
) -> list[PromptWork]:
    """Score and allocate the root rollouts; one `PromptWork` per selected prompt."""
    env_ids = [env_id_of(d, ctx.pool.env_id) for d in described]
    states = [State(d.task_id, d.prompt, (), e) for d, e in zip(described, env_ids, strict=True)]
    values = ctx.predict(states)
    costs = ctx.root_costs(env_ids) if ctx.root_costs is not None else [1.0] * len(described)
    cands = [
        Candidate(
            id=d.task_id,
            value=float(v),
            history=history.get(d.task_id, VisitHistory()),
            true_value=d.true_value,
            cost=float(c),
        )
        for d, v, c in zip(described, values, costs, strict=True)
    ]
    rng = np.random.default_rng(stable_seed("roots", ctx.seed, ctx.step))
    with ctx.stopwatch("allocator"):
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
    works: list[PromptWork] = []
    for cand, d, m, e in zip(cands, described, counts, env_ids, strict=True):
        if m > 0:
            works.append(_root_work(ctx, len(works), cand, d, int(m), e))
    if works:  # once per step, on its first tree: the pool's skipped candidates (trace-gym view)
        works[0].tree.info["skipped_candidates"] = [
            [c.id, c.value] for c, m in zip(cands, counts, strict=True) if m == 0
        ]
    return works


def env_id_of(d: Described, default: str) -> str:
    """The env a task belongs to: its mixture member (`trace_gym.mixture`) or the pool's env."""
    return str(d.reset_info.get(MEMBER_KEY) or default)


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
            work=w,
            kind="rollout",
            anchor=0,
            child=i,
            prompt=d.prompt,
            reset_info=d.reset_info,
            env_seed=branch_seed(ctx.step, cand.id, 0, i, turn=0, base=ctx.seed),
        )
        for i in range(m)
    ]
    return w


def split_replays(ctx: StepContext, works: Sequence[PromptWork]) -> int:
    """Give each prompt its share of the step's replays; returns the step's replay budget.

    Flat allocators (``branching = False``) get none.
    """
    branching = bool(getattr(ctx.allocator, "branching", True))
    total = ctx.budget.replays if branching and works else 0
    if total:
        with ctx.stopwatch("allocator"):
            shares = split_budget([len(w.roots) for w in works], total)
        for w, b in zip(works, shares, strict=True):
            w.replay_budget = int(b)
    return total


# ---------------------------------------------------------------------- prefixes
def expand(ctx: StepContext, w: PromptWork) -> list[Episode]:
    """Score `w`'s prefixes, allocate its replays; the replays to queue (the scheduler's hook)."""
    tree = w.tree
    prefix_ids = prefix_nodes(tree)
    replays: list[Episode] = []
    if w.replay_budget > 0 and prefix_ids:
        states = [
            State(
                tree.prompt_id,
                tree.prompt,
                tuple((t.action, t.observation) for t in tree.turns(n)),
                tree.env_id,
            )
            for n in prefix_ids
        ]
        for n, v in zip(prefix_ids, ctx.predict(states), strict=True):
            tree.nodes[n].value = float(v)
        cands, counts = _allocate_prefixes(ctx, w)
        replays = _replay_episodes(ctx, w, cands, counts)
    ctx.report.replays_unspent += max(0, w.replay_budget - len(replays))
    tree.info.update(replay_budget=w.replay_budget, replays=len(replays))
    return replays


def _allocate_prefixes(ctx: StepContext, w: PromptWork) -> tuple[list[PrefixCandidate], np.ndarray]:
    """The prompt's prefix records and the allocator's (checked) replays per prefix."""
    tree, allocator = w.tree, ctx.allocator
    cost_aware = is_cost_aware(allocator)
    leaves = [_chain_leaf(tree, first) for first in tree.root.children]
    cands = prefix_candidates(tree, leaves, cost=ctx.budget.prefix_cost(cost_aware))
    budget = ctx.budget.prefix_budget(w.replay_budget, cost_aware)
    rng = np.random.default_rng(stable_seed("prefixes", ctx.seed, ctx.step, tree.prompt_id))
    with ctx.stopwatch("allocator"):
        raw = allocator.allocate_prefixes(cands, budget, rng)
    counts = _check_counts(raw, len(cands), allocator, "prefix")
    if cost_aware:
        spent = float(counts @ np.array([c.cost for c in cands])) if cands else 0.0
        if spent > budget + _COST_TOLERANCE:
            raise AllocationError(
                f"cost-aware allocator {_name(allocator)} spent {spent:.6g} trajectory-"
                f"equivalents on prompt {tree.prompt_id!r}, over its budget of {budget:.6g}"
            )
    return cands, counts


def _replay_episodes(
    ctx: StepContext, w: PromptWork, cands: Sequence[PrefixCandidate], counts: np.ndarray
) -> list[Episode]:
    """One replay `Episode` per allocated count, in prefix then child order; counts each."""
    tree, out = w.tree, []
    for cand, k in zip(cands, counts, strict=True):
        node = tree.nodes[cand.node]
        prefix_turns = tuple(tree.turns(cand.node))
        root_ep = w.roots[cand.rollout]
        for j in range(int(k)):
            child = len(node.children) + j
            seed = branch_seed(ctx.step, tree.prompt_id, cand.node, child, turn=0, base=ctx.seed)
            out.append(
                Episode(
                    work=w,
                    kind="replay",
                    anchor=cand.node,
                    child=child,
                    prompt=root_ep.prompt,
                    reset_info=root_ep.reset_info,
                    env_seed=seed,
                    prefix_turns=prefix_turns,
                )
            )
            ctx.report.count_replay(node.depth, cand.cost)
    return out


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
