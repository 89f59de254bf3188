"""Build allocator inputs from runner data: prefix records from a finished rollout tree.

The candidate prefixes of a finished rollout are its turn boundaries strictly inside it
(docs/runner.md "What one step does", step 4): after turn 1 up to before its last turn. The
prompt itself (depth 0) is handled by the root allocation, and the leaf has nothing
left to replay. A rollout of T turns therefore offers T - 1 prefixes (none when T = 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from trace_gym.alloc.base import PrefixCandidate, PrefixColumns
from trace_gym.budget import DEFAULT_REPLAY_COST, remaining_turn_cost
from trace_gym.errors import AllocationError
from trace_gym.tree import Node, RolloutTree

__all__ = ["PrefixWalk", "prefix_candidates", "remaining_turn_cost", "walk_prefixes"]


def _cost_of(cost: Callable[[int, int], float] | float | None, depth: int, turns: int) -> float:
    if cost is None:
        return DEFAULT_REPLAY_COST
    if callable(cost):
        return float(cost(depth, turns))
    return float(cost)


def _lookup(values, node: Node) -> float | None:
    if values is None:
        return node.value
    if callable(values):
        return values(node)
    return values.get(node.id, node.value)


def _prefix_value(
    values: Mapping[int, float] | Callable[[Node], float] | None, node: Node, tree: RolloutTree
) -> float:
    value = _lookup(values, node)
    if value is None:
        raise AllocationError(
            f"prefix node {node.id} of tree {tree.prompt_id!r} has no predicted value; "
            "score it first (set node.value) or pass values={node_id: value}"
        )
    return float(value)


def prefix_candidates(
    tree: RolloutTree,
    leaf_ids: Sequence[int] | None = None,
    values: Mapping[int, float] | Callable[[Node], float] | None = None,
    *,
    cost: Callable[[int, int], float] | float | None = remaining_turn_cost,
) -> list[PrefixCandidate]:
    """The replayable prefixes of the finished rollouts `leaf_ids` of `tree`, in path order.

    - `leaf_ids`: the leaves (finished rollouts) to take prefixes from, in the order
      that defines `PrefixCandidate.rollout` (their index in this list). Default: every
      scored leaf of the tree, by node id. Failed branches (no reward) are skipped.
    - `values`: predicted success probability per prefix: a mapping node id -> value, a
      function of the node, or None to read `node.value` (set by the runner after
      scoring). A prefix without a value raises `AllocationError`.
    - `cost`: cost of one replay, either a function (depth, rollout_turns) -> cost
      (default `remaining_turn_cost`), a constant, or None for the protocol default (`DEFAULT_REPLAY_COST`).

    A node shared by several listed rollouts appears once (with the first rollout).
    `reward` is the rollout's success (1.0 or 0.0 at the tree's success threshold);
    `true_value` is copied from `node.true_value` (simulator only).
    """
    if leaf_ids is None:
        leaves = tree.leaves(include_failed=False)
    else:
        leaves = [tree[i] for i in leaf_ids]
    out: list[PrefixCandidate] = []
    seen: set[int] = set()
    for rollout, leaf in enumerate(leaves):
        if not leaf.is_leaf or leaf.id == 0:
            raise AllocationError(
                f"node {leaf.id} of tree {tree.prompt_id!r} is not a finished rollout (a leaf)"
            )
        if leaf.reward is None:  # failed branch: no outcome to contrast against
            continue
        path = tree.path(leaf.id)
        turns = len(path)
        reward = 1.0 if tree.is_success(leaf) else 0.0
        for node in path[:-1]:  # depth 1 .. T-1
            if node.id in seen:
                continue
            seen.add(node.id)
            value = _prefix_value(values, node, tree)
            out.append(
                PrefixCandidate(
                    rollout=rollout,
                    node=node.id,
                    depth=node.depth,
                    reward=reward,
                    value=value,
                    cost=_cost_of(cost, node.depth, turns),
                    true_value=node.true_value,
                    rollout_turns=turns,
                )
            )
    return out


class PrefixWalk(NamedTuple):
    """The replayable prefixes of many root-only trees, as arrays (`walk_prefixes`).

    Prompt g's prefixes are rows ``bounds[g]:bounds[g + 1]``, in `prefix_candidates`'s
    order for the tree's root rollouts; `columns` adds the values and costs.
    """

    bounds: np.ndarray
    rollout: np.ndarray
    node: np.ndarray
    depth: np.ndarray
    reward: np.ndarray
    true_value: np.ndarray
    rollout_turns: np.ndarray

    def columns(
        self,
        values: np.ndarray | Sequence[float],
        costs: Sequence[Callable[[int, int], float] | float | None],
        concentration: np.ndarray | Sequence[float | None] | None = None,
    ) -> PrefixColumns:
        """The `PrefixColumns` of these prefixes: `values` (and `concentration`, None or
        inf: a point value) one per row, `costs` one per prompt as `prefix_candidates`'s."""
        n = int(self.bounds[-1])
        conc = np.full(n, np.inf)
        if concentration is not None:
            conc = np.array([np.inf if x is None else x for x in concentration], dtype=float)
        return PrefixColumns(
            bounds=self.bounds,
            rollout=self.rollout,
            node=self.node,
            depth=self.depth,
            reward=self.reward,
            value=values,  # type: ignore[arg-type]
            cost=_cost_column(costs, self.bounds, self.depth, self.rollout_turns),
            true_value=self.true_value,
            rollout_turns=self.rollout_turns,
            concentration=conc,
        )


