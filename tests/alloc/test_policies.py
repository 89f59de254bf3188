"""Every allocation policy: protocol, budgets, and the rule its docstring cites."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest

from trace_gym.alloc import (
    ALLOCATORS,
    Allocator,
    Candidate,
    GRESOAllocator,
    KnapsackAllocator,
    PrefixCandidate,
    VisitHistory,
    make_allocator,
    root_value,
    solve_prefixes,
    solve_roots,
)
from trace_gym.errors import AllocationError, ConfigError, UnknownNameError

NAMES = [
    "trace",
    "grpo",
    "pcl",
    "treepo",
    "greso",
    "knapsack",
    "oracle",
    "trace_roots_random_prefixes",
    "uniform_roots_trace_prefixes",
]
BRANCHING = {
    "trace",
    "treepo",
    "oracle",
    "trace_roots_random_prefixes",
    "uniform_roots_trace_prefixes",
}
EXACT_ROOTS = {"trace", "oracle", "trace_roots_random_prefixes"}
FIXED_GROUPS = {"grpo", "pcl", "treepo", "greso", "uniform_roots_trace_prefixes"}


def candidates(n: int = 60, seed: int = 0) -> list[Candidate]:
    rng = np.random.default_rng(seed)
    out = []
    for i, (v, tv) in enumerate(zip(rng.beta(0.3, 0.3, n), rng.beta(0.3, 0.3, n), strict=True)):
        rewards = tuple(
            tuple(float(x) for x in rng.integers(0, 2, 4)) for _ in range(int(rng.integers(0, 3)))
        )
        out.append(
            Candidate(
                id=f"t{i}",
                value=float(v),
                true_value=float(tv),
                history=VisitHistory(rewards=rewards),
            )
        )
    return out


def prefixes(n: int = 7, seed: int = 0) -> list[PrefixCandidate]:
    rng = np.random.default_rng(seed)
    return [
        PrefixCandidate(
            rollout=i % 3,
            node=i + 1,
            depth=1 + i // 3,
            reward=float(i % 2),
            value=float(rng.random()),
            cost=float(rng.choice([0.25, 0.5, 0.75])),
            true_value=float(rng.random()),
            rollout_turns=4,
        )
        for i in range(n)
    ]


def test_registry_names_and_protocol():
    assert set(NAMES) <= set(ALLOCATORS)
    for name in NAMES:
        alloc = make_allocator(name, m_max=12, group_size=4)
        assert isinstance(alloc, Allocator)
        assert alloc.name == name
        assert alloc.branching == (name in BRANCHING)
        assert alloc.cost_aware is False  # declared by the protocol, off unless asked for
        assert type(alloc).__doc__ and len(type(alloc).__doc__.strip()) > 40  # cites its source
    with pytest.raises(UnknownNameError, match="trace"):
        make_allocator("tarce")
    with pytest.raises(ConfigError, match="not known to any policy"):
        make_allocator("trace", group_szie=4)
    assert make_allocator("trace", pool_factor=3).m_max == 16  # another policy's option: ignored
    with pytest.raises(ConfigError, match="group_size"):
        make_allocator("grpo", group_size=1)


@pytest.mark.parametrize("name", NAMES)
def test_root_counts_are_valid_and_budgets_add_up(name):
    alloc = make_allocator(name, m_max=12, group_size=4)
    pool = candidates()
    for budget in (0, 2, 17, 40, 96):
        counts = alloc.allocate_roots(pool, budget, np.random.default_rng(budget))
        assert counts.shape == (len(pool),) and counts.dtype == np.int64
        assert np.all((counts == 0) | ((counts >= 2) & (counts <= 12)))
        if name in EXACT_ROOTS:
            assert counts.sum() == budget
        elif name in FIXED_GROUPS:
            assert set(counts.tolist()) <= {0, 4}
            if name != "greso":  # greso's filter may drop prompts
                assert counts.sum() == 4 * (budget // 4)
        else:
            assert counts.sum() <= budget


@pytest.mark.parametrize("name", NAMES)
def test_prefix_counts(name):
    alloc = make_allocator(name)
    pref = prefixes()
    counts = alloc.allocate_prefixes(pref, 9, np.random.default_rng(0))
    assert counts.shape == (len(pref),) and counts.dtype == np.int64
    assert counts.sum() == (9 if name in BRANCHING else 0)
    assert alloc.allocate_prefixes([], 5, np.random.default_rng(0)).shape == (0,)


@pytest.mark.parametrize("name", NAMES)
def test_seeded_and_reproducible(name):
    pool, pref = candidates(), prefixes()
    a, b = make_allocator(name), make_allocator(name)
    for alloc_a, alloc_b in ((a, b),):
        ra = alloc_a.allocate_roots(pool, 48, np.random.default_rng(5))
        rb = alloc_b.allocate_roots(pool, 48, np.random.default_rng(5))
        assert np.array_equal(ra, rb)
        pa = alloc_a.allocate_prefixes(pref, 6, np.random.default_rng(5))
        pb = alloc_b.allocate_prefixes(pref, 6, np.random.default_rng(5))
        assert np.array_equal(pa, pb)


def test_empty_pool_and_bad_budget():
    for name in NAMES:
        alloc = make_allocator(name)
        with pytest.raises(AllocationError, match="empty"):
            alloc.allocate_roots([], 8, np.random.default_rng(0))
        with pytest.raises(AllocationError, match=">= 0"):
            alloc.allocate_roots(candidates(), -1, np.random.default_rng(0))
        assert alloc.allocate_roots([], 0, np.random.default_rng(0)).shape == (0,)


def test_trace_uses_both_exact_solvers():
    pool, pref = candidates(), prefixes()
    alloc = make_allocator("trace", m_max=10)
    expected = solve_roots([c.value for c in pool], 50, 10).counts
    assert np.array_equal(alloc.allocate_roots(pool, 50, np.random.default_rng(0)), expected)
    expected = solve_prefixes([p.value for p in pref], [p.reward for p in pref], 8).counts
    assert np.array_equal(alloc.allocate_prefixes(pref, 8, np.random.default_rng(0)), expected)
    with pytest.raises(AllocationError, match="exceeds"):
        alloc.allocate_roots(pool[:2], 50, np.random.default_rng(0))
    loose = make_allocator("trace", m_max=10, exact_budget=False)
    assert loose.allocate_roots(pool[:2], 50, np.random.default_rng(0)).tolist() == [10, 10]


def test_trace_cost_aware_prefixes_respect_cost():
    pref = prefixes()
    alloc = make_allocator("trace", cost_aware=True)
    counts = alloc.allocate_prefixes(
        pref, 6 * 0.5, np.random.default_rng(0)
    )  # the runner's cost budget
    assert float(counts @ np.array([p.cost for p in pref])) <= 6 * 0.5 + 1e-9
    assert counts.sum() >= 4  # cheap prefixes: at least as many replays as 3 / 0.75


def test_oracle_uses_true_values():
    pool, pref = candidates(), prefixes()
    oracle = make_allocator("oracle", m_max=8)
    expected = solve_roots([c.true_value for c in pool], 40, 8).counts
    assert np.array_equal(oracle.allocate_roots(pool, 40, np.random.default_rng(0)), expected)
    assert not np.array_equal(expected, solve_roots([c.value for c in pool], 40, 8).counts)
    expected = solve_prefixes([p.true_value for p in pref], [p.reward for p in pref], 5).counts
    assert np.array_equal(oracle.allocate_prefixes(pref, 5, np.random.default_rng(0)), expected)
    with pytest.raises(AllocationError, match="simulator"):
        oracle.allocate_roots([Candidate(id="x", value=0.5)], 2, np.random.default_rng(0))


def test_grpo_fixed_groups_drawn_at_random():
    pool = candidates(100)
    grpo = make_allocator("grpo", group_size=8)
    a = grpo.allocate_roots(pool, 64, np.random.default_rng(1))
    b = grpo.allocate_roots(pool, 64, np.random.default_rng(2))
    assert (a == 8).sum() == 8 and (a > 0).sum() == 8
    assert not np.array_equal(a, b)  # the pool order does not decide the batch
    assert grpo.allocate_roots(pool[:3], 64, np.random.default_rng(1)).tolist() == [8, 8, 8]


def test_pcl_keeps_the_candidates_closest_to_half():
    pool = candidates(40)
    pcl = make_allocator("pcl", group_size=5, pool_factor=100)  # pool covers everything
    counts = pcl.allocate_roots(pool, 30, np.random.default_rng(0))
    distance = np.abs(np.array([c.value for c in pool]) - 0.5)
    assert set(np.flatnonzero(counts)) == set(np.argsort(distance, kind="stable")[:6])
    assert set(counts.tolist()) == {0, 5}
    # with k = 1 the pool is a random draw of exactly m: no selection at all
    small = make_allocator("pcl", group_size=5, pool_factor=1).allocate_roots(
        pool, 30, np.random.default_rng(0)
    )
    assert (small > 0).sum() == 6


def test_treepo_uniform_roots_random_but_seeded_prefixes():
    treepo = make_allocator("treepo", group_size=4)
    pool, pref = candidates(), prefixes(5)
    assert set(treepo.allocate_roots(pool, 40, np.random.default_rng(0)).tolist()) == {0, 4}
    spread = treepo.allocate_prefixes(pref, 500, np.random.default_rng(0))
    assert spread.sum() == 500 and spread.min() > 60  # uniform over the 5 prefixes
    a = treepo.allocate_prefixes(pref, 10, np.random.default_rng(3))
    b = treepo.allocate_prefixes(pref, 10, np.random.default_rng(4))
    assert not np.array_equal(a, b)


def test_ablation_mixes_combine_the_right_halves():
    pool, pref = candidates(), prefixes()
    mix_a = make_allocator("trace_roots_random_prefixes", group_size=4)
    mix_b = make_allocator("uniform_roots_trace_prefixes", group_size=4)
    trace, treepo = make_allocator("trace", group_size=4), make_allocator("treepo", group_size=4)
    r = np.random.default_rng
    assert np.array_equal(
        mix_a.allocate_roots(pool, 40, r(0)), trace.allocate_roots(pool, 40, r(0))
    )
    assert np.array_equal(
        mix_a.allocate_prefixes(pref, 9, r(1)), treepo.allocate_prefixes(pref, 9, r(1))
    )
    assert np.array_equal(
        mix_b.allocate_roots(pool, 40, r(0)), treepo.allocate_roots(pool, 40, r(0))
    )
    assert np.array_equal(
        mix_b.allocate_prefixes(pref, 9, r(1)), trace.allocate_prefixes(pref, 9, r(1))
    )


def _streaked(i: int, success: int, failure: int) -> Candidate:
    return Candidate(
        id=f"g{i}",
        value=0.5,
        history=VisitHistory(
            rewards=((1.0, 0.0),), all_success_streak=success, all_failure_streak=failure
        ),
    )


def test_greso_skips_zero_variance_prompts_by_streak():
    greso = GRESOAllocator(group_size=2, p_easy=0.5, p_hard=0.25, p_min=0.01, step=0.0)
    assert greso.keep_probability(_streaked(0, 0, 0)) == 1.0
    assert greso.keep_probability(_streaked(0, 3, 0)) == pytest.approx(0.125)
    assert greso.keep_probability(_streaked(0, 0, 2)) == pytest.approx(0.0625)
    assert greso.keep_probability(_streaked(0, 20, 0)) == 0.01  # floor p_min
    pool = [_streaked(i, 0, 0) for i in range(50)] + [_streaked(50 + i, 6, 0) for i in range(50)]
    kept_fresh = kept_stale = 0
    for seed in range(20):
        counts = greso.allocate_roots(pool, 200, np.random.default_rng(seed))
        kept_fresh += (counts[:50] > 0).sum()
        kept_stale += (counts[50:] > 0).sum()
    assert kept_fresh == 20 * 50  # never-zero-variance prompts always pass
    assert kept_stale < 0.1 * 20 * 50  # 0.5^6 keep rate


def test_greso_adapts_toward_target():
    greso = GRESOAllocator(p_easy=0.5, p_hard=0.5, target_easy=0.1, target_hard=0.1, step=0.05)
    easy_pool = [_streaked(i, 1, 0) for i in range(10)]  # all easy: too many zero-variance
    greso.allocate_roots(easy_pool, 16, np.random.default_rng(0))
    assert greso.p_easy == pytest.approx(0.45) and greso.p_hard == pytest.approx(0.55)


def test_knapsack_value_and_minimum_two():
    hist = lambda rs: VisitHistory(rewards=(tuple(rs),))  # noqa: E731
    pool = [
        Candidate(id="a", value=0.9, history=hist([1, 1, 1, 1])),  # p = 1: nothing
        Candidate(id="b", value=0.9, history=hist([1, 0, 0, 0])),  # p = 0.25
        Candidate(id="c", value=0.1, history=hist([0, 0, 0, 0])),  # p = 0: nothing
        Candidate(id="d", value=0.5),  # never visited: predicted 0.5
        Candidate(id="e", value=0.9, history=hist([1, 1, 1, 0])),  # p = 0.75
    ]
    ks = KnapsackAllocator(m_max=8)
    assert [ks.success_rate(c) for c in pool] == [1.0, 0.25, 0.0, 0.5, 0.75]
    counts = ks.allocate_roots(pool, 14, np.random.default_rng(0))
    assert counts[0] == counts[2] == 0 and counts.sum() == 14 and counts[[1, 3, 4]].min() >= 2
    # the DP optimum of sum value(N_i, p_i) with 2 <= N_i <= 8, found by enumeration
    p = np.array([0.25, 0.5, 0.75])
    w = p * (1 - p) ** 2
    best = max(
        (float(np.sum(w * root_value(p, np.array(n)))), n)
        for n in itertools.product(range(2, 9), repeat=3)
        if sum(n) == 14
    )
    assert float(np.sum(w * root_value(p, counts[[1, 3, 4]]))) == pytest.approx(best[0])
    # too small a budget for everyone: the best value at N = 2 get their 2
    small = ks.allocate_roots(pool, 4, np.random.default_rng(0))
    assert small.tolist() == [0, 2, 0, 2, 0]


def test_make_allocator_warns_on_the_options_its_policy_ignores(caplog):
    with caplog.at_level(logging.WARNING, logger="trace_gym.alloc"):
        assert make_allocator("trace", pool_factor=3, cost_aware=True).cost_aware is True
    assert [r.getMessage() for r in caplog.records] == [
        "allocator 'trace' ignores option(s) ['pool_factor'] (other policies take them)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trace_gym.alloc"):
        make_allocator("pcl", pool_factor=3, m_max=8)
    assert not caplog.records


def test_the_base_allocator_keeps_its_old_name():
    from trace_gym.alloc import BaseAllocator, FlatAllocator

    assert FlatAllocator is BaseAllocator
    assert BaseAllocator.cost_aware is False and BaseAllocator.branching is False
