"""Multi-env mixtures: one task pool, per-env candidate shares and rollout costs, per-env figures."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest

from trace_gym.alloc import make_allocator
from trace_gym.alloc.solvers import root_value, solve_roots_costed, solve_roots_reference
from trace_gym.errors import AllocationError, ConfigError, TaskNotFound
from trace_gym.mixture import (
    RolloutCosts,
    member_of,
    mixture_candidates,
    per_env_metrics,
    per_member,
)
from trace_gym.predict import make_predictor
from trace_gym.runner import BranchingRunner, RunnerConfig

MEMBERS = {"trace/Sim-v0": {"preset": "math", "num_tasks": 16}, "trace/BFCL-v0": {}}
PRIORS = {"trace/Sim-v0": 2.0, "trace/BFCL-v0": 6.0}


def mixture():
    return gym.make("trace/Mixture-v0", members=MEMBERS, costs=PRIORS)


class Router:
    """Each member's scripted policy, chosen by the conversation's env id."""

    def __init__(self):
        from trace_gym.agents.scripted import make_scripted

        env = mixture().unwrapped
        self.by_env = {m: make_scripted(m, skill=0.6, env=env.member(m).unwrapped) for m in MEMBERS}

    def generate(self, convs):
        return [self.by_env[c.env_id].generate([c])[0] for c in convs]


def test_mixture_env_routes_tasks_and_restores_into_the_right_member():
    env = mixture().unwrapped
    ids = env.task_ids
    assert {member_of(t) for t in ids} == set(MEMBERS) and len(ids) == 16 + len(
        env.member("trace/BFCL-v0").unwrapped.task_ids
    )
    bfcl = next(t for t in ids if t.startswith("trace/BFCL-v0::"))
    prompt, info = env.reset(seed=1, options={"task": bfcl})
    assert info["mixture_member"] == "trace/BFCL-v0" and info["task_id"] == bfcl.partition("::")[2]
    env.step("I will look at the files first.")
    ckpt = env.checkpoint()
    other = mixture().unwrapped
    other.reset(seed=2, options={"task": ids[0]})  # a Sim task is active there
    other.restore(ckpt)
    a, b = env.step("done"), other.step("done")
    assert a[0] == b[0] and a[1:4] == b[1:4]
    with pytest.raises(TaskNotFound):
        env.reset(options={"task": "trace/Math-v0::x"})
    with pytest.raises(ConfigError, match="not members"):
        gym.make("trace/Mixture-v0", members=MEMBERS, weights={"trace/Math-v0": 1.0})
    with pytest.raises(ConfigError, match="> 0"):
        gym.make("trace/Mixture-v0", members=MEMBERS, costs={"trace/Sim-v0": 0.0})


def test_candidates_follow_the_weights_and_member_slices():
    ids = (
        [f"a::{i}" for i in range(20)]
        + [f"b::{i}" for i in range(20)]
        + [f"c::{i}" for i in range(5)]
    )
    got = mixture_candidates(ids, {"a": 2.0, "b": 1.0, "c": 1.0}, 12, np.random.default_rng(0))
    assert [member_of(t) for t in got].count("a") == 6 and len(set(got)) == 12
    assert [member_of(t) for t in got].count("c") == 3
    assert (
        mixture_candidates(ids, {"a": 2.0, "b": 1.0, "c": 1.0}, 12, np.random.default_rng(0)) == got
    )
    assert per_member(ids, 2) == ["a::0", "a::1", "b::0", "b::1", "c::0", "c::1"]
    assert per_member(["x", "y", "z"], 2) == ["x", "y"]


def test_costed_root_solver_is_optimal_and_never_overspends():
    rng = np.random.default_rng(3)
    for _ in range(20):
        v, c = rng.uniform(0.05, 0.95, 4), rng.choice([0.5, 1.0, 1.5, 2.5], 4)
        budget, m_max = float(rng.integers(2, 12)), 5
        sol = solve_roots_costed(v, c, budget, m_max)
        assert float(sol.counts @ c) <= budget + 1e-9
        best = max(
            float(root_value(v, np.array(ms)).sum())
            for ms in itertools.product([0, 2, 3, 4, 5], repeat=4)
            if np.dot(ms, c) <= budget + 1e-9
        )
        assert sol.objective == pytest.approx(best)
    v = rng.uniform(0.05, 0.95, 6)  # unit costs: the flat problem (best total <= budget)
    assert solve_roots_costed(v, np.ones(6), 13, 4).objective == pytest.approx(
        solve_roots_reference(v, 13, 4, exact_budget=False).objective
    )
    with pytest.raises(AllocationError):
        solve_roots_costed(v, np.zeros(6), 10)


def test_one_budget_over_envs_each_with_its_own_rollout_cost():
    runner = BranchingRunner(
        Router(),
        mixture,
        make_allocator("trace", m_max=8),
        make_predictor("features"),
        RunnerConfig(root_budget=24, replays_per_root=1.0, m_max=8, seed=0, rollout_cost="turns"),
    )
    ids = mixture().unwrapped.task_ids
    weights = {"trace/Sim-v0": 1.0, "trace/BFCL-v0": 1.0}
    try:
        for step in range(2):
            before = dict(runner.costs.mean)
            cands = mixture_candidates(ids, weights, 12, np.random.default_rng(step))
            trees, rep = runner.run_step(step, cands)
            assert {t.env_id for t in trees} == set(MEMBERS)
            costs = {t.env_id: t.info["rollout_cost"] for t in trees}
            assert costs["trace/BFCL-v0"] > 2 * costs["trace/Sim-v0"]  # BFCL rollouts are longer
            spent = sum(t.info["rollout_cost"] * t.info["root_count"] for t in trees)
            assert spent <= 24 + 1e-6 and rep.replays > 0
            _check_cost_weighted_accounting(trees, rep, replay_budget=24, replay_cost=0.5)
            assert rep.failed_branches == 0  # each policy saw its member's own task ids
            table = per_env_metrics(trees)
            assert set(table) == set(MEMBERS) and all(
                0 <= r["success"] <= 1 for r in table.values()
            )
            assert runner.costs.mean != before  # measured turns folded in
    finally:
        runner.close()


def _check_cost_weighted_accounting(trees, rep, *, replay_budget, replay_cost, flat=True):
    """Roots and replays charged their env's cost; replays shared by cost-weighted roots."""
    cost = {t.prompt_id: t.info.get("rollout_cost", 1.0) for t in trees}
    replays = {t.prompt_id: len(t.leaves()) - t.info["root_count"] for t in trees}
    assert sum(replays.values()) == rep.replays
    root_charge = sum(cost[t.prompt_id] * t.info["root_count"] for t in trees)
    assert rep.root_charge == pytest.approx(root_charge)
    assert rep.accounted_cost == pytest.approx(rep.root_charge + rep.replay_charge)
    if flat:  # every replay is charged its env's cost times the flat replay cost
        charged = sum(cost[p] * replay_cost * k for p, k in replays.items())
        assert rep.replay_charge == pytest.approx(charged)
    # the continuation budget's cost is never exceeded
    assert rep.replay_charge <= replay_budget * replay_cost + 1e-9


