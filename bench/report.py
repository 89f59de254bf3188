"""Per-step records, summaries with confidence intervals, tables, CSV/JSON and plots.

A benchmark run produces one `StepRecord` per (policy, seed, step). `summarize` turns
them into one row per policy: each metric averaged over steps within a seed, then
over seeds, with a 95% confidence interval over seeds (over steps when there is only
one seed, which understates run-to-run spread; it says which in ``ci_over``).
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.files import set_page_mode
from trace_gym.provenance import write_provenance

__all__ = [
    "StepRecord",
    "format_curves",
    "format_error",
    "format_health",
    "format_table",
    "health_summary",
    "mean_ci",
    "prediction_error",
    "spearman",
    "summarize",
    "write_outputs",
]

#: summary columns, in table order: (key, header, format)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("effective_ratio", "eff", "{:.1%}"),
    ("mixed_groups", "mixed", "{:.1f}"),
    ("mixed_per_te", "mixed/TE", "{:.3f}"),
    ("contrastive_pairs", "pairs", "{:.0f}"),
    ("pairs_per_cost", "pairs/TE", "{:.2f}"),
    ("mixed_branch_share", "mixed-br", "{:.0%}"),
    ("distinct_prompts_total", "prompts/run", "{:.0f}"),
    ("pairs_per_kturn", "pairs/kturn", "{:.0f}"),
    ("mixed_per_kturn", "mixed/kturn", "{:.2f}"),
    ("distinct_prompts", "prompts", "{:.1f}"),
    ("cost", "TE", "{:.0f}"),
    ("measured_turns", "turns", "{:.0f}"),
    ("skipped_share", "skipped", "{:.0%}"),
    ("skipped_budget", "budget", "{:.0%}"),
    ("skipped_filter", "filter", "{:.0%}"),
    ("rollouts_per_prompt", "m/prompt", "{:.1f}"),
    ("predictor_share", "pred.time", "{:.1%}"),
    ("oracle_gap", "vs.oracle", "{:.0%}"),
    ("gain_rank", "gain_rank", "{:.2f}"),
    ("ece", "ECE", "{:.3f}"),
)

#: the default table's columns (keys of `COLUMNS`): what decides between policies at equal
#: cost, narrow enough for a terminal (<= 100 characters); ``--wide`` shows all of `COLUMNS`
COMPACT = (
    "effective_ratio",
    "mixed_per_te",
    "distinct_prompts",
    "skipped_share",
    "skipped_budget",
    "skipped_filter",
    "oracle_gap",
)
#: the width the compact table and its title keep to
TABLE_WIDTH = 100

#: per-step series in every summary row (mean over seeds at each step)
BY_STEP = (
    "effective_ratio",
    "mixed_groups",
    "mixed_per_te",
    "pairs_per_cost",
    "distinct_prompts",
    "predictor_share",
)

# two-sided 95% Student t quantiles by degrees of freedom (df > 30: normal)
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


@dataclass
class StepRecord:
    """What one policy did in one step of one seed."""

    policy: str
    seed: int
    step: int
    effective_ratio: float
    mixed_groups: int
    mixed_anchors: int
    contrastive_pairs: int
    cost: float
    measured_turns: int
    tokens: int
    distinct_prompts: int
    candidates: int
    roots: int
    replays: int
    replays_unspent: int
    failed_branches: int
    wall_s: float
    time_s: dict[str, float]
    replays_by_depth: dict[int, int]
    #: (depth, predicted value, bottom-up target, exact value or nan) of every scored node
    scored: list[tuple[int, float, float, float]] = field(default_factory=list, repr=False)
    #: ids of the prompts trained on
    prompt_ids: list[str] = field(default_factory=list, repr=False)
    #: nodes with two or more children, and those whose subtree holds both outcomes
    branch_nodes: int = 0
    mixed_branch_nodes: int = 0
    #: accounted budget (trajectory-equivalents) the policy left unspent
    unspent_budget: float = 0.0
    #: (depth, predicted, exact) of every state the predictor scored (simulator only):
    #: every candidate at depth 0, every visited prefix deeper
    exact_scored: list[tuple[int, float, float]] = field(default_factory=list, repr=False)
    #: prompts a flat policy's budget pays a fixed group for (budget // group size);
    #: 0 for a tree policy (no split of its skipped share)
    budget_prompts: int = 0
    #: predictor health by depth (`trace_gym.predict.health.depth_health`) of this step
    health: dict[int, dict[str, float]] = field(default_factory=dict, repr=False)

    @property
    def metrics(self) -> dict[str, float]:
        turns = max(1, self.measured_turns)
        return {
            "effective_ratio": self.effective_ratio,
            "mixed_groups": self.mixed_groups,
            "mixed_anchors": self.mixed_anchors,
            "contrastive_pairs": self.contrastive_pairs,
            "pairs_per_cost": self.contrastive_pairs / self.cost if self.cost else math.nan,
            "mixed_per_te": self.mixed_groups / self.cost if self.cost else math.nan,
            "mixed_branch_share": self.mixed_branch_nodes / self.branch_nodes
            if self.branch_nodes
            else math.nan,
            "unspent_budget": self.unspent_budget,
            "pairs_per_kturn": 1000.0 * self.contrastive_pairs / turns,
            "mixed_per_kturn": 1000.0 * self.mixed_groups / turns,
            "distinct_prompts": self.distinct_prompts,
            "cost": self.cost,
            "measured_turns": self.measured_turns,
            "tokens": self.tokens,
            "skipped_share": 1.0 - self.distinct_prompts / self.candidates
            if self.candidates
            else math.nan,
            **self._skipped_split(),
            "rollouts_per_prompt": self.roots / self.distinct_prompts
            if self.distinct_prompts
            else math.nan,
            "replays": self.replays,
            "replays_unspent": self.replays_unspent,
            "failed_branches": self.failed_branches,
            "predictor_share": self.time_s.get("predictor", 0.0) / self.wall_s
            if self.wall_s
            else 0.0,
            # the predictor's seconds in the step (predict + update), its share's numerator
            "predictor_s": self.time_s.get("predictor", 0.0),
            "wall_s": self.wall_s,
        }

    def _skipped_split(self) -> dict[str, float]:
        """A flat policy's skipped share split in two: candidates the budget cannot pay a
        group for (``skipped_budget``), and those its filter left out though the budget
        would have paid for them (``skipped_filter``); nan for a tree policy."""
        if not self.candidates or not self.budget_prompts:
            return {"skipped_budget": math.nan, "skipped_filter": math.nan}
        skipped = 1.0 - self.distinct_prompts / self.candidates
        budget = max(0.0, 1.0 - self.budget_prompts / self.candidates)
        return {"skipped_budget": budget, "skipped_filter": max(0.0, skipped - budget)}


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation with average ranks for ties (nan when undefined)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 3:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(x.size, dtype=float)
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return (sums / counts)[inv]


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student t; 0 for one value)."""
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    if v.size == 1:
        return float(v[0]), 0.0
    df = v.size - 1
    t = _T95.get(df) or (1.96 if df > 30 else _T95[max(k for k in _T95 if k <= df)])
    return float(v.mean()), float(t * v.std(ddof=1) / math.sqrt(v.size))


