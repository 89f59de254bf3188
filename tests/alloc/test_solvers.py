"""The exact solvers against exhaustive enumeration, against each other, and on bad input."""

from __future__ import annotations

import itertools
import warnings
from functools import cache

import numpy as np
import pytest

from trace_gym.alloc import (
    VALUE_EPS,
    root_value,
    solve_prefixes,
    solve_roots,
    solve_roots_reference,
    split_budget,
)
from trace_gym.alloc.solvers import clip_values
from trace_gym.errors import AllocationError

SOLVERS = [solve_roots, solve_roots_reference]


@cache
def _grid(p: int, m_max: int) -> np.ndarray:
    """Every allocation in {0, 2..m_max}^p, one per row."""
    options = [0, *range(2, m_max + 1)]
    return np.array(list(itertools.product(options, repeat=p)), dtype=np.int64)


def brute_force_roots(
    values: np.ndarray, budget: int, m_max: int, exact: bool = True
) -> float | None:
    """Best objective over every feasible allocation (None when there is none)."""
    grid = _grid(values.size, m_max)
    table = root_value(values[:, None], np.arange(m_max + 1)[None, :])
    objective = table[np.arange(values.size)[None, :], grid].sum(axis=1)
    total = grid.sum(axis=1)
    ok = total == budget if exact else total <= budget
    return float(objective[ok].max()) if ok.any() else None


def _random_values(rng: np.random.Generator, p: int) -> np.ndarray:
    kind = rng.integers(4)
    if kind == 0:
        return rng.random(p)
    if kind == 1:
        return rng.beta(0.3, 0.3, p)
    if kind == 2:  # many exact ties, including v and 1 - v
        return rng.choice([0.1, 0.3, 0.5, 0.7, 0.9], p)
    return rng.choice([0.0, 1.0, 0.5, 0.2], p)  # certain prompts


def _assert_valid(counts: np.ndarray, budget: int, m_max: int, exact: bool) -> None:
    assert counts.dtype == np.int64
    assert np.all((counts == 0) | ((counts >= 2) & (counts <= m_max))), counts
    assert counts.sum() == budget if exact else counts.sum() <= budget


@pytest.mark.parametrize("exact", [True, False])
def test_both_solvers_match_exhaustive_enumeration(exact):
    rng = np.random.default_rng(1234 + exact)
    checked = 0
    for _ in range(2000):
        p, m_max, budget = (
            int(rng.integers(1, 7)),
            int(rng.integers(2, 7)),
            int(rng.integers(0, 15)),
        )
        values = _random_values(rng, p)
        best = brute_force_roots(clip_values(values), budget, m_max, exact)
        for solver in SOLVERS:
            if best is None:
                with pytest.raises(AllocationError):
                    solver(values, budget, m_max, exact_budget=exact)
                continue
            sol = solver(values, budget, m_max, exact_budget=exact)
            _assert_valid(sol.counts, budget, m_max, exact)
            assert sol.objective == pytest.approx(best, abs=1e-12), (
                solver.__name__,
                values,
                budget,
                m_max,
            )
            assert sol.objective == pytest.approx(
                root_value(clip_values(values), sol.counts).sum(), abs=1e-12
            )
            checked += 1
    assert checked > 2500  # most instances are feasible


def test_fast_matches_reference_on_larger_instances():
    rng = np.random.default_rng(7)
    for _ in range(60):
        p = int(rng.integers(5, 120))
        m_max = int(rng.integers(2, 20))
        values = _random_values(rng, p)
        budget = int(rng.integers(2, p * m_max + 1))
        if m_max == 2:
            budget -= budget % 2
        fast = solve_roots(values, budget, m_max)
        ref = solve_roots_reference(values, budget, m_max)
        _assert_valid(fast.counts, budget, m_max, True)
        assert fast.objective == pytest.approx(ref.objective, abs=1e-9)


def test_greedy_on_pairs_is_not_enough():
    """The instance class the issue warns about: the relaxation leaves a prompt at m = 1."""
    values = np.array([0.5, 0.5, 0.5])
    sol = solve_roots(values, 5, 3)  # 3 + 2, not 2 + 2 + 1
    assert sorted(sol.counts.tolist()) == [0, 2, 3]
    # repair move 2: open the best unopened prompt at 2, take a unit back from one at >= 3
    values = np.array([0.5, 0.5, 0.3])
    sol = solve_roots(values, 7, 4)  # relaxation: 3 + 3 + 1 -> 3 + 2 + 2
    assert sol.counts[2] == 2 and sorted(sol.counts.tolist()) == [2, 2, 3]
    assert sol.objective == pytest.approx(brute_force_roots(values, 7, 4))


