"""Predictor health: the figures that say whether a predictor's values help allocation.

TRACE spends budget where ``v (1 - v)`` is high (the chance a group of rollouts mixes
success and failure), so what matters is how well that ranks true mixedness, not how
well v ranks success. Spearman(v, Z) can be high while Spearman(v (1 - v), Z (1 - Z))
is near 0: a predictor that orders easy above hard prompts but cannot tell which are
near 0.5. The figures (docs/alloc.md, "Predictor health"):

- `gain_rank`: Spearman of ``v (1 - v)`` against the reference mixedness ``z (1 - z)``,
  with z the exact success probability (simulator) or a group's realised success rate
  (real envs: the mean of its leaves);
- `ece`: expected calibration error over 10 equal-width bins of v, each bin's
  ``|mean v - mean outcome|`` weighted by its share of outcomes;
- `brier`: mean squared error of v against the 0/1 outcomes (a group of n leaves with
  success rate r counts as n outcomes: ``(v - r)^2 + r (1 - r)`` each);
- `distinct`: how many different values the predictor gave (1: a constant, which ranks
  nothing).

All are pure numpy; `health` computes them together for one set of states,
`depth_health` by depth, `tree_rows` reads the rows from a step's trees and
`health_metrics` flattens them for training logs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from trace_gym.predict.training import spearman
from trace_gym.tree import RolloutTree

__all__ = [
    "brier",
    "depth_health",
    "distinct",
    "ece",
    "gain_rank",
    "health",
    "health_metrics",
    "tree_rows",
]


def _arrays(*xs: ArrayLike) -> list[np.ndarray]:
    out = [np.asarray(x, dtype=float).ravel() for x in xs]
    if len({a.size for a in out}) > 1:
        raise ValueError(f"lengths differ: {[a.size for a in out]}")
    return out


def gain_rank(values: ArrayLike, reference: ArrayLike) -> float:
    """Spearman(v (1 - v), z (1 - z)); nan with fewer than 2 states or a constant side."""
    v, z = _arrays(values, reference)
    return spearman(v * (1.0 - v), z * (1.0 - z))


def _weights(n: int, weights: ArrayLike | None) -> np.ndarray:
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float).ravel()
    if w.size != n or np.any(w < 0):
        raise ValueError("weights must be one non-negative number per state")
    return w


def ece(
    values: ArrayLike,
    outcomes: ArrayLike,
    weights: ArrayLike | None = None,
    bins: int = 10,
) -> float:
    """Expected calibration error over `bins` equal-width bins of v (nan with no weight).

    `outcomes` are success rates in [0, 1] (a single rollout's 0/1 reward, or a group's
    mean); `weights` the outcomes behind each (a group's leaf count; default 1).
    """
    v, y = _arrays(values, outcomes)
    w = _weights(v.size, weights)
    total = float(w.sum())
    if total <= 0:
        return math.nan
    which = np.minimum((np.clip(v, 0.0, 1.0) * bins).astype(int), bins - 1)
    err = 0.0
    for b in np.unique(which):
        sel = which == b
        wb = float(w[sel].sum())
        if wb > 0:
            err += wb * abs(float(w[sel] @ v[sel]) / wb - float(w[sel] @ y[sel]) / wb)
    return err / total


def brier(
    values: ArrayLike,
    outcomes: ArrayLike,
    weights: ArrayLike | None = None,
) -> float:
    """Mean squared error of v over the 0/1 outcomes behind each state (nan with none).

    A state with outcome rate r over w outcomes contributes w ((v - r)^2 + r (1 - r)):
    the sum of (v - y)^2 over its w individual outcomes.
    """
    v, r = _arrays(values, outcomes)
    w = _weights(v.size, weights)
    total = float(w.sum())
    if total <= 0:
        return math.nan
    return float(w @ ((v - r) ** 2 + r * (1.0 - r))) / total


def distinct(values: ArrayLike, decimals: int = 6) -> int:
    """Number of different values (rounded to `decimals`)."""
    v = np.asarray(values, dtype=float).ravel()
    return int(np.unique(np.round(v, decimals)).size)


def health(
    values: ArrayLike,
    reference: ArrayLike,
    outcomes: ArrayLike | None = None,
    weights: ArrayLike | None = None,
) -> dict[str, float]:
    """``{"gain_rank", "ece", "brier", "distinct", "n"}`` for one set of states.

    `reference` is what `gain_rank` ranks against (exact z, or realised rates);
    calibration is measured against `outcomes` (default: the reference) with `weights`.
    """
    v, z = _arrays(values, reference)
    y = z if outcomes is None else _arrays(outcomes)[0]
    return {
        "gain_rank": gain_rank(v, z),
        "ece": ece(v, y, weights),
        "brier": brier(v, y, weights),
        "distinct": float(distinct(v)),
        "n": float(v.size),
    }


#: figures `depth_health` reports per depth (all floats; nan where undefined)
FIGURES = ("gain_rank", "ece", "brier", "distinct", "n", "outcomes")


def depth_health(
    ranked: Iterable[tuple[int, float, float]],
    calibrated: Iterable[tuple[int, float, float, float]] = (),
) -> dict[int, dict[str, float]]:
    """Health figures by depth from two sets of scored states.

    `ranked`: (depth, value, reference z) of every state the allocator scored whose
    mixedness is known (exact z on the simulator, including skipped candidates; a
    visited node's realised success rate elsewhere): `gain_rank`, `distinct` and `n`
    come from these. `calibrated`: (depth, value, realised success rate, leaves behind
    it) of the visited nodes: `ece` and `brier` (weighted by leaves) and `outcomes` (the
    leaves counted) come from these.
    """
    by_rank: dict[int, list[tuple[float, float]]] = {}
    by_cal: dict[int, list[tuple[float, float, float]]] = {}
    for d, v, z in ranked:
        by_rank.setdefault(int(d), []).append((v, z))
    for d, v, y, w in calibrated:
        by_cal.setdefault(int(d), []).append((v, y, w))
    out: dict[int, dict[str, float]] = {}
    for d in sorted(set(by_rank) | set(by_cal)):
        r = np.asarray(by_rank.get(d, []), dtype=float).reshape(-1, 2)
        c = np.asarray(by_cal.get(d, []), dtype=float).reshape(-1, 3)
        out[d] = {
            "gain_rank": gain_rank(r[:, 0], r[:, 1]) if len(r) >= 2 else math.nan,
            "ece": ece(c[:, 0], c[:, 1], c[:, 2]) if len(c) else math.nan,
            "brier": brier(c[:, 0], c[:, 1], c[:, 2]) if len(c) else math.nan,
            "distinct": float(distinct(r[:, 0])),
            "n": float(len(r)),
            "outcomes": float(c[:, 2].sum()),
        }
    return out


def tree_rows(
    trees: Iterable[RolloutTree], exact: bool | None = None
) -> tuple[list[tuple[int, float, float]], list[tuple[int, float, float, float]]]:
    """(ranked, calibrated) rows of `depth_health` from the values the runner stored.

    Every node with a value (``node.value``: what the predictor said when the
    allocator scored it, i.e. the selected prompts and the visited prefixes) and a
    realised outcome. `exact` ranks against ``node.true_value`` (default: when every
    such node has one, i.e. on the simulator) instead of the realised success rate.
    """
    rows: list[tuple[int, float, float, float, float | None]] = []
    for t in trees:
        t.compute_targets()
        for n in t.nodes:
            if n.value is not None and n.target is not None:
                rows.append((n.depth, n.value, n.target, float(n.num_leaves), n.true_value))
    if exact is None:
        exact = bool(rows) and all(r[4] is not None for r in rows)
    ranked = [(d, v, float(tv if exact and tv is not None else y)) for d, v, y, _, tv in rows]
    calibrated = [(d, v, y, w) for d, v, y, w, _ in rows]
    return ranked, calibrated


def health_metrics(trees: Sequence[RolloutTree], prefix: str = "health") -> dict[str, float]:
    """Flat ``{prefix}_d{depth}_{figure}`` metrics of one step's trees (training logs)."""
    by_depth = depth_health(*tree_rows(trees))
    return {f"{prefix}_d{d}_{k}": v for d, row in by_depth.items() for k, v in row.items()}
