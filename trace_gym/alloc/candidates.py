"""Build allocator inputs from runner data: prefix records from a finished rollout tree.

The candidate prefixes of a finished rollout are its turn boundaries strictly inside it
(docs/runner.md "What one step does", step 4): after turn 1 up to before its last turn. The
prompt itself (depth 0) is handled by the root allocation, and the leaf has nothing
left to replay. A rollout of T turns therefore offers T - 1 prefixes (none when T = 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from trace_gym.alloc.base import PrefixCandidate
from trace_gym.budget import DEFAULT_REPLAY_COST, remaining_turn_cost
from trace_gym.errors import AllocationError
from trace_gym.tree import Node, RolloutTree

__all__ = ["prefix_candidates", "remaining_turn_cost"]


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
