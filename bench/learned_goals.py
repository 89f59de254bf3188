"""The learned-predictor goals of issue 25 (docs/sim.md, "Predictor v2"), from a run's records.

- TRACE over steps 1..: step 0 is the uniform cold start (no data yet), so the goals
  average steps >= 1 only (per seed, then over seeds), and report step 0 apart;
- predictor health at depth 0 per step: `gain_rank` (Spearman of v (1 - v) against
  z (1 - z), z exact) and ECE against exact z, over every candidate TRACE scored;
- the cell-mean reference: each candidate valued at the mean exact Z_0 of its clue cell
  in the first-visit reference pool (`trace_gym.bench.first_visit`, a disjoint pool),
  whose `gain_rank` is what a predictor reading only the prompt's clues could reach;
- adaptive minus random prefixes with the learned predictor, as a share of the same
  gap with the oracle predictor (rows ``trace@oracle`` and
  ``trace_roots_random_prefixes@oracle``).

Simulator only (it reads exact values and the clue cells). Nothing here is imported by
a predictor.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from trace_gym.bench.report import StepRecord, mean_ci

from trace_gym.predict.health import ece, gain_rank

__all__ = ["cell_gain_rank", "cell_means", "depth0_health", "learned_goals", "late_mean"]

#: goal thresholds (issue 25)
MIXED_SHARE, EFF_RATIO, PREFIX_SHARE, GAIN_SHARE, MAX_ECE = 0.95, 1.5, 0.70, 0.85, 0.05


@functools.lru_cache(maxsize=8)
def _cell_table(stem: str) -> tuple[dict[tuple, float], dict[tuple, int]]:
    from trace_gym.bench.first_visit import REFERENCE_SEED, REFERENCE_TASKS, clue_cells

    from trace_gym.sim.model import make_task, preset_for_stem, value_at

    p = preset_for_stem(stem)
    groups: dict[tuple, list[float]] = defaultdict(list)
    for i in range(REFERENCE_TASKS):
        t = make_task(p, REFERENCE_SEED, i)
        z = float(value_at(t, 0, 0, False, p.skill))
        for key in clue_cells(t):
            groups[key].append(z)
    return {k: float(np.mean(v)) for k, v in groups.items()}, {k: len(v) for k, v in groups.items()}


def cell_means(task_ids: Sequence[str]) -> np.ndarray:
    """Mean exact Z_0 of each task's clue cell (fine cell with enough tasks, else coarse)."""
    from trace_gym.bench.first_visit import MIN_CELL, clue_cells

    from trace_gym.sim.model import parse_task_id, task_from_id

    out = []
    for tid in task_ids:
        means, sizes = _cell_table(parse_task_id(tid)[0])
        fine, coarse = clue_cells(task_from_id(tid))
        out.append(means.get(fine if sizes.get(fine, 0) >= MIN_CELL else coarse, 0.5))
    return np.asarray(out, dtype=float)


def late_mean(records: Sequence[StepRecord], policy: str, key: str, first: int = 1) -> float:
    """Mean over seeds of the mean over steps >= `first` of one metric (nan: none)."""
    per: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if r.policy == policy and r.step >= first:
            per[r.seed].append(r.metrics[key])
    return float(np.mean([np.mean(v) for v in per.values()])) if per else math.nan


def _late_ci(
    records: Sequence[StepRecord], policy: str, key: str, first: int = 1
) -> tuple[float, float]:
    per: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if r.policy == policy and r.step >= first:
            per[r.seed].append(r.metrics[key])
    return mean_ci([float(np.mean(v)) for v in per.values()]) if per else (math.nan, math.nan)


def depth0_health(
    records: Sequence[StepRecord], policy: str = "trace"
) -> dict[int, dict[str, float]]:
    """Per step, over seeds: gain_rank and ECE of the predictor and the cell-mean reference.

    Each seed's figure is computed on that step's candidates (every prompt TRACE scored),
    then averaged over seeds.
    """
    acc: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.policy != policy:
            continue
        d0 = [(v, z) for depth, v, z in r.exact_scored if depth == 0]
        if len(d0) < 2 or len(r.prompt_ids) == 0:
            continue
        v, z = np.array(d0).T
        a = acc[r.step]
        a["gain_rank"].append(gain_rank(v, z))
        a["ece"].append(ece(v, z))
        a["n"].append(float(v.size))

    def mean(x: list[float]) -> float:
        x = [y for y in x if not math.isnan(y)]
        return float(np.mean(x)) if x else math.nan

    return {s: {k: mean(x) for k, x in a.items()} for s, a in sorted(acc.items())}


