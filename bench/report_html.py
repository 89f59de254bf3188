"""HTML reports: an ``index.html`` beside a benchmark's PNG/CSV/JSON, and `trace-gym report RUN_DIR`.

`write_index` is the reusable part: given an output folder it shows the command that
produced it, the goals (when the summary has them), every CSV as a table and every PNG,
in one page that opens offline (images are the files beside it). `trace-gym bench alloc
--out DIR` calls it; so does `trace-gym report`, which first turns a training run
directory (``metrics.jsonl`` and, when the trainer saved them, ``trees/step_*.jsonl.gz``)
into plots: learning curves, effective ratio and mixed groups per step, budget per
depth, predictor quality and health (gain_rank, ECE, Brier) per step, and throughput.
Plots use matplotlib (a core dependency, already used by the benchmarks); matplotlib
is imported only when drawing.
"""

from __future__ import annotations

import csv
import html
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_gym.cli import Parser
from trace_gym.errors import TraceGymError
from trace_gym.files import set_page_mode, write_page

__all__ = ["ReportError", "main", "read_metrics", "run_report", "write_index"]

#: rows of one CSV shown in the page (the file has them all)
MAX_ROWS = 300
_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#222}
pre{background:#f5f5f5;padding:6px;white-space:pre-wrap}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}th{background:#eceff1}td:first-child{text-align:left}
.wrap{overflow:auto;max-height:60vh;margin-bottom:12px}figure{display:inline-block;margin:8px}
img{max-width:640px;border:1px solid #ddd}.met{color:#2e7d32}.not{color:#c62828}table.goals td{text-align:left}"""


class ReportError(TraceGymError):
    """A run directory the report cannot read (one line for the CLI)."""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _cell(v: str) -> str:
    try:
        f = float(v)
    except ValueError:
        return _e(v)
    if math.isnan(f) or f == int(f) and "." not in v:
        return _e(v)
    return _e(f"{f:.4g}")


def _csv_table(path: Path) -> str:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return ""
    head, body = rows[0], rows[1 : MAX_ROWS + 1]
    out = [f"<h2>{_e(path.name)}</h2><div class='wrap'><table><tr>"]
    out += [f"<th>{_e(h)}</th>" for h in head] + ["</tr>"]
    out += ["<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in r) + "</tr>" for r in body]
    out.append("</table></div>")
    if len(rows) - 1 > MAX_ROWS:
        out.append(
            f"<p>first {MAX_ROWS} of {len(rows) - 1} rows; all in <a href='{_e(path.name)}'>{_e(path.name)}</a></p>"
        )
    return "".join(out)


def _goals(summary: dict[str, Any] | None) -> str:
    goals = (summary or {}).get("goals") or []
    if not goals:
        return ""
    mark = {True: ("met", "met"), False: ("NOT met", "not"), None: ("report", "")}
    rows = "".join(
        f"<tr><td class='{mark[g.get('met')][1]}'>{mark[g.get('met')][0]}</td><td>{_e(g['goal'])}</td><td>{_e(g['measured'])}</td></tr>"
        for g in goals
    )
    return f"<h2>Goals</h2><table class='goals'><tr><th>status</th><th>goal</th><th>measured</th></tr>{rows}</table>"


def write_index(
    out_dir: str | Path,
    title: str,
    command: Sequence[str] | str,
    *,
    summary: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> Path:
    """Write ``out_dir/index.html``: the command, goals, every CSV as a table, every PNG."""
    out_dir = Path(out_dir)
    cmd = command if isinstance(command, str) else " ".join(_shell_quote(a) for a in command)
    csvs = sorted(out_dir.glob("*.csv"), key=lambda p: (p.name != "summary.csv", p.name))
    pngs = sorted(out_dir.glob("*.png"))
    others = sorted(
        p
        for p in out_dir.iterdir()
        if p.suffix in (".json", ".jsonl", ".html") and p.name != "index.html"
    )
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1><h2>Command</h2><pre>{_e(cmd)}</pre>",
        "".join(f"<p>{_e(n)}</p>" for n in notes),
        _goals(summary),
        "<h2>Plots</h2>" if pngs else "",
        "".join(
            f"<figure><img src='{_e(p.name)}' alt='{_e(p.stem)}'><figcaption>{_e(p.name)}</figcaption></figure>"
            for p in pngs
        ),
        "".join(_csv_table(p) for p in csvs),
        "<h2>Files</h2><ul>"
        + "".join(f"<li><a href='{_e(p.name)}'>{_e(p.name)}</a></li>" for p in others + csvs + pngs)
        + "</ul>",
        f"<p><small>written {time.strftime('%Y-%m-%d %H:%M:%S %Z')}</small></p></body></html>",
    ]
    return write_page(out_dir / "index.html", "".join(parts))


def _shell_quote(arg: str) -> str:
    import shlex

    return shlex.quote(str(arg))


# ---------------------------------------------------------------------- training runs
def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` (one per step), or `ReportError`."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ReportError(
            f"{run_dir}: no metrics.jsonl (is this a `trace-gym train` output directory?)"
        )
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReportError(
                f"{path}:{lineno}: not valid JSON ({e.msg}); the file is corrupted"
            ) from e
        if not isinstance(row, dict) or "step" not in row:
            raise ReportError(f"{path}:{lineno}: a metrics row needs a 'step'")
        if rows and row["step"] <= rows[-1]["step"]:  # two runs appended into one folder
            raise ReportError(
                f"{path}:{lineno}: step {row['step']} after step {rows[-1]['step']}; the steps "
                "must increase (two runs wrote into this folder: rerun with --overwrite)"
            )
        rows.append(row)
    if not rows:
        raise ReportError(f"{path}: empty (no step finished yet)")
    return rows


def _tree_stats(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Per step, from the saved trees: budget by depth and predictor Spearman (value vs target)."""
    from trace_gym.bench.report import spearman
    from trace_gym.bench.view import ViewError, budget_by_depth, read_trees

    out: dict[int, dict[str, Any]] = {}
    for path in sorted((run_dir / "trees").glob("*.jsonl*")):
        try:
            trees = read_trees([path])
        except ViewError as e:
            raise ReportError(str(e)) from e
        pairs = [
            (n.value, n.target)
            for t in trees
            for n in t.nodes
            if n.value is not None and n.target is not None
        ]
        step = trees[0].step
        out[step] = {
            "depth": budget_by_depth(trees),
            "spearman": spearman([a for a, _ in pairs], [b for _, b in pairs]),
            "scored": len(pairs),
        }
    return out


@dataclass(frozen=True)
class Panel:
    """One axis of a run plot: the metrics.jsonl keys it draws (those present) on one scale."""

    #: the y axis label (says the scale the keys share)
    ylabel: str
    #: the metrics.jsonl keys drawn, each as one series
    keys: tuple[str, ...]
    #: legend labels of `keys` (default: the keys)
    labels: tuple[str, ...] = ()
    #: grouped bars instead of lines (series with equal values stay visible side by side)
    bars: bool = False
    #: a fixed y range (rank correlations: -1..1), else matplotlib's
    ylim: tuple[float, float] | None = None


#: marker and dash of the i-th line of a panel
LINES = ("o-", "s--", "^:", "D-.", "v-")


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[Any], list[float]]:
    """(steps, values) of one key where it is a finite number (a NaN figure is no point)."""
    pts = [
        (r["step"], r[key])
        for r in rows
        if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    ]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def _draw_panel(ax: Any, rows: list[dict[str, Any]], panel: Panel) -> None:
    import matplotlib.ticker

    keys = [k for k in panel.keys if _series(rows, k)[0]]
    labels = dict(zip(panel.keys, panel.labels or panel.keys, strict=True))
    width = 0.8 / len(keys)
    for i, k in enumerate(keys):
        xs, ys = _series(rows, k)
        if panel.bars:
            ax.bar([x - 0.4 + (i + 0.5) * width for x in xs], ys, width=width, label=labels[k])
        else:
            # later series draw smaller markers and other dashes over earlier ones, so
            # series with equal values (two envs at 0) stay visible
            big = 3 + 2.5 * (len(keys) - 1 - i)
            ax.plot(
                xs, ys, LINES[i % len(LINES)], ms=big, mfc="none" if i else None, label=labels[k]
            )
    ax.set_ylabel(panel.ylabel)
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.legend(fontsize=7)


def run_figure(rows: list[dict[str, Any]], title: str, panels: Sequence[Panel]) -> Any:
    """A figure with one axis per panel that has data (None when none has), sharing the steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in panels if any(_series(rows, k)[0] for k in p.keys)]
    if not panels:
        return None
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(6.4, 1.2 + 2.4 * len(panels)), sharex=True, squeeze=False
    )
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        _draw_panel(ax, rows, panel)
    steps = [r["step"] for r in rows]
    axes[-1, 0].set_xlim(min(steps) - 0.5, max(steps) + 0.5)  # every plot spans the whole run
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].set_title(title)
    fig.tight_layout()
    return fig


def _save(fig: Any, path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    if fig is None:
        return None
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return set_page_mode(path)


def _depth_plot(stats: dict[int, dict[str, Any]], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    depths = sorted({d for s in stats.values() for d in s["depth"]})
    if not depths:
        return None
    steps = sorted(stats)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    bottom = [0.0] * len(steps)
    for d in depths:
        h = [stats[s]["depth"].get(d, 0) for s in steps]
        ax.bar(steps, h, bottom=bottom, label="roots" if d == 0 else f"replays at depth {d}")
        bottom = [a + b for a, b in zip(bottom, h, strict=True)]
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("branches started")
    ax.set_title("budget per depth (from the saved trees)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return set_page_mode(path)


#: the run report's plots: file, title, panels (each on its own scale; those with data)
RUN_PLOTS: tuple[tuple[str, str, tuple[Panel, ...]], ...] = (
    (
        "learning.png",
        "learning curves",
        (Panel("success rate", ("reward", "eval_success", "eval_pass")),),
    ),
    (
        "loss.png",
        "loss terms; the policy's entropy on its own scale below",
        (Panel("loss", ("loss", "pg_loss", "kl")), Panel("entropy (nats / token)", ("entropy",))),
    ),
    (
        "effective_ratio.png",
        "effective ratio per step",
        (Panel("share of prompts", ("effective_ratio",)),),
    ),
    (
        "mixed_groups.png",
        "mixed groups per step",
        (Panel("count", ("mixed_groups", "mixed_anchors", "contrastive_pairs")),),
    ),
    (
        "roots_replays.png",
        "roots and replays per step",
        (Panel("count", ("roots", "replays", "failed_branches"), bars=True),),
    ),
    (
        "predictor.png",
        "predictor quality per step",
        (
            Panel(
                "Spearman (rank correlation)",
                ("predictor_spearman", "predictor_gain_rank", "predictor_gain_rank_prefix"),
                (
                    "value vs realised rate, every scored node",
                    "gain_rank, prompts",
                    "gain_rank, prefixes",
                ),
                ylim=(-1.05, 1.05),
            ),
            Panel(
                "error (lower is better)",
                ("predictor_mse", "predictor_ece", "predictor_brier", "predictor_loss"),
                ("update MSE", "ECE", "Brier", "update loss"),
            ),
        ),
    ),
    (
        "health.png",
        "predictor health of the selected prompts (docs/alloc.md)",
        (
            Panel(
                "value",
                ("health_d0_gain_rank", "health_d0_ece", "health_d0_brier", "health_d1_gain_rank"),
            ),
        ),
    ),
    (
        "throughput.png",
        "throughput",
        (Panel("tokens / s", ("gen_tokens_per_s", "train_tokens_per_s")),),
    ),
    (
        "time.png",
        "time per step",
        (
            Panel(
                "seconds",
                ("time_rollout_s", "time_train_s", "time_eval_s", "time_checkpoint_s"),
            ),
        ),
    ),
)
#: a mixture's per-env figures (``env/<id>/<metric>``, trace_gym.mixture): metric, y label
ENV_METRICS = (
    ("effective_ratio", "effective ratio"),
    ("success", "success rate"),
    ("roots", "roots"),
    ("turns", "turns"),
    ("tokens", "tokens"),
)


def env_panels(rows: list[dict[str, Any]]) -> list[Panel]:
    """One panel per per-env metric of a mixture run, one line per env (none for one env)."""
    # an env id holds slashes itself ("trace/Sim-v0"): the metric is the last part
    envs = sorted({k[4:].rsplit("/", 1)[0] for r in rows for k in r if k.startswith("env/")})
    return [
        Panel(ylabel, tuple(f"env/{e}/{metric}" for e in envs), tuple(envs))
        for metric, ylabel in ENV_METRICS
    ]


def _write_steps_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    keys = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], (dict, list))))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for r in rows:
            w.writerow([r.get(k, "") for k in keys])
    return set_page_mode(path)


def run_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Plots, a per-step CSV and ``index.html`` for a training run; returns the page."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: not a directory")
    rows = read_metrics(run_dir)
    stats = _tree_stats(run_dir) if (run_dir / "trees").is_dir() else {}
    for r in rows:
        s = stats.get(int(r["step"]))
        if s is not None:
            r["predictor_spearman"] = s["spearman"]
            r["scored_nodes"] = s["scored"]
            r.update({f"branches_depth_{d}": c for d, c in s["depth"].items()})
    out_dir = Path(out) if out is not None else run_dir / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, title, panels in RUN_PLOTS:
        _save(run_figure(rows, title, panels), out_dir / name)
    _save(
        run_figure(rows, "per env of the mixture (env/<id>/<metric>)", env_panels(rows)),
        out_dir / "per_env.png",
    )
    notes = [f"{len(rows)} steps from {run_dir / 'metrics.jsonl'}."]
    if stats:
        _depth_plot(stats, out_dir / "budget_by_depth.png")
        notes.append(
            f"Budget per depth and predictor Spearman from {len(stats)} tree files in {run_dir / 'trees'}; "
            f"browse them with: trace-gym view {run_dir / 'trees'}"
        )
    else:
        notes.append(
            "No trees/ folder (train with save_trees on): budget per depth and predictor Spearman come from the trees."
        )
    _write_steps_csv(rows, out_dir / "steps.csv")
    return write_index(
        out_dir,
        f"training run {run_dir.resolve().name}",
        ["trace-gym", "report", str(run_dir)],
        notes=notes,
    )


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="trace-gym report", description=__doc__.splitlines()[0])
    p.add_argument(
        "run_dir", type=Path, help="a `trace-gym train` output directory (metrics.jsonl, trees/)"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="where to write the report (default RUN_DIR/report)"
    )
    args = p.parse_args(argv)
    try:
        page = run_report(args.run_dir, args.out)
    except (ReportError, OSError) as e:  # an OSError names the path it could not write
        print(f"trace-gym report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