def predictor_quality(records: Sequence[StepRecord]) -> dict[int, dict[str, float]]:
    """Spearman of the online predictions (made before the update) by depth.

    Against the bottom-up targets and, where the env has them, the exact values.
    """
    by_depth: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for r in records:
        for depth, v, target, tv in r.scored:
            by_depth[depth].append((v, target, tv))
    out = {}
    for depth, rows in sorted(by_depth.items()):
        arr = np.asarray(rows, dtype=float)
        has_tv = ~np.isnan(arr[:, 2])
        out[depth] = {
            "n": int(arr.shape[0]),
            "spearman": spearman(arr[:, 0], arr[:, 1]),
            "mse": float(np.mean((arr[:, 0] - arr[:, 1]) ** 2)),
            "spearman_true": spearman(arr[has_tv, 0], arr[has_tv, 2])
            if has_tv.sum() >= 3
            else math.nan,
        }
    return out


def prediction_error(records: Sequence[StepRecord]) -> dict[str, dict[str, float]]:
    """Squared error and Spearman of the predictions against exact Z, by depth.

    Depth 0 holds every candidate scored (selected or not), deeper depths every visited
    prefix; the predictions are the ones the allocator used (before the step's update).
    """
    by_depth: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        for depth, v, z in r.exact_scored:
            by_depth[int(depth)].append((v, z))
    out = {}
    for d, rows in sorted(by_depth.items()):
        a = np.asarray(rows, dtype=float)
        out[str(d)] = {
            "n": int(a.shape[0]),
            "mse": float(np.mean((a[:, 0] - a[:, 1]) ** 2)),
            "spearman": spearman(a[:, 0], a[:, 1]),
        }
    return out