def test_cost_aware_replays_in_a_mixture_are_charged_their_env_cost():
    runner = BranchingRunner(
        Router(),
        mixture,
        make_allocator("trace", m_max=8, cost_aware=True),
        make_predictor("features"),
        RunnerConfig(root_budget=24, replays_per_root=1.0, m_max=8, seed=1, rollout_cost="turns"),
    )
    ids = mixture().unwrapped.task_ids
    try:
        cands = mixture_candidates(ids, {m: 1.0 for m in MEMBERS}, 12, np.random.default_rng(5))
        trees, rep = runner.run_step(0, cands)
        assert rep.replays > 0
        _check_cost_weighted_accounting(trees, rep, replay_budget=24, replay_cost=0.5, flat=False)
    finally:
        runner.close()


def test_replay_shares_follow_cost_weighted_roots():
    from trace_gym.alloc import split_budget, split_costed_budget

    roots = [4, 2, 6, 0, 3]
    assert split_costed_budget(roots, [1.0] * 5, 17).tolist() == split_budget(roots, 17).tolist()
    costs = [0.5, 3.0, 1.0, 2.0, 0.5]
    for total in (0, 1, 7, 15, 40, 101):
        k = split_costed_budget(roots, costs, total)
        assert float(np.dot(k, costs)) <= total + 1e-9  # the cost, not the count, is bounded
        assert k[3] == 0 and (k >= 0).all()
        quota = np.array(roots) * total / float(np.dot(roots, costs))
        assert np.all(np.abs(k - quota) < 1.0 + 1e-9)  # within one replay of its share
        # nothing is left that a prompt could still afford by the largest-remainder rule
        left = total - float(np.dot(k, costs))
        assert not any(c <= left - 1e-9 and k[i] < quota[i] for i, c in enumerate(costs))
    with pytest.raises(AllocationError):
        split_costed_budget(roots, [1.0, 0.0, 1.0, 1.0, 1.0], 5)
    with pytest.raises(AllocationError):
        split_costed_budget(roots, [1.0] * 4, 5)


def test_budget_prefix_costs_scale_with_the_prompts_rollout_cost():
    from trace_gym.budget import Budget

    b = Budget(8, 8, 0.5)
    assert b.prefix_cost(False) == 0.5 and b.prefix_cost(False, 3.0) == pytest.approx(1.5)
    assert b.prefix_cost(True, 2.0)(1, 4) == pytest.approx(2.0 * 0.75)
    assert b.prefix_budget(3, False, 2.0) == 3
    assert b.prefix_budget(3, True, 2.0) == pytest.approx(3.0)
    assert b.accounted(10.5, [0.25, 0.75]) == pytest.approx(11.5)


def test_rollout_costs_are_relative_and_validated():
    costs = RolloutCosts("turns", {"a": 3.0, "b": 1.0})
    assert costs.relative(["a", "b"]) == pytest.approx([1.5, 0.5])
    assert costs.relative(["a", "c"]) == pytest.approx([1.0, 1.0])  # unmeasured: the known mean
    with pytest.raises(ConfigError):
        RolloutCosts("seconds")
    with pytest.raises(ConfigError, match="rollout_cost"):
        RunnerConfig(root_budget=4, rollout_cost="seconds")
