"""HTML reports: `write_index` beside bench outputs, `bench alloc --out`, `trace-gym report RUN_DIR`."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from trace_gym.bench.alloc import main as alloc_main
from trace_gym.bench.report_html import run_report, write_index
from trace_gym.bench.view_bench import HOSTILE, synthetic_trees

from trace_gym.tree import batch_metrics, save_trees


def _png(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    fig.savefig(path)
    plt.close(fig)


def test_index_shows_command_goals_tables_and_plots_escaped(tmp_path):
    with open(tmp_path / "summary.csv", "w", newline="") as f:
        csv.writer(f).writerows([["policy", "eff"], [HOSTILE[0], "0.123456"], ["trace", "0.6"]])
    _png(tmp_path / "effective_ratio.png")
    (tmp_path / "summary.json").write_text("{}")
    goals = [{"goal": "TRACE >= 2x GRPO", "measured": "60% vs 27%", "met": True}]
    page = write_index(
        tmp_path,
        "bench <x>",
        ["trace-gym", "bench", "alloc", "--out", "my dir"],
        summary={"goals": goals},
    )
    text = page.read_text()
    assert "trace-gym bench alloc --out &#x27;my dir&#x27;" in text
    assert "<img src='effective_ratio.png'" in text and "href='summary.json'" in text
    assert "<td>0.1235</td>" in text and "TRACE &gt;= 2x GRPO" in text and "bench &lt;x&gt;" in text
    assert "</script><script>" not in text and "&lt;/script&gt;" in text


def test_bench_alloc_out_writes_index_with_its_command(tmp_path):
    out = tmp_path / "out"
    argv = [
        "--preset",
        "math",
        "--steps",
        "1",
        "--roots",
        "16",
        "--policies",
        "grpo,trace",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert alloc_main(argv) == 0
    text = (out / "index.html").read_text()
    assert "trace-gym bench alloc --preset math --steps 1 --roots 16" in text
    assert (
        "<img src='effective_ratio.png'" in text
        and "<h2>summary.csv</h2>" in text
        and "<h2>Goals</h2>" in text
    )


def _run_dir(tmp_path, steps=3):
    run = tmp_path / "run"
    rows = []
    for step in range(steps):
        trees = synthetic_trees(4, 20, seed=step, per_step=4)
        for t in trees:
            t.step = step
        save_trees(trees, run / "trees" / f"step_{step:06d}.jsonl.gz")
        bm = batch_metrics(trees)
        # the keys trainers/loop.py writes (a subset)
        rows.append(
            {
                "step": step,
                "reward": bm["success_rate"],
                "effective_ratio": bm["effective_ratio"],
                "mixed_groups": bm["mixed_groups"],
                "mixed_anchors": bm["mixed_anchors"],
                "roots": 16,
                "replays": 30,
                "loss": 0.1 * step,
                "gen_tokens_per_s": 100.0 + step,
                "train_tokens_per_s": 50.0,
                "time_rollout_s": 1.0,
                "time_train_s": 2.0,
                "predictor_loss": 0.2,
                "health_d0_gain_rank": 0.1 * step,
                "health_d0_ece": 0.05,
            }
        )
    rows[-1]["eval_success"] = 0.4
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_run_report_plots_every_section_and_the_trees(tmp_path):
    page = run_report(_run_dir(tmp_path))
    out = page.parent
    assert out == tmp_path / "run" / "report"
    for name in (
        "learning.png",
        "loss.png",
        "effective_ratio.png",
        "mixed_groups.png",
        "budget_by_depth.png",
        "predictor.png",
        "health.png",
        "throughput.png",
        "time.png",
        "steps.csv",
    ):
        assert (out / name).stat().st_size > 0, name
    with open(out / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert (
        len(rows) == 3 and rows[0]["predictor_spearman"] and int(rows[0]["branches_depth_0"]) == 16
    )
    text = page.read_text()
    assert (
        "trace-gym report" in text
        and "<img src='budget_by_depth.png'" in text
        and "trace-gym view" in text
    )


def _report(*args):
    return subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "case", ["missing", "no-metrics", "corrupt", "empty", "bad-trees", "steps-repeat"]
)
def test_report_bad_run_dirs_give_one_line_and_exit_2(tmp_path, case):
    run = tmp_path / "run"
    if case != "missing":
        run.mkdir()
    if case == "corrupt":
        (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "rew')
    if case == "empty":
        (run / "metrics.jsonl").write_text("\n")
    if case == "bad-trees":
        (run / "metrics.jsonl").write_text('{"step": 0}\n')
        (run / "trees").mkdir()
        (run / "trees" / "step_000000.jsonl").write_text("")
    if case == "steps-repeat":  # two runs appended into one folder (issue 27.4)
        (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in (0, 1, 2, 0, 1)))
    res = _report(str(run))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trace-gym report: "), res.stderr
    if case == "steps-repeat":
        assert "metrics.jsonl:4: step 0 after step 2" in lines[0], lines[0]


def _figure(rows, name):
    from trace_gym.bench.report_html import RUN_PLOTS, run_figure

    title, panels = next((t, p) for n, t, p in RUN_PLOTS if n == name)
    return run_figure(rows, title, panels)


def _labels(ax):
    return [line.get_label() for line in ax.get_lines()]


def _rows():
    return [
        {
            "step": s,
            "loss": 0.02 * s,
            "pg_loss": 0.01,
            "entropy": 4.5 - 0.1 * s,
            "roots": 16,
            "replays": 16,  # equal to the roots: both series must still show
            "predictor_spearman": 0.3,
            "predictor_gain_rank": 0.2,
            "predictor_mse": 0.04,
            "predictor_n": 120.0,
            "predictor_labels": 480.0,
            "predictor_ece": 0.1,
        }
        for s in range(3)
    ]


def test_predictor_plot_keeps_rank_correlations_apart_from_errors_and_counts():
    fig = _figure(_rows(), "predictor.png")
    rank, error = fig.axes
    assert "Spearman" in rank.get_ylabel() and rank.get_ylim() == (-1.05, 1.05)
    assert set(_labels(rank)) == {"value vs realised rate, every scored node", "gain_rank, prompts"}
    assert "Spearman" not in error.get_ylabel() and set(_labels(error)) == {"update MSE", "ECE"}
    drawn = [y for ax in fig.axes for line in ax.get_lines() for y in line.get_ydata()]
    assert max(drawn) < 1  # counts (n = 120, labels = 480) are in steps.csv, not on a scale


def test_entropy_has_its_own_scale_in_the_loss_plot():
    loss, entropy = _figure(_rows(), "loss.png").axes
    assert set(_labels(loss)) == {"loss", "pg_loss"} and loss.get_ylim()[1] < 1
    assert _labels(entropy) == ["entropy"] and "entropy" in entropy.get_ylabel()


def test_equal_roots_and_replays_both_show():
    (ax,) = _figure(_rows(), "roots_replays.png").axes
    bars = {c.get_label(): c.patches for c in ax.containers}
    assert set(bars) == {"roots", "replays"}
    for r, p in zip(bars["roots"], bars["replays"], strict=True):
        assert r.get_height() == p.get_height() == 16
        assert r.get_x() + r.get_width() <= p.get_x()  # side by side, never one over the other


def test_a_mixture_run_report_plots_its_per_env_metrics(tmp_path):
    from trace_gym.bench.report_html import env_panels, run_figure

    run = _run_dir(tmp_path)
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert run_figure(rows, "t", env_panels(rows)) is None  # one env: nothing per env
    envs = ("trace/Sim-v0", "trace/Math-v0", "trace/BFCL-v0")
    for i, r in enumerate(rows):
        for j, env in enumerate(envs):
            r.update({f"env/{env}/effective_ratio": 0.1 * j, f"env/{env}/success": 0.2 * i})
            r.update({f"env/{env}/roots": 4.0 + j, f"env/{env}/turns": 3.0 * (j + 1)})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = run_report(run)
    assert (page.parent / "per_env.png").stat().st_size > 0
    assert "<img src='per_env.png'" in page.read_text()
    fig = run_figure(rows, "t", env_panels(rows))
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "effective ratio",
        "success rate",
        "roots",
        "turns",
    ]
    for ax in fig.axes:
        assert set(_labels(ax)) == set(envs)


def test_a_figure_that_is_nan_at_every_step_is_not_in_the_legend():
    rows = _rows()
    for r in rows:
        r["predictor_gain_rank"] = float("nan")  # no mixed prompt to rank: undefined
    rank, _ = _figure(rows, "predictor.png").axes
    assert _labels(rank) == ["value vs realised rate, every scored node"]


def test_lines_with_equal_values_stay_visible_one_over_the_other():
    rows = [{"step": s, "reward": 0.0, "eval_success": 0.0, "eval_pass": 0.0} for s in range(3)]
    (ax,) = _figure(rows, "learning.png").axes
    lines = ax.get_lines()
    sizes = [line.get_markersize() for line in lines]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3  # concentric markers
    assert len({(line.get_marker(), line.get_linestyle()) for line in lines}) == 3