def _mean_health(recs: Sequence[StepRecord]) -> dict[str, dict[str, float]]:
    """Each depth's figures averaged over the records (steps x seeds) that have them."""
    by_depth: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in recs:
        for d, figures in r.health.items():
            for k, v in figures.items():
                by_depth[int(d)][k].append(v)
    out = {}
    for d, figures in sorted(by_depth.items()):
        out[str(d)] = {
            k: float(np.nanmean(v)) if not all(math.isnan(x) for x in v) else math.nan
            for k, v in figures.items()
        }
    return out


def health_summary(recs: Sequence[StepRecord]) -> dict[str, Any]:
    """Predictor health of one row: by depth, by step (x depth), and the depth-0 headline.

    Every figure is computed per step of one seed (`StepRecord.health`) and averaged:
    over all steps and seeds by depth, over seeds for each step.
    """
    steps = sorted({r.step for r in recs})
    by_depth = _mean_health(recs)
    d0 = by_depth.get("0", {})
    return {
        "health_by_depth": by_depth,
        "health_by_step": [_mean_health([r for r in recs if r.step == s]) for s in steps],
        "gain_rank": d0.get("gain_rank", math.nan),
        "ece": d0.get("ece", math.nan),
        "brier": d0.get("brier", math.nan),
        "distinct_values": d0.get("distinct", math.nan),
    }


def _no_health() -> dict[str, Any]:
    return {
        "health_by_depth": {},
        "health_by_step": [],
        "gain_rank": math.nan,
        "ece": math.nan,
        "brier": math.nan,
        "distinct_values": math.nan,
    }


def _policy_row(recs: list[StepRecord], has_pred: bool) -> dict[str, Any]:
    """One policy's summary row: means, CIs, per-step series, depth profile, predictor figures."""
    seeds = sorted({r.seed for r in recs})
    keys = list(recs[0].metrics)
    per_seed = {
        k: [float(np.nanmean([r.metrics[k] for r in recs if r.seed == s])) for s in seeds]
        for k in keys
    }
    over = "seeds" if len(seeds) > 1 else "steps"
    row: dict[str, Any] = {
        "ci_over": over,
        "seeds": len(seeds),
        "steps": len(recs) // len(seeds),
    }
    for k in keys:
        vals = per_seed[k] if over == "seeds" else [r.metrics[k] for r in recs]
        mean, half = mean_ci(vals)
        row[k] = float(np.mean(per_seed[k]))
        row[k + "_ci"] = half if not math.isnan(mean) else math.nan
    steps = sorted({r.step for r in recs})
    for key in BY_STEP:
        row[f"{key}_by_step"] = [
            float(np.mean([r.metrics[key] for r in recs if r.step == s])) for s in steps
        ]
    row["effective_ratio_ci95"] = row["effective_ratio_ci"]
    row["pairs_per_te"] = row["pairs_per_cost"]
    depth: dict[int, int] = defaultdict(int)
    for r in recs:
        for d, c in r.replays_by_depth.items():
            depth[int(d)] += c
    row["replays_by_depth"] = {str(d): c for d, c in sorted(depth.items())}
    row["predictor_quality"] = (
        {str(d): q for d, q in predictor_quality(recs).items()} if has_pred else {}
    )
    row["prediction_error_by_depth"] = prediction_error(recs) if has_pred else {}
    row.update(health_summary(recs) if has_pred else _no_health())
    # distinct prompts over the whole run (per seed)
    row["distinct_prompts_total"] = len({(r.seed, p) for r in recs for p in r.prompt_ids}) / len(
        seeds
    )
    return row


def summarize(
    records: Sequence[StepRecord], *, oracle: str = "oracle", no_predictor: set[str] = frozenset()
) -> dict[str, Any]:
    """One summary per policy (mean, ci, per-step series, depth profile, predictor quality).

    Rows in `no_predictor` (the oracle, runs on exact values) get no predictor figures.
    """
    by_policy: dict[str, list[StepRecord]] = defaultdict(list)
    for r in records:
        by_policy[r.policy].append(r)
    policies = {
        name: _policy_row(recs, name not in no_predictor) for name, recs in by_policy.items()
    }
    out: dict[str, Any] = {"policies": policies}
    if oracle in policies:
        o = policies[oracle]
        out["oracle_effective_ratio"] = o["effective_ratio"]
        out["oracle_mixed_groups"] = o["mixed_groups"]
        for row in policies.values():
            row["oracle_gap"] = (
                row["effective_ratio"] / o["effective_ratio"] if o["effective_ratio"] else math.nan
            )
            row["oracle_gap_mixed"] = (
                row["mixed_groups"] / o["mixed_groups"] if o["mixed_groups"] else math.nan
            )
    else:
        out["oracle_effective_ratio"] = None
        for row in policies.values():
            row["oracle_gap"] = row["oracle_gap_mixed"] = math.nan
    return out


