"""Predictor training batches from finished trees, and predictor quality by depth.

Targets are bottom-up: each node's success rate over the (non-failed) leaves below
it (`RolloutTree.compute_targets`). A batch holds every prompt (tree root) and a
sample of *prefixes* (non-root, non-terminal nodes) whose share of the batch is
`prefix_share` (the paper: about 6%). Each sample's weight is the number of scored
leaves behind its target, so the empirical predictor can count successes and the
feature predictor can trust well-supported targets more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from trace_gym.errors import ConfigError
from trace_gym.predict.base import Predictor, State, states_from_tree
from trace_gym.tree import Node, RolloutTree

__all__ = ["TrainingBatch", "every_label", "quality_by_depth", "spearman", "training_batch"]


class TrainingBatch(NamedTuple):
    """States, their bottom-up targets and leaf-count weights (unpacks as a 3-tuple)."""

    states: list[State]
    targets: np.ndarray
    weights: np.ndarray


def _inner(tree: RolloutTree) -> list[Node]:
    return [n for n in tree.nodes[1:] if not n.terminal and not n.is_leaf and n.target is not None]


def training_batch(
    trees: Sequence[RolloutTree], prefix_share: float = 0.06, rng: np.random.Generator | None = None
) -> TrainingBatch:
    """Every scored prompt plus a random sample of prefixes making up `prefix_share` of the batch.

    The number of prefix samples is ``n_prompts * share / (1 - share)``, rounded
    stochastically with `rng` (so small batches get the right share on average) and
    capped by the prefixes available; `prefix_share=1` takes every prefix and no prompt.
    """
    if not 0.0 <= prefix_share <= 1.0:
        raise ConfigError(f"prefix_share must be in [0, 1], got {prefix_share}")
    rng = np.random.default_rng(0) if rng is None else rng
    roots, pool = [], []
    for ti, tree in enumerate(trees):
        tree.compute_targets()
        if tree.root.target is not None:
            roots.append((ti, 0))
        pool += [(ti, n.id) for n in _inner(tree)]
    if prefix_share >= 1.0:
        picked, roots = list(range(len(pool))), []
    else:
        want = len(roots) * prefix_share / (1.0 - prefix_share)
        k = min(len(pool), math.floor(want) + int(rng.random() < want - math.floor(want)))
        picked = sorted(rng.choice(len(pool), size=k, replace=False).tolist()) if k else []
    chosen = roots + [pool[i] for i in picked]
    states, targets, weights = [], [], []
    for ti, nid in chosen:
        node = trees[ti].nodes[nid]
        states += states_from_tree(trees[ti], [nid])
        targets.append(node.target)
        weights.append(node.num_leaves)
    return TrainingBatch(states, np.asarray(targets, dtype=float), np.asarray(weights, dtype=float))


def every_label(trees: Sequence[RolloutTree]) -> TrainingBatch:
    """Every scored prompt and every inner prefix of `trees`, each with its leaf count.

    What a predictor that refits on all labels (``label_all = True``, e.g. `clue`) is
    trained on instead of `training_batch`'s sample.
    """
    states, targets, weights = [], [], []
    for tree in trees:
        tree.compute_targets()
        nodes = ([tree.root] if tree.root.target is not None else []) + _inner(tree)
        states += states_from_tree(tree, [n.id for n in nodes])
        targets += [n.target for n in nodes]
        weights += [n.num_leaves for n in nodes]
    return TrainingBatch(states, np.asarray(targets, dtype=float), np.asarray(weights, dtype=float))


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 with ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(len(x))
    start = 0
    for end in range(1, len(x) + 1):
        if end == len(x) or xs[end] != xs[start]:
            ranks[order[start:end]] = 0.5 * (start + end - 1)
            start = end
    return ranks


def spearman(a: ArrayLike, b: ArrayLike) -> float:
    """Spearman rank correlation (average ranks for ties); nan when undefined."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size != y.size:
        raise ValueError(f"spearman: lengths differ ({x.size} vs {y.size})")
    if x.size < 2:
        return math.nan
    ra, rb = _ranks(x), _ranks(y)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb / den) if den > 0 else math.nan


def quality_by_depth(
    predictor: Predictor, trees: Sequence[RolloutTree], use_true_values: bool = False
) -> dict[int, dict[str, float]]:
    """Spearman and squared error of the predictor per depth, on roots and inner prefixes.

    References are the bottom-up targets, or each node's exact `true_value` (simulator
    trees) with `use_true_values=True`; nodes without a reference are skipped.
    Returns ``{depth: {"spearman": .., "mse": .., "n": .., "spearman_within": ..}}``
    sorted by depth; ``spearman_within`` is the mean over prompts of the rank correlation
    among one prompt's nodes at that depth (prompts with >= 3 such nodes whose references
    span at least 0.1), which measures
    what the prefix stage needs: ranking the prefixes *of one prompt*, not telling easy
    prompts from hard ones.
    """
    by_depth: dict[int, tuple[list[State], list[float], list[int]]] = {}
    for ti, tree in enumerate(trees):
        tree.compute_targets()
        for node in [tree.root, *_inner(tree)]:
            ref = node.true_value if use_true_values else node.target
            if ref is None:
                continue
            states, refs, owner = by_depth.setdefault(node.depth, ([], [], []))
            states += states_from_tree(tree, [node.id])
            refs.append(float(ref))
            owner.append(ti)
    out = {}
    for depth in sorted(by_depth):
        states, refs, owner = by_depth[depth]
        pred = np.asarray(predictor.predict(states), dtype=float)
        reference, own = np.asarray(refs), np.asarray(owner)
        within = [
            spearman(pred[own == t], reference[own == t])
            for t in np.unique(own)
            if np.sum(own == t) >= 3
        ]
        within = [w for w in within if not math.isnan(w)]
        out[depth] = {
            "spearman": spearman(pred, reference),
            "mse": float(np.mean((pred - reference) ** 2)),
            "n": len(refs),
            "spearman_within": float(np.mean(within)) if within else math.nan,
        }
    return out