def test_skipping_is_scored_zero_not_minus_one():
    assert root_value(0.3, 0) == 0.0
    assert root_value(np.array([0.0, 1.0, 0.5]), np.array([0, 0, 0])).tolist() == [0.0, 0.0, 0.0]
    assert root_value(0.5, 2) == pytest.approx(0.5)
    for solver in SOLVERS:
        sol = solver([0.5, 0.01, 0.99, 0.4], 4, 4)
        assert sol.objective > 0
        assert sol.objective == pytest.approx(
            root_value(clip_values([0.5, 0.01, 0.99, 0.4]), sol.counts).sum()
        )
        assert solver([0.5, 0.5], 0, 4).objective == 0.0


def test_deterministic_and_ties_to_lower_index():
    values = np.full(6, 0.5)
    for solver in SOLVERS:
        a = solver(values, 6, 3).counts
        assert np.array_equal(a, solver(values, 6, 3).counts)
        assert (a > 0).sum() == 2
    assert solve_roots(values, 6, 3).counts.tolist() == [3, 3, 0, 0, 0, 0]


def test_certain_values_are_clipped_not_rejected():
    values = [0.0, 1.0, 0.5, 1.0, 0.0]
    for solver in SOLVERS:
        sol = solver(values, 4, 2)
        assert sol.counts[2] == 2  # the uncertain prompt always wins
        assert sol.counts.sum() == 4
    assert clip_values([0.0, 1.0]).tolist() == [VALUE_EPS, 1 - VALUE_EPS]
    assert solve_roots([1.0, 1.0], 4, 2).counts.tolist() == [2, 2]


@pytest.mark.parametrize(
    "values, budget, m_max, message",
    [
        ([0.5, float("nan")], 2, 4, "NaN"),
        ([0.5, 1.2], 2, 4, r"\[0, 1\]"),
        ([-0.1], 2, 4, r"\[0, 1\]"),
        ([], 2, 4, "empty"),
        ([0.5, 0.5], -2, 4, ">= 0"),
        ([0.5, 0.5], 1, 4, "budget of 1"),
        ([0.5, 0.5], 9, 4, "exceeds"),
        ([0.5, 0.5], 3, 2, "odd"),
        ([0.5, 0.5], 2, 1, "m_max"),
        ([0.5, 0.5], 2.5, 4, "whole number"),
        ([[0.5]], 2, 4, "flat"),
        (["a"], 2, 4, "numbers"),
    ],
)
def test_bad_root_input_raises_clear_errors(values, budget, m_max, message):
    for solver in SOLVERS:
        with pytest.raises(AllocationError, match=message):
            solver(values, budget, m_max)


def test_inexact_budget_accepts_what_exact_rejects():
    for solver in SOLVERS:
        assert solver([0.5, 0.5], 1, 4, exact_budget=False).counts.tolist() == [0, 0]
        assert solver([0.5, 0.5], 100, 4, exact_budget=False).counts.tolist() == [4, 4]
        assert solver([0.5, 0.5], 3, 2, exact_budget=False).counts.sum() == 2


# ------------------------------------------------------------------------ prefixes
def _compositions(total: int, parts: int):
    for cut in itertools.combinations(range(total + parts - 1), parts - 1):
        edges = (-1, *cut, total + parts - 1)
        yield [edges[i + 1] - edges[i] - 1 for i in range(parts)]


def test_prefix_split_matches_enumeration():
    rng = np.random.default_rng(3)
    for _ in range(400):
        n, budget = int(rng.integers(1, 5)), int(rng.integers(0, 9))
        values = rng.choice([rng.random(), 0.5, 0.9], n) if rng.random() < 0.3 else rng.random(n)
        rewards = rng.integers(0, 2, n).astype(float)
        sol = solve_prefixes(values, rewards, budget)
        assert sol.counts.sum() == budget
        v = clip_values(values)
        q = rewards * v + (1 - rewards) * (1 - v)
        best = max(float(np.sum(1 - q ** np.array(c))) for c in _compositions(budget, n))
        assert sol.objective == pytest.approx(best, abs=1e-12)


