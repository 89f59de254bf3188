"""`trace-gym bench alloc`: equal accounted cost, shared candidate pools, outputs, generic envs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from trace_gym.bench import alloc as bench_alloc
from trace_gym.bench.alloc import BenchConfig, main, parse_shapes, run_bench
from trace_gym.bench.report import mean_ci, spearman

from trace_gym.errors import ConfigError


@pytest.fixture(scope="module")
def small():
    """A small run, with the candidate list each policy's runner was handed at each step."""
    offered: dict[tuple[int, int], list[list[str]]] = {}

    class RecordingRunner(bench_alloc.BranchingRunner):
        def run_step(self, step, candidates, *args, **kwargs):
            offered.setdefault((self.config.seed, step), []).append(list(candidates))
            return super().run_step(step, candidates, *args, **kwargs)

    cfg = BenchConfig(
        preset="math",
        steps=2,
        roots=32,
        replays=2,
        policies=("grpo", "pcl", "treepo", "trace", "oracle"),
        predictor="bayes",  # a point predictor, no cold start: the figures below assume it
        progress=False,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench_alloc, "BranchingRunner", RecordingRunner)
        res = run_bench(cfg)
    res.offered = offered
    return res


def test_equal_accounted_cost_and_shared_pools(small):
    cfg = small.config
    assert cfg.accounted_budget == 64 and cfg.flat_roots == 64 and cfg.candidates_per_step == 32
    by = {}
    for r in small.records:
        by.setdefault(r.step, {})[r.policy] = r
        if r.policy in ("grpo", "pcl"):  # flat: the whole budget as roots
            assert r.roots == 64 and r.replays == 0 and r.cost == 64
        else:  # tree: M roots + N*M replays at half a trajectory each
            assert r.roots == 32 and r.replays + r.replays_unspent == 64
            assert r.cost == 32 + 0.5 * r.replays
        assert r.candidates == 32
    # every policy was offered the same recorded pool of 32 distinct candidates each step
    # (a fresh pool per step), and chose its prompts from it
    pools = {}
    for (seed, step), offers in small.offered.items():
        assert len(offers) == 5 and all(o == offers[0] for o in offers), (seed, step)
        assert len(set(offers[0])) == 32
        pools[step] = set(offers[0])
    assert set(pools) == set(by) == {0, 1} and pools[0] != pools[1]
    for step, recs in by.items():
        for r in recs.values():
            assert r.prompt_ids and set(r.prompt_ids) <= pools[step], (r.policy, step)


def test_summary_shape(small):
    s = small.summary
    for name in ("grpo", "pcl", "treepo", "trace", "oracle"):
        row = s["policies"][name]
        for k in (
            "effective_ratio",
            "mixed_groups",
            "contrastive_pairs",
            "cost",
            "measured_turns",
            "distinct_prompts",
        ):
            assert isinstance(row[k], float) and not math.isnan(row[k])
        assert len(row["effective_ratio_by_step"]) == 2
    # the oracle's numbers are the mean of its own step records, and every policy's gap is
    # its effective ratio over the oracle's
    oracle_steps = [r.effective_ratio for r in small.records if r.policy == "oracle"]
    assert len(oracle_steps) == 2
    assert s["oracle_effective_ratio"] == pytest.approx(np.mean(oracle_steps))
    assert s["oracle_effective_ratio"] > 0
    for name, row in s["policies"].items():
        assert row["oracle_gap"] == pytest.approx(
            row["effective_ratio"] / s["oracle_effective_ratio"]
        ), name
    assert (
        s["policies"]["trace"]["replays_by_depth"] and not s["policies"]["grpo"]["replays_by_depth"]
    )
    # the goals of the policies present (no ablation row: its policies did not run), each
    # gated one marked met or not, and its verdict agreeing with the numbers it quotes
    assert len(s["goals"]) == 3 and not any(g["goal"].startswith("ablation") for g in s["goals"])
    assert [g["met"] is None for g in s["goals"]] == [False, False, True]
    t, g = s["policies"]["trace"], s["policies"]["grpo"]
    first = s["goals"][0]
    assert first["goal"].startswith("TRACE effective ratio >= 2.2x GRPO")
    assert first["met"] == (
        t["effective_ratio"] >= 2.2 * g["effective_ratio"] and t["mixed_per_te"] > g["mixed_per_te"]
    )
    assert f"{t['effective_ratio']:.1%} vs {g['effective_ratio']:.1%}" in first["measured"]
    assert all(isinstance(x["measured"], str) and x["measured"] for x in s["goals"])