def format_table(summary: dict[str, Any], title: str = "", *, wide: bool = False) -> str:
    """A fixed-width table, one row per policy (value +/- 95% CI for the effective ratio).

    By default the `COMPACT` columns, the title wrapped to `TABLE_WIDTH`; ``wide`` gives
    every column of `COLUMNS` (the CSV and JSON always hold them all).
    """
    import textwrap

    columns = COLUMNS if wide else tuple(c for c in COLUMNS if c[0] in COMPACT)
    head = ["policy"] + [h for _, h, _ in columns]
    rows = [
        [name, *(_cell(row, key, fmt) for key, _, fmt in columns)]
        for name, row in summary["policies"].items()
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = (textwrap.wrap(title, TABLE_WIDTH) if not wide else [title]) if title else []
    for r in [head, ["-" * w for w in widths], *rows]:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    if not wide:
        lines.append(f"({len(columns)} of {len(COLUMNS)} columns; --wide for all, or summary.csv)")
    return "\n".join(lines)


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    v = row.get(key, math.nan)
    cell = "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)
    if key == "effective_ratio" and row.get("effective_ratio_ci"):
        cell += f"±{row['effective_ratio_ci'] * 100:.1f}"
    return cell


def format_quality(summary: dict[str, Any], policies: Sequence[str] = ("trace",)) -> str:
    """Predictor Spearman by depth (online predictions vs bottom-up targets / exact values)."""
    lines = []
    for name in policies:
        row = summary["policies"].get(name)
        if not row:
            continue
        parts = []
        quality = row["predictor_quality"]
        if len(quality) > 8:  # long horizons: the first depths, then every fifth
            quality = {d: q for d, q in quality.items() if int(d) < 4 or int(d) % 5 == 0}
        for d, q in quality.items():
            s = "nan" if math.isnan(q["spearman"]) else f"{q['spearman']:.2f}"
            st = "" if math.isnan(q["spearman_true"]) else f"/{q['spearman_true']:.2f}"
            parts.append(f"d{d}:{s}{st}(n={q['n']})")
        lines.append(f"  {name}: " + " ".join(parts))
    return (
        "predictor Spearman by depth (vs targets / vs exact values):\n" + "\n".join(lines)
        if lines
        else ""
    )


def format_error(summary: dict[str, Any]) -> str:
    """Prediction error against exact Z by depth (all candidates at 0, visited prefixes deeper)."""
    lines = []
    for name, row in summary["policies"].items():
        err = row.get("prediction_error_by_depth") or {}
        if not err:
            continue
        if len(err) > 8:
            err = {d: q for d, q in err.items() if int(d) < 5 or int(d) % 5 == 0}
        cells = " ".join(
            f"d{d}:{q['mse']:.3f}/{q['spearman']:.2f}"
            if q["spearman"] == q["spearman"]
            else f"d{d}:{q['mse']:.3f}/-"
            for d, q in err.items()
        )
        lines.append(f"  {name}: {cells}")
    if not lines:
        return ""
    return (
        "prediction error vs exact Z by depth (MSE/Spearman; d0 = every candidate):\n"
        + "\n".join(lines)
    )


def format_health(summary: dict[str, Any]) -> str:
    """Predictor health by depth (all steps) and gain_rank at depth 0 per step, per row."""
    lines = []
    for name, row in summary["policies"].items():
        by_depth = row.get("health_by_depth") or {}
        if not by_depth:
            continue
        if len(by_depth) > 8:
            by_depth = {d: q for d, q in by_depth.items() if int(d) < 5 or int(d) % 5 == 0}
        cells = " ".join(
            f"d{d}:{_num(q['gain_rank'], '{:+.2f}')}/{_num(q['ece'], '{:.3f}')}/"
            f"{_num(q['brier'], '{:.3f}')}/{_num(q['distinct'], '{:.0f}')}"
            for d, q in by_depth.items()
        )
        steps = " ".join(
            _num(s.get("0", {}).get("gain_rank", math.nan), "{:+.2f}")
            for s in row.get("health_by_step") or []
        )
        lines.append(f"  {name}: {cells}; d0 gain_rank per step: {steps}")
    if not lines:
        return ""
    return (
        "predictor health by depth (gain_rank/ECE/Brier/distinct values; d0 = every candidate "
        'scored; docs/alloc.md "Predictor health"):\n' + "\n".join(lines)
    )


def _num(v: float, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def format_curves(summary: dict[str, Any], key: str = "effective_ratio") -> str:
    """Per-step curves of one metric, one line per policy."""
    lines = [f"per-step {key}:"]
    for name, row in summary["policies"].items():
        ys = row.get(f"{key}_by_step") or []
        fmt = "{:.0%}" if key == "effective_ratio" else "{:.2f}"
        lines.append(f"  {name:<28} " + " ".join(fmt.format(y) for y in ys))
    return "\n".join(lines)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_outputs(
    summary: dict[str, Any],
    records: Sequence[StepRecord],
    *,
    json_path: Path | None,
    out_dir: Path | None,
) -> list[Path]:
    """JSON summary, CSVs (summary + per step) and PNG plots; returns the files written."""
    written = []
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2, default=_json_default))
        written.append(json_path)
    if out_dir is None:
        return [set_page_mode(p) for p in written]
    out_dir.mkdir(parents=True, exist_ok=True)
    written.append(write_provenance(out_dir, summary.get("config")))
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2, default=_json_default))
    written.append(path)
    scalar = [
        k
        for k, v in next(iter(summary["policies"].values())).items()
        if isinstance(v, (int, float, str))
    ]
    path = out_dir / "summary.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", *scalar])
        for name, row in summary["policies"].items():
            w.writerow([name, *[row.get(k) for k in scalar]])
    written.append(path)
    path = out_dir / "steps.csv"
    with open(path, "w", newline="") as f:
        keys = list(records[0].metrics) if records else []
        w = csv.writer(f)
        w.writerow(["policy", "seed", "step", *keys])
        for r in records:
            m = r.metrics
            w.writerow([r.policy, r.seed, r.step, *[m[k] for k in keys]])
    written.append(path)
    written.append(_health_csv(summary, out_dir / "health.csv"))
    written += _plots(summary, out_dir)
    return [set_page_mode(p) for p in written]