def test_prefix_knapsack_matches_enumeration():
    rng = np.random.default_rng(4)
    for _ in range(150):
        n = int(rng.integers(1, 4))
        costs = rng.choice([0.25, 0.5, 0.75, 1.0], n)
        budget = float(rng.choice([0.0, 0.5, 1.0, 1.5, 2.25, 3.0]))
        values, rewards = rng.random(n), rng.integers(0, 2, n).astype(float)
        sol = solve_prefixes(values, rewards, budget, costs)
        assert float(sol.counts @ costs) <= budget + 1e-9
        v = clip_values(values)
        q = rewards * v + (1 - rewards) * (1 - v)
        limits = [int(budget // c) for c in costs]
        best = max(
            float(np.sum(1 - q ** np.array(k)))
            for k in itertools.product(*(range(m + 1) for m in limits))
            if float(np.dot(k, costs)) <= budget + 1e-9
        )
        assert sol.objective == pytest.approx(best, abs=1e-12)


def test_prefix_split_prefers_uncertain_prefixes():
    # reward 1: a prefix predicted 0.2 (likely to flip) beats one predicted 0.95
    sol = solve_prefixes([0.95, 0.2], [1.0, 1.0], 3)
    assert sol.counts[1] > sol.counts[0]
    # equal costs: costs of 1 reproduce the count split
    assert (
        solve_prefixes([0.3, 0.6], [0, 1], 4, [1.0, 1.0]).counts.tolist()
        == solve_prefixes([0.3, 0.6], [0, 1], 4).counts.tolist()
    )


@pytest.mark.parametrize(
    "values, rewards, budget, costs, message",
    [
        ([], [], 2, None, "empty"),
        ([0.5], [1, 0], 2, None, "one reward"),
        ([0.5], [2.0], 2, None, r"\[0, 1\]"),
        ([float("nan")], [1.0], 2, None, "NaN"),
        ([0.5], [1.0], -1, None, ">= 0"),
        ([0.5], [1.0], 1, [0.0], "> 0"),
        ([0.5], [1.0], 1, [0.5, 0.5], "one cost"),
        ([0.5], [1.0], -1.0, [0.5], ">= 0"),
    ],
)
def test_bad_prefix_input_raises_clear_errors(values, rewards, budget, costs, message):
    with pytest.raises(AllocationError, match=message):
        solve_prefixes(values, rewards, budget, costs)


# ------------------------------------------------------------------------ split_budget
def test_split_budget_sums_exactly_and_is_proportional():
    rng = np.random.default_rng(5)
    for _ in range(300):
        n, total = int(rng.integers(1, 12)), int(rng.integers(0, 200))
        weights = rng.integers(0, 10, n) if rng.random() < 0.5 else rng.random(n)
        if np.sum(weights) == 0:
            weights[0] = 1
        out = split_budget(weights, total)
        assert out.sum() == total and out.dtype == np.int64
        quota = np.asarray(weights, float) * total / np.sum(weights)
        assert np.all(np.abs(out - quota) < 1)
        assert np.all(out[np.asarray(weights) == 0] == 0)


def test_split_budget_ties_go_to_lower_index():
    assert split_budget([1, 1, 1], 2).tolist() == [1, 1, 0]
    assert split_budget([2, 2], 3).tolist() == [2, 1]
    assert split_budget([8, 8, 8], 6).tolist() == [2, 2, 2]
    assert split_budget([], 0).tolist() == []


@pytest.mark.parametrize(
    "weights, total", [([0, 0], 3), ([], 1), ([1, -1], 2), ([1, float("nan")], 2), ([1], -1)]
)
def test_split_budget_bad_input(weights, total):
    with pytest.raises(AllocationError):
        split_budget(weights, total)


@pytest.mark.slow
def test_fast_matches_reference_at_benchmark_shape():
    rng = np.random.default_rng(11)
    for budget in (2, 4095, 8192, 20001):
        values = rng.beta(0.3, 0.3, 2048)
        fast = solve_roots(values, budget, 16)
        ref = solve_roots_reference(values, budget, 16)
        _assert_valid(fast.counts, budget, 16, True)
        assert fast.objective == pytest.approx(ref.objective, abs=1e-9)


def test_prefix_knapsack_huge_budget_falls_back_to_greedy_with_a_warning():
    # K = 1e6 at resolution 100 would build a 4 x 1e8 table (over 3 GB): never built
    values, rewards = [0.3, 0.6, 0.9, 0.5], [0.0, 1.0, 1.0, 0.0]
    with pytest.warns(RuntimeWarning, match="cost-aware greedy"):
        sol = solve_prefixes(values, rewards, 1e6, [1.0, 1.0, 1.0, 1.0])
    assert sol.counts.sum() == 1_000_000
    # equal costs: the greedy is the exact heap split
    assert sol.counts.tolist() == solve_prefixes(values, rewards, 1_000_000).counts.tolist()


def test_prefix_knapsack_fallback_never_overspends(monkeypatch):
    import trace_gym.alloc.solvers as solvers

    monkeypatch.setattr(solvers, "MAX_KNAPSACK_CELLS", 10)
    costs = np.array([0.25, 0.7, 1.5])
    with pytest.warns(RuntimeWarning, match="table cells"):
        sol = solve_prefixes([0.2, 0.5, 0.8], [1.0, 0.0, 1.0], 5.0, costs)
    assert float(sol.counts @ costs) <= 5.0 + 1e-9
    assert 5.0 - float(sol.counts @ costs) < costs.min()  # nothing that still fits is left unspent
    # under the limit the exact DP runs and warns nothing
    monkeypatch.setattr(solvers, "MAX_KNAPSACK_CELLS", 10_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        solve_prefixes([0.2, 0.5, 0.8], [1.0, 0.0, 1.0], 5.0, costs)