def test_cli_writes_json_csv_and_plots(tmp_path):
    out = tmp_path / "out"
    argv = [
        "--preset",
        "hotpotqa",
        "--steps",
        "1",
        "--roots",
        "16",
        "--policies",
        "grpo,trace,oracle",
        "--json",
        str(tmp_path / "s.json"),
        "--out",
        str(out),
        "--no-progress",
        "--shapes-fixed-group",
        "16x2,8x6",
        "--shape-policies",
        "grpo,trace",
    ]
    assert main(argv) == 0
    d = json.loads((tmp_path / "s.json").read_text())
    assert set(d["policies"]) == {"grpo", "trace", "oracle"} and "oracle_effective_ratio" in d
    shapes = d["budget_shapes_fixed_group"]
    assert set(shapes) == {"16x2", "8x6"}
    assert shapes["16x2"]["accounted_budget"] == shapes["8x6"]["accounted_budget"] == 32
    # the 16x2 shape is the main run: its rows are reused, not rerun
    assert (
        shapes["16x2"]["policies"]["trace"]["effective_ratio"]
        == d["policies"]["trace"]["effective_ratio"]
    )
    # the JSON: per policy, plus calibration and protocol
    for name, row in d["policies"].items():
        for k in (
            "effective_ratio",
            "effective_ratio_ci95",
            "mixed_per_te",
            "pairs_per_te",
            "mixed_branch_share",
            "distinct_prompts",
            "unspent_budget",
        ):
            assert k in row, (name, k)
        assert row["mixed_per_te"] == pytest.approx(row["mixed_groups"] / row["cost"])
    assert d["calibration"]["resolved_share"] == 0.6 and d["protocol"]["prompts"] == "fresh"
    assert d["policies"]["oracle"]["prediction_error_by_depth"] == {}
    assert (
        d["policies"]["trace"]["prediction_error_by_depth"]["0"]["n"]
        == d["config"]["candidates_per_step"]
    )
    for f in (
        "summary.csv",
        "steps.csv",
        "summary.json",
        "effective_ratio.png",
        "replays_by_depth.png",
    ):
        assert (out / f).stat().st_size > 0


