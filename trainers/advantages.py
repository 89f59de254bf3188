"""Advantages from rollout trees: which tokens each optimiser trains, with what sign and weight.

Every optimiser is a pure function ``fn(trees, *, std=True, eps=1e-6, prompt_weight="roots")
-> list[TrainUnit]`` registered in `ADVANTAGES`. A `TrainUnit` names the tokens it trains
by node ids (the turns of those nodes, conditioned on the path above them), the scalar
advantage broadcast to those tokens and a per-token weight. References:
docs/trainers.md "Advantages".

Rules (our choices where the papers leave room are marked *choice*):

- **grpo** (DeepSeekMath; ``std=False`` is Dr. GRPO): one unit per scored leaf path
  (every turn from the prompt to the leaf); A = (r - mean) / (std + eps) over the *group*.
  For a flat tree (no replays) the group is the prompt's root rollouts, i.e. the classic
  GRPO group. *Choice*: for a tree with replays the group is all scored leaves of the
  prompt (root rollouts and replays alike), so GRPO can be run on TRACE trees too.
- **treerpo** (Yang et al. 2025): chain-compressed segments from `RolloutTree.segments`
  (every maximal single-child chain is one segment, hanging under an anchor = the root
  or a branch point). A segment's value is the success rate of the leaves below it; the
  segments under one anchor form a group, A = (V - mean_sib) / (std_sib + eps). A group
  with one member (or zero spread) gives A = 0. Each unit trains only its own
  segment's turns, conditioned on the path to its anchor.
- **tree_grpo** (Ji et al. 2025): one unit per scored leaf path,
  A = GRPO(r over all leaves of the prompt) + GRPO(r over the leaves of the same tree).
  *Choice*: in a TRACE tree, "a tree" is the subtree of one root rollout (one child of
  the root, with every replay grown from its prefixes). A tree with one leaf has intra
  term 0.
- **treepo** (TreePO subgroup averaging): one unit per scored leaf path; for every
  anchor on the leaf's path (the root and each branch point above the leaf), the term
  r - mean(leaves under that anchor) counts when the subgroup has more than one leaf;
  the leaf's advantage is the mean of its terms, then whitened over the whole batch
  (``std=False``: centred only). *Choice*: subgroups are taken at anchors, not at every
  turn, because a single-child chain repeats its parent's subgroup (same chain
  compression as treerpo).

Per-token weights:

- leaf-path optimisers (grpo, tree_grpo, treepo) count a shared-prefix token once per
  leaf path through it (that duplication is what gives turn-level credit in Tree-GRPO);
  treerpo counts every token exactly once, in the segment that generated it.
- ``prompt_weight="roots"`` (default) keeps a prompt with many replays from dominating:
  each unit of a tree gets weight m / U, where m is the prompt's number of root
  rollouts (the root's children) and U the number of units the tree produced, so a
  prompt weighs what its root allocation says, whatever its replay count. For a flat
  tree every unit has weight 1: plain GRPO. ``"none"`` gives every unit weight 1.

Failed branches (``node.error``) have no reward: they are left out of every group and
never trained. Overflowed turns are masked out later, in `trace_gym.trainers.data`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from trace_gym.errors import ConfigError, unknown
from trace_gym.tree import RolloutTree

__all__ = [
    "ADVANTAGES",
    "PROMPT_WEIGHTS",
    "TrainUnit",
    "compute_advantages",
    "grpo",
    "tree_grpo",
    "treepo",
    "treerpo",
]


@dataclass(frozen=True)
class TrainUnit:
    """A trained span of one tree: its turns, their advantage and per-token weight."""

    #: index of the tree in the batch passed to the advantage function
    tree: int
    #: node ids whose turns are trained, top-down (a leaf path or a segment)
    nodes: tuple[int, ...]
    #: advantage broadcast to every trained token
    advantage: float
    #: loss weight of each trained token (see the module docstring)
    weight: float = 1.0


def _normalise(rewards: Sequence[float], std: bool, eps: float) -> np.ndarray:
    """Group-relative scores: (r - mean) / (unbiased std + eps), or r - mean; 0 for a singleton."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size <= 1:
        return np.zeros_like(r)
    centred = r - r.mean()
    return centred / (r.std(ddof=1) + eps) if std else centred


def _scored_leaves(tree: RolloutTree) -> list[int]:
    return [n.id for n in tree.leaves(include_failed=False) if n.reward is not None]


def _rewards(tree: RolloutTree, leaves: Sequence[int]) -> list[float]:
    """The rewards of scored leaves (`_scored_leaves`), in order."""
    return [float(r) for n in leaves if (r := tree[n].reward) is not None]


def _leaf_path(tree: RolloutTree, leaf: int) -> tuple[int, ...]:
    return tuple(n.id for n in tree.path(leaf))


def _with_prompt_weights(tree: RolloutTree, units: list[TrainUnit], mode: str) -> list[TrainUnit]:
    if mode == "none" or not units:
        return units
    roots = max(1, len(tree.root.children))
    w = roots / len(units)
    return [TrainUnit(u.tree, u.nodes, u.advantage, u.weight * w) for u in units]


