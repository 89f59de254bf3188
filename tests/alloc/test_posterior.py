"""The posterior objective and the max_prompts cap: closed forms vs Monte Carlo, solvers vs brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from trace_gym.alloc import Candidate, PrefixCandidate, make_allocator, solve_prefixes, solve_roots
from trace_gym.alloc.solvers import (
    _posterior_increments,
    beta_moments,
    clip_values,
    posterior_prefix_value,
    posterior_root_value,
    root_value,
    solve_roots_reference,
)
from trace_gym.errors import AllocationError, ConfigError


def _grid(p: int, m_max: int) -> np.ndarray:
    options = [0, *range(2, m_max + 1)]
    return np.array(list(itertools.product(options, repeat=p)), dtype=np.int64)


def brute_force(values, conc, budget, m_max, exact=True, max_prompts=None):
    """Best objective over {0, 2..m_max}^P (None when infeasible)."""
    v = clip_values(values)
    grid = _grid(v.size, m_max)
    c = np.array([math.inf if x is None else x for x in conc]) if conc is not None else None
    ms = np.arange(m_max + 1)[None, :]
    if c is None:
        table = root_value(v[:, None], ms)
    else:
        table = posterior_root_value(v[:, None], c[:, None], ms)
    objective = table[np.arange(v.size)[None, :], grid].sum(axis=1)
    total = grid.sum(axis=1)
    ok = total == budget if exact else total <= budget
    if max_prompts is not None:
        ok &= (grid > 0).sum(axis=1) <= max_prompts
    return float(objective[ok].max()) if ok.any() else None


def _random_conc(rng, p):
    return [
        None
        if u < 0.2
        else (math.inf if u < 0.3 else float(rng.choice([0.5, 1.0, 2.0, 5.0, 40.0])))
        for u in rng.random(p)
    ]


def test_beta_moments_match_monte_carlo():
    rng = np.random.default_rng(0)
    n = 200_000
    for mean, c in [(0.3, 2.0), (0.5, 0.7), (0.9, 10.0)]:
        v = rng.beta(mean * c, (1 - mean) * c, n)
        exact = beta_moments(np.array([mean]), np.array([c]), 6)[0]
        for k in range(7):
            x = v**k
            assert abs(x.mean() - exact[k]) < 5 * x.std() / math.sqrt(n) + 1e-12


def test_posterior_root_gain_matches_monte_carlo():
    """1 - E[v^m] - E[(1-v)^m] = the chance that m rollouts of a Beta-distributed prompt mix."""
    rng = np.random.default_rng(1)
    n = 200_000
    for mean, c, m in [(0.2, 1.5, 2), (0.5, 0.8, 4), (0.85, 6.0, 8), (0.1, 30.0, 16)]:
        v = rng.beta(mean * c, (1 - mean) * c, n)
        successes = rng.binomial(m, v)
        mixed = ((successes > 0) & (successes < m)).astype(float)
        exact = float(posterior_root_value(mean, c, m))
        se = mixed.std() / math.sqrt(n)
        assert abs(mixed.mean() - exact) < 5 * se, (mean, c, m)
        # a flat belief mixes less often than the plug-in value says (Jensen)
        assert exact < float(root_value(mean, m))


def test_posterior_prefix_gain_matches_monte_carlo():
    rng = np.random.default_rng(2)
    n = 200_000
    for value, reward, c, k in [(0.7, 1.0, 2.0, 1), (0.7, 0.0, 2.0, 3), (0.4, 1.0, 0.6, 5)]:
        v = rng.beta(value * c, (1 - value) * c, n)
        repeat = v if reward == 1.0 else 1 - v  # chance one replay repeats the outcome
        flips = (rng.binomial(k, 1 - repeat) > 0).astype(float)
        q = value if reward == 1.0 else 1 - value
        exact = float(posterior_prefix_value(q, c, k))
        assert abs(flips.mean() - exact) < 5 * flips.std() / math.sqrt(n)


def test_posterior_increments_keep_the_exactness_shape():
    """d_1 = d_2 = d_3 exactly, then non-increasing: what the fast solver's proof needs."""
    rng = np.random.default_rng(3)
    v = rng.random(500)
    c = rng.choice([0.3, 1.0, 4.0, 100.0], 500)
    inc = _posterior_increments(v, c, 16)
    assert np.all(inc[:, 0] == inc[:, 1]) and np.all(inc[:, 1] == inc[:, 2])
    assert np.all(np.diff(inc, axis=1) <= 0)
    # the increments sum to the posterior objective
    f = posterior_root_value(v[:, None], c[:, None], np.arange(2, 17)[None, :])
    np.testing.assert_allclose(np.cumsum(inc, axis=1)[:, 1:], f, atol=1e-12)