def test_cli_subprocess_and_errors():
    cmd = [
        sys.executable,
        "-m",
        "trace_gym.cli",
        "bench",
        "alloc",
        "--steps",
        "1",
        "--roots",
        "8",
        "--policies",
        "grpo,trace",
        "--no-progress",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "trace" in res.stdout and "goals" in res.stdout
    assert main(["--policies", "nope", "--steps", "1", "--roots", "8", "--no-progress"]) == 2


def test_generic_env_path_with_scripted_policy():
    cfg = BenchConfig(
        env_id="trace/Countdown-v0",
        policy="scripted",
        steps=1,
        roots=8,
        progress=False,
        policies=("grpo", "trace", "oracle"),
    )
    res = run_bench(cfg)
    assert set(res.summary["policies"]) == {"grpo", "trace"}  # no exact values: oracle dropped
    assert res.summary["oracle_effective_ratio"] is None
    with pytest.raises(ConfigError, match="Nope"):
        run_bench(
            BenchConfig(env_id="trace/Nope-v0", policy="scripted", steps=1, roots=8, progress=False)
        )


def test_budget_shapes_fix_prompts_and_pool(tmp_path):
    cfg = BenchConfig(preset="math", steps=1, roots=16, progress=False)
    shapes = bench_alloc.run_shapes(
        cfg, parse_shapes("512x2,512x6,1024x2"), ["treepo", "trace"], scale=0.125
    )
    assert [d["roots"] for d in shapes.values()] == [64, 64, 128]
    assert [d["roots_per_prompt"] for d in shapes.values()] == [2, 2, 4]
    assert {d["candidates_per_step"] for d in shapes.values()} == {128}
    for d in shapes.values():  # random branching takes exactly the fixed number of prompts
        assert d["policies"]["treepo"]["distinct_prompts"] == 32
    with pytest.raises(ConfigError, match="per prompt"):
        bench_alloc.run_shapes(cfg, parse_shapes("16x2"), ["trace"], scale=0.5)


def test_fresh_prompts_never_recur_and_revisit_keeps_the_v1_pools():
    cfg = BenchConfig(preset="math", steps=3, roots=16, progress=False)
    src = bench_alloc._sim_source(cfg, 0)
    fresh = bench_alloc.fresh_pools(cfg, src, 0)
    flat = [t for pool in fresh for t in pool]
    assert len(flat) == len(set(flat)) == 3 * cfg.candidates_per_step
    old = bench_alloc.candidate_pools(cfg, src, 0)
    assert len({t for pool in old for t in pool}) < len(flat) or old != fresh
    small = BenchConfig(preset="math", steps=3, roots=16, num_tasks=10, progress=False)
    with pytest.raises(ConfigError, match="--revisit"):
        bench_alloc.fresh_pools(small, bench_alloc._sim_source(small, 0), 0)


def test_oracle_and_noisy_predictors():
    from trace_gym.predict import make_predictor
    from trace_gym.predict.base import State
    from trace_gym.sim import SimEnv, true_value

    env = SimEnv("math", num_tasks=400)
    states = [State(t, "p") for t in env.task_ids]
    exact = np.array([true_value(t) for t in env.task_ids])
    assert np.allclose(make_predictor("oracle").predict(states), exact)
    for rho in (0.9, 0.7):
        noisy = make_predictor("noisy", rho=rho)
        v = noisy.predict(states)
        assert np.array_equal(v, noisy.predict(states))  # a pure function of the state
        assert abs(spearman(v, exact) - rho) < 0.06, (rho, spearman(v, exact))
    with pytest.raises(ConfigError):
        make_predictor("noisy", rho=1.5)
    assert bench_alloc.parse_predictor("noisy:0.8") == ("noisy", {"rho": 0.8})
    with pytest.raises(ConfigError):
        bench_alloc.parse_predictor("noisy:x")


def test_first_visit_reference_solves_the_posterior_objective_exactly():
    from itertools import product

    from trace_gym.bench.first_visit import FirstVisitAllocator, posterior_increments

    from trace_gym.alloc.base import Candidate
    from trace_gym.sim import SimEnv

    ids = list(SimEnv("math", num_tasks=5).task_ids)
    m_max = 4
    inc = posterior_increments(ids, m_max)
    gain = np.concatenate([np.zeros((5, 1)), np.cumsum(inc, axis=1)], axis=1)  # h(m)
    alloc = FirstVisitAllocator(m_max=m_max)
    for budget in (4, 7, 10):
        counts = alloc.allocate_roots(
            [Candidate(i, 0.5) for i in ids], budget, np.random.default_rng(0)
        )
        assert counts.sum() == budget and not np.any(counts == 1)
        best = max(
            sum(gain[i, m] for i, m in enumerate(ms))
            for ms in product([0, 2, 3, 4], repeat=5)
            if sum(ms) == budget
        )
        assert sum(gain[i, m] for i, m in enumerate(counts)) == pytest.approx(best)


def test_mixed_branch_share_counts_branch_points_with_both_outcomes():
    from trace_gym.tree import RolloutTree, Turn

    tree = RolloutTree("p", "prompt")
    a = tree.add_child(0, Turn("a", "o"))
    for r in (1.0, 0.0):  # a branches into a success and a failure: mixed
        leaf = tree.add_child(a.id, Turn("x", "o"))
        tree.finish(leaf.id, reward=r, terminated=True, truncated=False)
    b = tree.add_child(0, Turn("b", "o"))
    for _ in range(2):  # b branches into two failures: not mixed
        leaf = tree.add_child(b.id, Turn("y", "o"))
        tree.finish(leaf.id, reward=0.0, terminated=True, truncated=False)
    assert bench_alloc._branch_counts([tree]) == (3, 2)  # root, a, b; root and a mixed


def test_helpers():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(
        np.corrcoef([0.5, 0.5, 2, 3], [0, 1, 2, 3])[0, 1]
    )
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert parse_shapes("1024x2,512x6") == [(1024, 2.0), (512, 6.0)]
    with pytest.raises(ConfigError):
        parse_shapes("1024by2")
    with pytest.raises(ConfigError):
        BenchConfig(preset="atari")


def test_goal_table_runs_are_valid_bench_commands(capsys):
    from trace_gym.bench import sim_goals

    for name, (extra, seeds) in sim_goals.RUNS.items():
        args = bench_alloc._parser().parse_args(f"{extra} --seeds {seeds} --json x.json".split())
        cfg = bench_alloc._config(args)
        assert cfg.seeds == seeds and cfg.revisit == (name == "math-revisit"), name
    assert sim_goals.main(["/tmp/unused-goal-dir", "--only", "nope"]) == 2
    assert "unknown run" in capsys.readouterr().err


def test_health_per_step_and_depth_in_the_summary(small):
    """gain_rank/ECE/Brier/distinct by depth and by step; d0 counts every candidate scored."""
    s, cfg = small.summary, small.config
    trace = s["policies"]["trace"]
    d0 = trace["health_by_depth"]["0"]
    assert d0["n"] == cfg.candidates_per_step  # skipped candidates included (exact Z)
    assert -1 <= d0["gain_rank"] <= 1 and 0 <= d0["ece"] <= 1 and 0 <= d0["brier"] <= 1
    assert d0["distinct"] >= 1 and d0["outcomes"] > 0
    assert trace["gain_rank"] == d0["gain_rank"] and trace["ece"] == d0["ece"]
    assert len(trace["health_by_step"]) == 2 and "1" in trace["health_by_depth"]
    assert len(trace["distinct_prompts_by_step"]) == 2
    # by step: the figures of that step's records, which gain_rank recomputes from the log
    from trace_gym.predict.health import gain_rank

    recs = [r for r in small.records if r.policy == "trace"]
    for r in recs:
        z = [(v, e) for d, v, e in r.exact_scored if d == 0]
        expect = gain_rank(*zip(*z, strict=True))  # nan when the values are a constant
        assert r.health[0]["gain_rank"] == pytest.approx(expect, nan_ok=True)
        step = trace["health_by_step"][r.step]["0"]["gain_rank"]
        assert step == pytest.approx(r.health[0]["gain_rank"], nan_ok=True)
        assert math.isnan(expect) == (r.health[0]["distinct"] == 1)
    assert not math.isnan(trace["health_by_step"][1]["0"]["gain_rank"])  # learned by step 1
    # the oracle allocator has no predictor figures; a flat policy still has its prompts'
    assert s["policies"]["oracle"]["health_by_depth"] == {}
    assert math.isnan(s["policies"]["oracle"]["gain_rank"])
    assert "0" in s["policies"]["grpo"]["health_by_depth"]


def test_cell_mean_posterior_and_max_prompts_rows(tmp_path, capsys):
    argv = [
        "--preset",
        "math",
        "--steps",
        "2",
        "--roots",
        "32",
        "--policies",
        "grpo,trace,trace:posterior",
        "--predictor",
        "bayes",  # a point predictor: posterior == plug-in exactly
        "--reference",
        "--max-prompts",
        "8",
        "--json",
        str(tmp_path / "s.json"),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "predictor health by depth" in printed and "gain_rank" in printed
    d = json.loads((tmp_path / "s.json").read_text())
    rows = d["policies"]
    assert {"cell_mean", "first_visit", "trace:posterior", "trace:max_prompts=8"} <= set(rows)
    # a point predictor: the posterior objective is the plug-in one exactly
    assert (
        rows["trace:posterior"]["effective_ratio_by_step"]
        == rows["trace"]["effective_ratio_by_step"]
    )
    # the cap holds distinct prompts; GRPO's count is budget / group size
    assert max(rows["trace:max_prompts=8"]["distinct_prompts_by_step"]) <= 8
    assert rows["grpo"]["distinct_prompts_by_step"] == [8.0, 8.0]
    # the cell-mean reference: depth-0 values are cell means (few distinct values, as
    # many as the cells among the candidates), ranked against exact Z
    cm = rows["cell_mean"]["health_by_depth"]["0"]
    assert 1 < cm["distinct"] < d["config"]["candidates_per_step"]
    assert (tmp_path / "out" / "health.csv").stat().st_size > 0
    assert (tmp_path / "out" / "gain_rank.png").stat().st_size > 0
    assert main(["--policies", "trace:nope", "--steps", "1", "--roots", "8", "--no-progress"]) == 2


def test_cell_means_come_from_the_reference_pool():
    from trace_gym.bench.first_visit import CellMeanPredictor, _cell_of, _pool, cell_means

    from trace_gym.predict import make_predictor
    from trace_gym.predict.base import State
    from trace_gym.sim import SimEnv

    ids = list(SimEnv("math", num_tasks=40).task_ids)
    v = cell_means(ids)
    for tid, x in zip(ids, v, strict=True):
        stem, key = _cell_of(tid)
        z, groups = _pool(stem)
        assert x == pytest.approx(np.mean(z[groups[key]]))
        assert len(groups[key]) >= 25 or len(key) == 2  # fine cell, else the coarse one
    pred = CellMeanPredictor(make_predictor("features"))
    states = [State(t, "p") for t in ids[:3]] + [State(ids[0], "p", (("a", "o"),))]
    out = pred.predict(states)
    assert np.allclose(out[:3], v[:3])
    assert out[3] == pytest.approx(float(make_predictor("features").predict(states[3:])[0]))


def test_the_default_predictor_is_clue_and_falls_back_to_uniform_at_step_0():
    assert BenchConfig().predictor == "clue"
    res = run_bench(
        BenchConfig(preset="math", steps=2, roots=32, policies=("trace",), progress=False)
    )
    recs = [r for r in res.records if r.policy == "trace"]
    assert recs[0].health[0]["distinct"] == 1  # step 0: no data, uniform roots
    assert recs[1].health[0]["distinct"] > 1  # step 1: the clue model ranks the candidates


def test_the_table_is_compact_by_default_and_wide_on_request(capsys):
    """The default table fits a terminal (<= 100 characters, long policy names and CIs
    over two seeds included); --wide prints every column."""
    from trace_gym.bench.report import COLUMNS

    argv = ["--preset", "math", "--steps", "1", "--roots", "16", "--seeds", "2", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    table = out[: out.index("(eff: mean over steps")].splitlines()
    assert any(ln.startswith("uniform_roots_trace_prefixes") and "±" in ln for ln in table)
    assert max(map(len, table)) <= 100, "\n".join(table)
    assert "--wide for all" in out and "pairs/kturn" not in table[2]
    assert main([*argv, "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    header = next(ln for ln in wide if ln.startswith("policy "))
    assert header.split() == ["policy", *(h for _, h, _ in COLUMNS)]


def test_a_flat_policys_skipped_share_splits_into_budget_and_filter():
    from trace_gym.bench.report import StepRecord

    def rec(prompts: int, budget_prompts: int) -> StepRecord:
        return StepRecord(
            policy="p",
            seed=0,
            step=0,
            effective_ratio=0.5,
            mixed_groups=1,
            mixed_anchors=1,
            contrastive_pairs=0,
            cost=32.0,
            measured_turns=1,
            tokens=1,
            distinct_prompts=prompts,
            candidates=16,
            roots=32,
            replays=0,
            replays_unspent=0,
            failed_branches=0,
            wall_s=1.0,
            time_s={},
            replays_by_depth={},
            budget_prompts=budget_prompts,
        )

    m = rec(prompts=2, budget_prompts=4).metrics  # the budget pays 4 groups; the filter kept 2
    assert m["skipped_share"] == pytest.approx(14 / 16)
    assert (m["skipped_budget"], m["skipped_filter"]) == pytest.approx((12 / 16, 2 / 16))
    tree = rec(prompts=5, budget_prompts=0).metrics  # a tree policy: no split
    assert math.isnan(tree["skipped_budget"]) and math.isnan(tree["skipped_filter"])
    cfg = BenchConfig(preset="math", steps=1, roots=32, replays=2, progress=False)
    assert bench_alloc._budget_prompts(cfg, "greso") == cfg.flat_roots // cfg.group_size == 8
    assert bench_alloc._budget_prompts(cfg, "trace") == 0
