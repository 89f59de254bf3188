"""The cost-class root solver (`solve_roots_costed`) against brute force and the reference DP."""

import itertools

import numpy as np
import pytest

from trace_gym.alloc import solvers
from trace_gym.alloc.solvers import (
    root_value,
    solve_roots,
    solve_roots_costed,
    solve_roots_costed_reference,
)
from trace_gym.errors import AllocationError

COST_SETS = [
    [0.5, 1.5],
    [0.3, 1.0, 3.0],
    [0.25, 0.5, 0.75, 2.0],
    [0.1, 4.0],
    [1.0, 1.125],  # near-equal costs: 8 and 9 units, no common divisor
]


def _values(rng, p, kind):
    """Distinct values, one shared value (a fresh predictor), a few levels, or sure ones."""
    if kind == 0:
        return rng.uniform(0.02, 0.98, p)
    if kind == 1:
        return np.full(p, rng.choice([0.5, 0.3, 0.9]))
    if kind == 2:
        return rng.choice([0.2, 0.5, 0.8], p)
    return rng.choice([0.0, 1.0, 0.5, 0.1], p)


def _units(costs, budget, resolution=8):
    return np.ceil(np.asarray(costs) * resolution - 1e-9).astype(int), int(
        np.floor(budget * resolution + 1e-9)
    )


def _check(sol, costs, budget, m_max):
    w, units = _units(costs, budget)
    assert int(w @ sol.counts) <= units  # never overspends
    assert not np.any(sol.counts == 1) and sol.counts.max(initial=0) <= m_max


def test_matches_brute_force_on_tiny_instances():
    rng = np.random.default_rng(0)
    for it in range(400):
        p, m_max = int(rng.integers(1, 5)), int(rng.integers(2, 6))
        v = _values(rng, p, it % 4)
        c = rng.choice([0.25, 0.5, 1.0, 1.5, 2.5, 3.0], p)
        budget = float(rng.uniform(0, p * m_max * 1.5))
        sol = solve_roots_costed(v, c, budget, m_max)
        _check(sol, c, budget, m_max)
        w, units = _units(c, budget)
        best = max(
            float(root_value(solvers.clip_values(v), np.array(ms)).sum())
            for ms in itertools.product([0, *range(2, m_max + 1)], repeat=p)
            if int(w @ np.array(ms)) <= units
        )
        assert sol.objective == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("costs", COST_SETS)
def test_matches_the_reference_dp_where_the_box_is_a_small_part(costs):
    """P large enough that the LP band and the box cover a small part of every class."""
    rng = np.random.default_rng(len(costs) * 7 + int(costs[-1] * 8))
    for it in range(12):
        p, m_max = int(rng.integers(40, 400)), int(rng.choice([4, 8, 16]))
        v = _values(rng, p, it % 4)
        c = rng.choice(costs, p)
        budget = float(rng.uniform(0.5, 6) * p * np.mean(c))
        conc = None if it % 3 else list(rng.choice([None, 2.0, 10.0], p))
        sol = solve_roots_costed(v, c, budget, m_max, concentrations=conc)
        ref = solve_roots_costed_reference(v, c, budget, m_max, concentrations=conc)
        _check(sol, c, budget, m_max)
        assert sol.objective == pytest.approx(ref.objective, abs=1e-9)


def test_a_sampled_band_at_thousands_of_prompts_is_still_exact(monkeypatch):
    """Above SMALL_ITEMS the LP threshold is bracketed on a sample: the result must not move."""
    monkeypatch.setattr(solvers._CostClasses, "SMALL_ITEMS", 1_000)  # sample at 900 x 16 items
    rng = np.random.default_rng(5)
    for costs in ([0.3, 1.0, 3.0], [1.0, 1.125]):
        p = 900
        v, c = rng.uniform(0.02, 0.98, p), rng.choice(costs, p)
        budget = 4.0 * float(c.sum())  # four rollouts per prompt on average
        sol = solve_roots_costed(v, c, budget, 16)
        ref = solve_roots_costed_reference(v, c, budget, 16)
        assert sol.objective == pytest.approx(ref.objective, abs=1e-9)


def test_a_box_below_the_proximity_radius_is_not_enough(monkeypatch):
    """The box radius is load-bearing: with radius 1 the re-centred box DP misses optima."""
    rng = np.random.default_rng(2)
    init = solvers._CostClasses.__init__

    def small_box(self, *args):
        init(self, *args)
        self.radius = 1

    monkeypatch.setattr(solvers._CostClasses, "__init__", small_box)
    misses = 0
    for it in range(30):
        p = int(rng.integers(60, 250))
        v, c = _values(rng, p, it % 4), rng.choice(COST_SETS[it % 5], p)
        budget = float(rng.uniform(0.5, 6) * p * np.mean(c))
        got = solve_roots_costed(v, c, budget, 8).objective
        misses += got < solve_roots_costed_reference(v, c, budget, 8).objective - 1e-9
    assert misses > 0


def test_unit_costs_are_the_flat_problem_and_one_cost_class_scales_the_budget():
    rng = np.random.default_rng(1)
    v = rng.uniform(0.05, 0.95, 50)
    flat = solve_roots(v, 130, 8, exact_budget=False).objective
    assert solve_roots_costed(v, np.ones(50), 130, 8).objective == pytest.approx(flat)
    # every rollout costs 2.5: the flat problem with floor(200 / 2.5) = 80 rollouts
    half = solve_roots(v, 80, 8, exact_budget=False).objective
    assert solve_roots_costed(v, np.full(50, 2.5), 200, 8).objective == pytest.approx(half)


def test_edge_budgets_and_bad_input():
    v = np.array([0.5, 0.4, 0.7])
    c = np.array([1.0, 2.0, 2.0])
    assert not solve_roots_costed(v, c, 1.5, 4).counts.any()  # less than one pair of rollouts
    assert not solve_roots_costed(v, c, 0.0, 4).counts.any()
    everything = solve_roots_costed(v, c, 1e6, 4).counts
    assert everything.tolist() == [4, 4, 4]
    for bad in (
        dict(costs=np.zeros(3)),
        dict(costs=[1.0, 2.0]),
        dict(costs=[1.0, np.nan, 1.0]),
        dict(budget=-1.0),
        dict(budget=np.inf),
        dict(resolution=0),
    ):
        kw = dict(values=v, costs=c, budget=10.0, m_max=4) | bad
        with pytest.raises(AllocationError):
            solve_roots_costed(**kw)