@pytest.mark.parametrize("exact", [True, False])
def test_posterior_solvers_match_brute_force(exact):
    rng = np.random.default_rng(10 + exact)
    checked = 0
    for _ in range(800):
        p, m_max, budget = (
            int(rng.integers(1, 6)),
            int(rng.integers(2, 7)),
            int(rng.integers(0, 13)),
        )
        values = (
            rng.choice([0.1, 0.5, 0.8, rng.random()], p) if rng.random() < 0.4 else rng.random(p)
        )
        conc = _random_conc(rng, p)
        best = brute_force(values, conc, budget, m_max, exact)
        for solver in (solve_roots, solve_roots_reference):
            if best is None:
                with pytest.raises(AllocationError):
                    solver(values, budget, m_max, exact, concentrations=conc)
                continue
            sol = solver(values, budget, m_max, exact, concentrations=conc)
            c = sol.counts
            assert np.all((c == 0) | ((c >= 2) & (c <= m_max)))
            assert c.sum() == budget if exact else c.sum() <= budget
            assert sol.objective == pytest.approx(best, abs=1e-9)
            checked += 1
    assert checked > 800


def test_plugin_equals_posterior_at_infinite_concentration():
    rng = np.random.default_rng(4)
    for _ in range(50):
        v = rng.beta(0.3, 0.3, 64)
        plug = solve_roots(v, 100, 16)
        for conc in ([math.inf] * 64, [None] * 64):
            post = solve_roots(v, 100, 16, concentrations=conc)
            assert post.counts.tolist() == plug.counts.tolist()
            assert post.objective == plug.objective
        # one prompt with a finite concentration: the others' gains are the plug-in ones bit for bit
        conc = [math.inf] * 64
        conc[0] = 3.0
        inc = _posterior_increments(clip_values(v), np.array(conc), 16)
        from trace_gym.alloc.solvers import root_increments

        assert np.array_equal(inc[1:], root_increments(clip_values(v), 16)[1:])
        # and a huge finite concentration is the plug-in value up to rounding
        near = solve_roots(v, 100, 16, concentrations=[1e12] * 64)
        assert near.objective == pytest.approx(plug.objective, rel=1e-9)
    q, r = rng.random(20), rng.integers(0, 2, 20).astype(float)
    for conc in ([math.inf] * 20, [None] * 20):
        assert (
            solve_prefixes(q, r, 30, concentrations=conc).counts.tolist()
            == solve_prefixes(q, r, 30).counts.tolist()
        )
        a = solve_prefixes(q, r, 3.0, [0.25] * 20, concentrations=conc)
        b = solve_prefixes(q, r, 3.0, [0.25] * 20)
        assert a.counts.tolist() == b.counts.tolist() and a.objective == b.objective


def _compositions(total: int, parts: int):
    """Every way to give `total` replays to `parts` prefixes."""
    return (k for k in itertools.product(range(total + 1), repeat=parts) if sum(k) == total)


