"""Issue 25's learned-predictor goals: steps >= 1, depth-0 health, the cell-mean reference,
the prefix gap against the oracle's; `--seed-base` and the goal-table flags."""

from __future__ import annotations

import math

import numpy as np
import pytest
from trace_gym.bench import alloc as bench_alloc
from trace_gym.bench import learned_goals as lg
from trace_gym.bench.report import StepRecord


def _rec(policy: str, seed: int, step: int, eff: float, mixed: int, scored=()) -> StepRecord:
    return StepRecord(
        policy=policy, seed=seed, step=step, effective_ratio=eff, mixed_groups=mixed,
        mixed_anchors=mixed, contrastive_pairs=0, cost=256.0, measured_turns=1, tokens=1,
        distinct_prompts=4, candidates=8, roots=128, replays=256, replays_unspent=0,
        failed_branches=0, wall_s=1.0, time_s={}, replays_by_depth={},
        prompt_ids=["a"], exact_scored=list(scored),
    )  # fmt: skip


def test_goals_average_steps_after_the_cold_start():
    recs = []
    for seed in (0, 1):
        recs += [_rec("trace", seed, 0, 0.1, 2)] + [
            _rec("trace", seed, s, 0.6, 20) for s in (1, 2, 3)
        ]
        recs += [_rec("grpo", seed, s, 0.3, 10) for s in range(4)]
        recs += [_rec("first_visit", seed, s, 0.5, 20) for s in range(4)]
    assert lg.late_mean(recs, "trace", "effective_ratio") == pytest.approx(0.6)
    assert lg.late_mean(recs, "trace", "effective_ratio", first=0) == pytest.approx(0.475)
    p = {"trace": {}, "grpo": {}, "first_visit": {}}
    mixed, eff = lg.learned_goals(p, recs)
    assert "mixed groups" in mixed["goal"] and mixed["met"] is True  # 20 vs 20
    assert "effective ratio" in eff["goal"] and eff["met"] is True  # 0.6 vs 0.3


def test_depth0_health_and_the_prefix_gap_share():
    rng = np.random.default_rng(0)
    z = rng.beta(0.3, 0.3, 200)
    good = [(0, float(x), float(x)) for x in z]  # a perfect predictor
    recs = [_rec("trace", 0, s, 0.5, 5, good) for s in range(3)]
    h = lg.depth0_health(recs)
    assert h[2]["gain_rank"] == pytest.approx(1.0) and h[2]["ece"] == pytest.approx(0.0)
    out = lg._health_goals(recs, cell_rank=0.5)
    assert [g["met"] for g in out] == [True, True]
    gap = []
    for seed in (0, 1, 2):
        gap += [
            _rec("trace", seed, 0, 0.5 + 0.01 * seed, 1),
            _rec("trace_roots_random_prefixes", seed, 0, 0.45, 1),
        ]
        gap += [
            _rec("trace@oracle", seed, 0, 0.9, 1),
            _rec("trace_roots_random_prefixes@oracle", seed, 0, 0.8, 1),
        ]
    p = {
        k: {}
        for k in (
            "trace",
            "trace_roots_random_prefixes",
            "trace@oracle",
            "trace_roots_random_prefixes@oracle",
        )
    }
    (goal,) = lg._prefix_gap_goal(p, gap, bench_alloc.paired_difference)
    assert goal["met"] is False and "(60%)" in goal["measured"]  # +6 vs +10 points


def test_cell_means_track_exact_values(monkeypatch):
    from trace_gym.bench import first_visit

    from trace_gym.sim import true_value

    monkeypatch.setattr(first_visit, "REFERENCE_TASKS", 3000)  # a smaller reference pool
    lg._cell_table.cache_clear()

    ids = [f"sim-math_r06-0-{i}" for i in range(300)]
    z = np.array([true_value(i, []) for i in ids])
    v = lg.cell_means(ids)
    assert np.corrcoef(v, z)[0, 1] > 0.6 and not math.isnan(lg.gain_rank(v, z))
    lg._cell_table.cache_clear()


def test_seed_base_and_goal_table_flags():
    args = bench_alloc._parser().parse_args(
        "--seeds 2 --seed-base 100 --oracle-prefix-ablation --predictor clue".split()
    )
    cfg = bench_alloc._config(args)
    assert cfg.seed_base == 100 and cfg.predictor == "clue"
    assert [r[0] for r in cfg.rows] == ["trace@oracle", "trace_roots_random_prefixes@oracle"]
    small = bench_alloc.BenchConfig(
        preset="math", steps=1, roots=8, seeds=2, seed_base=100, policies=("grpo",), progress=False
    )
    assert {r.seed for r in bench_alloc.run_bench(small).records} == {100, 101}