def _health_csv(summary: dict[str, Any], path: Path) -> Path:
    """One row per (policy, step, depth) of the health figures; step "all" is the run mean."""
    from trace_gym.predict.health import FIGURES

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "step", "depth", *FIGURES])
        for name, row in summary["policies"].items():
            tables = [("all", row.get("health_by_depth") or {})]
            tables += list(enumerate(row.get("health_by_step") or []))
            for step, by_depth in tables:
                for d, q in by_depth.items():
                    w.writerow([name, step, d, *[q.get(k) for k in FIGURES]])
    return path


def _plots(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, row in summary["policies"].items():
        ys = row["effective_ratio_by_step"]
        ax.plot(range(len(ys)), ys, marker="o", ms=3, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("effective ratio")
    ax.set_title("effective ratio per step (equal accounted cost)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    files.append(out_dir / "effective_ratio.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

    health = {n: r["health_by_step"] for n, r in summary["policies"].items() if r["health_by_step"]}
    if health:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, steps in health.items():
            ys = [s.get("0", {}).get("gain_rank", math.nan) for s in steps]
            ax.plot(range(len(ys)), ys, marker="o", ms=3, label=name)
        ax.set_xlabel("step")
        ax.set_ylabel("gain_rank at depth 0")
        ax.set_title("predictor health: Spearman of v(1-v) vs mixedness, every candidate")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        files.append(out_dir / "gain_rank.png")
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)

    branching = {
        n: r["replays_by_depth"] for n, r in summary["policies"].items() if r["replays_by_depth"]
    }
    if branching:
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / len(branching)
        for i, (name, depth) in enumerate(branching.items()):
            ds = np.array([int(d) for d in depth])
            counts = np.array(list(depth.values()), dtype=float)
            ax.bar(ds + i * width - 0.4 + width / 2, counts / counts.sum(), width=width, label=name)
        ax.set_xlabel("prefix depth (turns completed)")
        ax.set_ylabel("share of replays")
        ax.set_title("where the replay budget lands")
        ax.legend(fontsize=7)
        fig.tight_layout()
        files.append(out_dir / "replays_by_depth.png")
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)
    return files


def records_to_dicts(records: Sequence[StepRecord]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in asdict(r).items() if k not in ("scored", "prompt_ids", "exact_scored")}
        for r in records
    ]