def test_posterior_prefix_split_matches_enumeration():
    rng = np.random.default_rng(5)
    for _ in range(300):
        n, budget = int(rng.integers(1, 5)), int(rng.integers(0, 8))
        values, rewards = rng.random(n), rng.integers(0, 2, n).astype(float)
        conc = _random_conc(rng, n)
        c = np.array([math.inf if x is None else x for x in conc])
        v = clip_values(values)
        q = rewards * v + (1 - rewards) * (1 - v)
        sol = solve_prefixes(values, rewards, budget, concentrations=conc)
        assert sol.counts.sum() == budget
        best = max(
            float(posterior_prefix_value(q, c, np.array(k)).sum()) for k in _compositions(budget, n)
        )
        assert sol.objective == pytest.approx(best, abs=1e-12)
        costs = rng.choice([0.25, 0.5, 1.0], n)
        tb = float(rng.choice([0.5, 1.0, 1.75]))
        sol = solve_prefixes(values, rewards, tb, costs, concentrations=conc)
        limits = [int(tb // x) for x in costs]
        best = max(
            float(posterior_prefix_value(q, c, np.array(k)).sum())
            for k in itertools.product(*(range(m + 1) for m in limits))
            if float(np.dot(k, costs)) <= tb + 1e-9
        )
        assert sol.objective == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("posterior", [False, True])
@pytest.mark.parametrize("exact", [True, False])
def test_max_prompts_matches_brute_force(posterior, exact):
    rng = np.random.default_rng(20 + 2 * posterior + exact)
    checked = binding = 0
    for _ in range(500):
        p, m_max = int(rng.integers(1, 6)), int(rng.integers(2, 6))
        k = int(rng.integers(1, p + 1))
        budget = int(rng.integers(0, k * m_max + 2))
        values = rng.choice([0.1, 0.5, 0.8], p) if rng.random() < 0.3 else rng.random(p)
        conc = _random_conc(rng, p) if posterior else None
        best = brute_force(values, conc, budget, m_max, exact, max_prompts=k)
        if best is None:
            with pytest.raises(AllocationError):
                solve_roots(values, budget, m_max, exact, concentrations=conc, max_prompts=k)
            continue
        sol = solve_roots(values, budget, m_max, exact, concentrations=conc, max_prompts=k)
        c = sol.counts
        assert np.count_nonzero(c) <= k
        assert np.all((c == 0) | ((c >= 2) & (c <= m_max)))
        assert c.sum() == budget if exact else c.sum() <= budget
        assert sol.objective == pytest.approx(best, abs=1e-9)
        checked += 1
        free = brute_force(values, conc, budget, m_max, exact)
        binding += free is None or free > best + 1e-9
    assert checked > 200 and binding > 10  # the cap really bound on some instances


def test_allocator_options():
    cands = [
        Candidate(str(i), v, concentration=c)
        for i, (v, c) in enumerate(
            [(0.5, 0.5), (0.5, None), (0.3, 50.0), (0.9, 2.0), (0.6, None), (0.45, 1.0)]
        )
    ]
    plug = make_allocator("trace", m_max=8)
    post = make_allocator("trace", m_max=8, objective="posterior")
    rng = np.random.default_rng(0)
    a = post.allocate_roots(cands, 16, rng)
    v = [c.value for c in cands]
    conc = [c.concentration for c in cands]
    assert a.tolist() == solve_roots(v, 16, 8, concentrations=conc).counts.tolist()
    # a flat belief (c = 0.5) at v = 0.5 is worth less than a point value at 0.5
    assert a[0] < a[1]
    assert plug.allocate_roots(cands, 16, rng).tolist() == solve_roots(v, 16, 8).counts.tolist()
    capped = make_allocator("trace", m_max=8, max_prompts=2)
    counts = capped.allocate_roots(cands, 16, rng)
    assert np.count_nonzero(counts) == 2 and counts.sum() == 16
    pre = [
        PrefixCandidate(0, i + 1, 1, 1.0, 0.6, concentration=c) for i, c in enumerate([0.5, None])
    ]
    assert (
        post.allocate_prefixes(pre, 5, rng).tolist()
        == solve_prefixes([0.6, 0.6], [1.0, 1.0], 5, concentrations=[0.5, None]).counts.tolist()
    )
    # the oracle ignores concentrations (it allocates on exact values)
    o = make_allocator("oracle", m_max=8, objective="posterior")
    exact = [Candidate(c.id, c.value, true_value=c.value, concentration=0.5) for c in cands]
    assert o.allocate_roots(exact, 16, rng).tolist() == solve_roots(v, 16, 8).counts.tolist()
    with pytest.raises(ConfigError, match="objective"):
        make_allocator("trace", objective="bayes")
    with pytest.raises(ConfigError, match="max_prompts"):
        make_allocator("trace", max_prompts=0)
    with pytest.raises(AllocationError, match="max_prompts"):
        solve_roots([0.5] * 4, 40, 16, max_prompts=2)
    with pytest.raises(AllocationError, match="concentrations"):
        solve_roots([0.5] * 2, 4, 16, concentrations=[0.0, None])
    with pytest.raises(AllocationError, match="one concentration per record"):
        solve_roots([0.5] * 2, 4, 16, concentrations=[1.0])
