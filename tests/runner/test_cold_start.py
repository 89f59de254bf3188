"""Step 0 with no data: roots go uniformly in the baseline's groups, not ranked on a constant."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from trace_gym import sim
from trace_gym.alloc import make_allocator
from trace_gym.alloc.policies import uniform_roots
from trace_gym.predict import make_predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.seeding import stable_seed

TASKS = [f"sim-hotpotqa-0-{i}" for i in range(0, 64, 2)]


def _runner(allocator: str, predictor: str, seed: int = 0) -> BranchingRunner:
    return BranchingRunner(
        sim.SimPolicy("hotpotqa-luck"),
        lambda: gym.make("trace/Sim-v0", preset="hotpotqa-luck", num_tasks=64),
        make_allocator(allocator, m_max=8, group_size=4),
        make_predictor(predictor),
        RunnerConfig(root_budget=24, replays_per_root=2, seed=seed),
    )


def _groups(trees) -> dict[str, int]:
    return {t.prompt_id: sum(n.origin == "rollout" for n in t.leaves()) for t in trees}


def test_step_zero_without_data_gives_uniform_groups_then_trace_takes_over():
    r = _runner("trace", "clue")
    assert not r.predictor.has_data
    res = r.run_step(0, TASKS)
    groups = _groups(res.trees)
    assert sorted(groups.values()) == [4] * 6  # 24 roots in the baseline's groups of 4
    # exactly the prompts uniform_roots draws from the step's root generator
    counts = uniform_roots(len(TASKS), 24, 4, np.random.default_rng(stable_seed("roots", 0, 0)))
    assert set(groups) == {t for t, m in zip(TASKS, counts, strict=True) if m}
    assert res.report.replays > 0  # the prefix stage runs as usual
    assert r.predictor.has_data  # the step's update gave it data
    later = _groups(r.run_step(1, TASKS[1:] + TASKS[:1]).trees)
    assert sum(later.values()) == 24 and sorted(later.values()) != [4] * 6  # TRACE's own counts


def test_predictors_without_has_data_and_true_value_allocators_are_unchanged():
    # `features` has no has_data: TRACE ranks from step 0, as before (the frozen fixtures)
    trace = _groups(_runner("trace", "features").run_step(0, TASKS).trees)
    assert sorted(trace.values()) != [4] * 6
    # the oracle reads true values, so it needs no data: no uniform cold start
    with_clue = _groups(_runner("oracle", "clue").run_step(0, TASKS).trees)
    with_features = _groups(_runner("oracle", "features").run_step(0, TASKS).trees)
    assert with_clue == with_features