def walk_prefixes(trees: Sequence[RolloutTree]) -> PrefixWalk:
    """The prefixes of every tree's root rollouts, as `prefix_candidates` gives them with
    ``leaf_ids`` the end of each root child's single-child chain (what the runner passes
    before any replay): the same rows, read in one pass into flat lists."""
    rollout: list[int] = []
    node: list[Node] = []
    reward: list[float] = []
    turns: list[int] = []
    sizes: list[int] = []
    for tree in trees:
        nodes, before = tree.nodes, len(node)
        for r, first in enumerate(nodes[0].children):
            chain, n = [], nodes[first]
            while n.children:
                chain.append(n)
                n = nodes[n.children[0]]
            if n.reward is None or not chain:  # failed branch, or a one-turn rollout
                continue
            k = len(chain)
            node += chain
            rollout += [r] * k
            reward += [1.0 if n.reward >= tree.success_threshold else 0.0] * k
            turns += [k + 1] * k
        sizes.append(len(node) - before)
    true = [np.nan if (t := x.true_value) is None else t for x in node]
    return PrefixWalk(
        bounds=np.r_[0, np.cumsum(sizes, dtype=np.int64)],
        rollout=np.array(rollout, dtype=np.int64),
        node=np.fromiter(map(attrgetter("id"), node), np.int64, len(node)),
        depth=np.fromiter(map(attrgetter("depth"), node), np.int64, len(node)),
        reward=np.array(reward, dtype=float),
        true_value=np.array(true, dtype=float),
        rollout_turns=np.array(turns, dtype=np.int64),
    )


def _cost_column(costs, bounds: np.ndarray, depth: np.ndarray, turns: np.ndarray) -> np.ndarray:
    """One replay's cost per row: prompt g's prefixes cost `costs[g]` (a constant, None or
    a function (depth, turns) -> cost, as in `prefix_candidates`); the default
    `remaining_turn_cost` vectorised ((T - d) / T: the same floats)."""
    if len(costs) != bounds.size - 1:
        raise AllocationError(f"need one cost per prompt: {len(costs)} for {bounds.size - 1}")
    out = np.empty(depth.size, dtype=float)
    groups: dict[int, list[int]] = {}
    for g, c in enumerate(costs):
        groups.setdefault(id(c), []).append(g)
    b = bounds.tolist()
    for gs in groups.values():
        c = costs[gs[0]]
        rows = np.arange(depth.size)
        if len(groups) > 1:
            rows = np.concatenate([rows[b[g] : b[g + 1]] for g in gs])
        if c is remaining_turn_cost:
            out[rows] = (turns[rows] - depth[rows]) / turns[rows]
        elif callable(c):
            pairs = zip(depth[rows].tolist(), turns[rows].tolist(), strict=True)
            out[rows] = [float(c(d, t)) for d, t in pairs]
        else:
            out[rows] = _cost_of(c, 1, 1)
    return out