def cell_gain_rank(pools: Sequence[Sequence[str]], preset: str, step: int, drift: bool) -> float:
    """Mean over pools (one per seed) of the cell-mean reference's gain_rank against exact Z_0."""
    from trace_gym.sim import get_preset, skill_at, true_value

    skill = skill_at(get_preset(preset), step, drift)
    vals = [
        gain_rank(cell_means(ids), [true_value(i, [], skill=skill) for i in ids]) for ids in pools
    ]
    vals = [x for x in vals if not math.isnan(x)]
    return float(np.mean(vals)) if vals else math.nan


def learned_goals(
    p: dict[str, Any],
    records: Sequence[StepRecord],
    cell_rank: float | None = None,
    paired: Callable[..., tuple[float, float]] | None = None,
) -> list[dict[str, Any]]:
    """The issue-25 goals whose rows ran (reported, never asserted).

    `paired(records, a, b)` is the per-seed paired difference of the effective ratio
    (`trace_gym.bench.alloc.paired_difference`), needed by the prefix-gap goal.
    """
    out: list[dict[str, Any]] = []

    def add(goal: str, measured: str, met: bool | None) -> None:
        out.append({"goal": goal, "measured": measured, "met": met})

    if "trace" in p and "first_visit" in p:
        t, f = (
            late_mean(records, "trace", "mixed_per_te"),
            late_mean(records, "first_visit", "mixed_per_te"),
        )
        add(
            "steps 1..: learned TRACE mixed groups per TE >= 95% of the first-visit reference's",
            f"{t:.3f} vs {f:.3f} ({t / f if f else math.nan:.0%}); all steps incl. the step-0 cold start: {late_mean(records, 'trace', 'mixed_per_te', 0):.3f} vs {late_mean(records, 'first_visit', 'mixed_per_te', 0):.3f}",
            t >= MIXED_SHARE * f,
        )
    if "trace" in p and "grpo" in p:
        t, g = (
            late_mean(records, "trace", "effective_ratio"),
            late_mean(records, "grpo", "effective_ratio"),
        )
        add(
            "steps 1..: learned TRACE effective ratio >= 1.5x GRPO's",
            f"{t:.1%} vs {g:.1%} ({t / g if g else math.nan:.2f}x); all steps: "
            f"{late_mean(records, 'trace', 'effective_ratio', 0):.1%} vs {late_mean(records, 'grpo', 'effective_ratio', 0):.1%}",
            t >= EFF_RATIO * g,
        )
    out += _prefix_gap_goal(p, records, paired) if paired is not None else []
    out += _health_goals(records, cell_rank)
    return out


def _prefix_gap_goal(
    p: dict[str, Any], records: Sequence[StepRecord], paired
) -> list[dict[str, Any]]:
    rnd, orc, orc_rnd = (
        "trace_roots_random_prefixes",
        "trace@oracle",
        "trace_roots_random_prefixes@oracle",
    )
    if not all(k in p for k in ("trace", rnd, orc, orc_rnd)):
        return []
    d, h = paired(records, "trace", rnd)
    do, ho = paired(records, orc, orc_rnd)
    share = d / do if do else math.nan
    return [
        {
            "goal": "adaptive - random prefixes with the learned predictor >= 70% of the same gap with the oracle predictor",
            "measured": f"learned {100 * d:+.1f} ± {100 * h:.1f} points, oracle {100 * do:+.1f} ± {100 * ho:.1f} points ({share:.0%})",
            "met": bool(do > 0 and d >= PREFIX_SHARE * do),
        }
    ]


def _health_goals(records: Sequence[StepRecord], cell_rank: float | None) -> list[dict[str, Any]]:
    h = depth0_health(records)
    if 2 not in h:
        return []
    later = [s for s in h if s >= 1]
    e = float(np.mean([h[s]["ece"] for s in later]))
    out = [
        {
            "goal": "ECE of the prompt values against exact Z <= 0.05 (steps 1..)",
            "measured": f"ECE {e:.3f} (by step: "
            + ", ".join(f"{h[s]['ece']:.3f}" for s in h)
            + ")",
            "met": e <= MAX_ECE,
        }
    ]
    if cell_rank is not None and not math.isnan(cell_rank):
        g = h[2]["gain_rank"]
        out.append(
            {
                "goal": "gain_rank at depth 0 by step 2 >= 85% of the cell-mean reference's",
                "measured": f"{g:.2f} vs {cell_rank:.2f} ({g / cell_rank if cell_rank else math.nan:.0%}); by step: "
                + ", ".join(f"{h[s]['gain_rank']:.2f}" for s in h),
                "met": g >= GAIN_SHARE * cell_rank,
            }
        )
    return out