def grpo(
    trees: Sequence[RolloutTree],
    *,
    std: bool = True,
    eps: float = 1e-6,
    prompt_weight: str = "roots",
) -> list[TrainUnit]:
    """GRPO / Dr. GRPO: every leaf path, normalised within its prompt's group."""
    out: list[TrainUnit] = []
    for i, tree in enumerate(trees):
        leaves = _scored_leaves(tree)
        adv = _normalise(_rewards(tree, leaves), std, eps)
        units = [
            TrainUnit(i, _leaf_path(tree, n), float(a)) for n, a in zip(leaves, adv, strict=True)
        ]
        out += _with_prompt_weights(tree, units, prompt_weight)
    return out


def treerpo(
    trees: Sequence[RolloutTree],
    *,
    std: bool = True,
    eps: float = 1e-6,
    prompt_weight: str = "roots",
) -> list[TrainUnit]:
    """TreeRPO on chain-compressed segments: each segment's value against its siblings'."""
    out: list[TrainUnit] = []
    for i, tree in enumerate(trees):
        tree.compute_targets()
        groups: dict[int, list] = {}
        for seg in tree.segments():
            if seg.value is not None:  # only failed branches below: nothing to train
                groups.setdefault(seg.anchor, []).append(seg)
        units = []
        for segs in groups.values():
            adv = _normalise([s.value for s in segs], std, eps)
            units += [TrainUnit(i, s.nodes, float(a)) for s, a in zip(segs, adv, strict=True)]
        out += _with_prompt_weights(tree, units, prompt_weight)
    return out


def tree_grpo(
    trees: Sequence[RolloutTree],
    *,
    std: bool = True,
    eps: float = 1e-6,
    prompt_weight: str = "roots",
) -> list[TrainUnit]:
    """Tree-GRPO: inter-tree (whole prompt) + intra-tree (one root rollout's subtree) terms."""
    out: list[TrainUnit] = []
    for i, tree in enumerate(trees):
        leaves = _scored_leaves(tree)
        inter = _normalise(_rewards(tree, leaves), std, eps)
        subtree_of = {n: tree.path(n)[0].id for n in leaves}
        intra = dict.fromkeys(leaves, 0.0)
        for sub in set(subtree_of.values()):
            members = [n for n in leaves if subtree_of[n] == sub]
            for n, a in zip(members, _normalise(_rewards(tree, members), std, eps), strict=True):
                intra[n] = float(a)
        units = [
            TrainUnit(i, _leaf_path(tree, n), float(a) + intra[n])
            for n, a in zip(leaves, inter, strict=True)
        ]
        out += _with_prompt_weights(tree, units, prompt_weight)
    return out


def treepo(
    trees: Sequence[RolloutTree],
    *,
    std: bool = True,
    eps: float = 1e-6,
    prompt_weight: str = "roots",
) -> list[TrainUnit]:
    """TreePO: mean of r - mean(subgroup) over the anchors above a leaf, whitened over the batch."""
    raw: list[tuple[int, int, float]] = []  # (tree, leaf, averaged term)
    for i, tree in enumerate(trees):
        tree.compute_targets()
        for leaf in _scored_leaves(tree):
            (r,) = _rewards(tree, [leaf])
            terms = []
            for anc in [tree.root, *tree.path(leaf)[:-1]]:
                if (anc.id == 0 or len(anc.children) >= 2) and anc.num_leaves > 1:
                    terms.append(r - _mean_reward(tree, anc.id))
            raw.append((i, leaf, float(np.mean(terms)) if terms else 0.0))
    if not raw:
        return []
    adv = np.array([a for _, _, a in raw])
    adv = adv - adv.mean()
    if std and adv.size > 1:
        adv = adv / (adv.std() + eps)
    out: list[TrainUnit] = []
    for i, tree in enumerate(trees):
        units = [
            TrainUnit(t, _leaf_path(tree, leaf), float(a))
            for (t, leaf, _), a in zip(raw, adv, strict=True)
            if t == i
        ]
        out += _with_prompt_weights(tree, units, prompt_weight)
    return out


def _mean_reward(tree: RolloutTree, node_id: int) -> float:
    rs = [n.reward for n in tree.leaves_under(node_id) if n.reward is not None]
    return float(np.mean(rs)) if rs else math.nan


#: optimiser name -> advantage function (``dr_grpo`` is GRPO without the std)
ADVANTAGES: dict[str, Callable[..., list[TrainUnit]]] = {
    "grpo": grpo,
    "dr_grpo": lambda trees, **kw: grpo(trees, **{**kw, "std": False}),
    "treerpo": treerpo,
    "tree_grpo": tree_grpo,
    "treepo": treepo,
}

PROMPT_WEIGHTS = ("roots", "none")


def compute_advantages(name: str, trees: Sequence[RolloutTree], **kwargs) -> list[TrainUnit]:
    """Look up `name` in `ADVANTAGES` and apply it (unknown name -> `UnknownNameError`)."""
    if name not in ADVANTAGES:
        raise unknown("optimiser", name, ADVANTAGES)
    if kwargs.get("prompt_weight", "roots") not in PROMPT_WEIGHTS:
        raise ConfigError(
            f"prompt_weight must be one of {PROMPT_WEIGHTS}, got {kwargs['prompt_weight']!r}"
        )
    return ADVANTAGES[name](trees, **kwargs)
