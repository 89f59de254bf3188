"""The predictor's health on one training step's realised groups, for metrics.jsonl.

`train_step` logs these beside the step's other figures (docs/agents.md, "The LM critic"):
the values are the predictions the allocator used (made before the step's predictor
update), the references what the step's rollouts realised. A prompt's group is its
tree: its realised rate is the root's bottom-up target (the success rate of every leaf
below it); a replayed prefix's is that node's target.

- ``predictor_gain_rank``: Spearman of ``v (1 - v)`` against ``z (1 - z)`` over the
  step's prompts, z the realised rate (`trace_gym.predict.health.gain_rank`); nan when
  undefined (fewer than 3 prompts, or a constant side: a predictor that has not learned
  yet, or a step whose groups all failed);
- ``predictor_gain_rank_prefix``: the same over the scored prefixes (depth >= 1);
- ``predictor_ece`` / ``predictor_brier``: calibration of the prompts' v against their
  realised outcomes, each prompt weighted by its leaves;
- ``predictor_distinct``: how many different values the prompts got;
- ``predictor_scored``: how many prompts these figures cover;
- ``predictor_share``: the predictor's wall time in the step (predict + update) over the
  step's (rollout + policy update), the figure the paper reports at 2.3-3.2%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from trace_gym.predict.health import distinct, gain_rank, health
from trace_gym.tree import RolloutTree

__all__ = ["predictor_metrics", "scored_nodes"]


def scored_nodes(
    trees: Sequence[RolloutTree],
) -> tuple[list[tuple[float, float, int]], list[tuple[float, float, int]]]:
    """(value, realised target, leaves) of every scored root and of every scored prefix."""
    roots: list[tuple[float, float, int]] = []
    prefixes: list[tuple[float, float, int]] = []
    for tree in trees:
        tree.compute_targets()
        for node in tree.nodes:
            if node.value is None or node.target is None:
                continue
            row = (float(node.value), float(node.target), int(node.num_leaves))
            (roots if node.depth == 0 else prefixes).append(row)
    return roots, prefixes


def predictor_metrics(
    trees: Sequence[RolloutTree], predictor_s: float, step_s: float
) -> dict[str, float]:
    """The figures above for one step's trees; `predictor_s` of `step_s` seconds were the predictor's."""
    roots, prefixes = scored_nodes(trees)
    out: dict[str, Any] = {
        "predictor_gain_rank": math.nan,
        "predictor_gain_rank_prefix": math.nan,
        "predictor_ece": math.nan,
        "predictor_brier": math.nan,
        "predictor_distinct": 0.0,
        "predictor_scored": float(len(roots)),
        "predictor_share": predictor_s / step_s if step_s > 0 else math.nan,
    }
    if roots:
        v, z, w = (np.asarray(col, dtype=float) for col in zip(*roots, strict=True))
        h = health(v, z, weights=w)
        out.update(
            predictor_gain_rank=h["gain_rank"],
            predictor_ece=h["ece"],
            predictor_brier=h["brier"],
            predictor_distinct=float(distinct(v)),
        )
    if prefixes:
        pv, pz, _ = (np.asarray(col, dtype=float) for col in zip(*prefixes, strict=True))
        out["predictor_gain_rank_prefix"] = gain_rank(pv, pz)
    return out
