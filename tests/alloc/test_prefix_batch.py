"""The batched prefix split (one call for every prompt of a step) equals the per-prompt one."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.alloc import make_allocator, solve_prefixes, solve_prefixes_batch
from trace_gym.alloc.base import BatchPrefixAllocator, PrefixCandidate
from trace_gym.alloc.policies import TraceAllocator
from trace_gym.errors import AllocationError


def _random_batch(rng, prompts, with_costs=False, posterior=False):
    sizes = rng.integers(0, 9, size=prompts)
    n = int(sizes.sum())
    # few distinct values, so ties between prefixes (and between prompts) are common
    values = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0, *rng.random(3)], size=n)
    rewards = rng.integers(0, 2, size=n).astype(float)
    budgets = np.where(sizes > 0, rng.integers(0, 40, size=prompts), 0).astype(float)
    costs = rng.choice([0.25, 0.5, 0.75, 1.0], size=n) if with_costs else None
    if with_costs:
        budgets = np.round(rng.random(prompts) * 6, 2) * (sizes > 0)
    conc = None
    if posterior:
        conc = [
            None if rng.random() < 0.3 else float(rng.choice([0.5, 2, 10, np.inf]))
            for _ in range(n)
        ]
    return values, rewards, sizes, budgets, costs, conc


@pytest.mark.parametrize("posterior", [False, True])
@pytest.mark.parametrize("with_costs", [False, True])
def test_batched_prefix_split_equals_the_per_prompt_split(with_costs, posterior):
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(30 if with_costs else 120):
        v, r, sizes, b, c, conc = _random_batch(
            rng, int(rng.integers(1, 16)), with_costs, posterior
        )
        if not sizes.sum():
            continue
        got = solve_prefixes_batch(v, r, sizes, b, c, concentrations=conc).split()
        assert len(got) == sizes.size
        lo = 0
        for g, size in enumerate(sizes):
            hi = lo + int(size)
            if size:
                ref = solve_prefixes(
                    v[lo:hi],
                    r[lo:hi],
                    b[g] if with_costs else int(b[g]),
                    None if c is None else c[lo:hi],
                    concentrations=None if conc is None else conc[lo:hi],
                )
                np.testing.assert_array_equal(got[g].counts, ref.counts)
                assert got[g].objective == pytest.approx(ref.objective, abs=1e-9)
                checked += 1
            else:
                assert got[g].counts.size == 0 and got[g].objective == 0.0
            lo = hi
    assert checked > 100 if not with_costs else checked > 20


def test_batched_prefix_split_refuses_what_the_per_prompt_split_refuses():
    with pytest.raises(AllocationError, match="sizes summing"):
        solve_prefixes_batch([0.5, 0.5], [1, 0], [3], [2])
    with pytest.raises(AllocationError, match="whole numbers"):
        solve_prefixes_batch([0.5, 0.5], [1, 0], [2], [1.5])
    with pytest.raises(AllocationError, match=r"in \[0, 1\]"):
        solve_prefixes_batch([0.5, 0.5], [1, 2], [2], [1])
    empty = solve_prefixes_batch([], [], [0, 0], [0, 0])
    assert [s.counts.size for s in empty.split()] == [0, 0]


def _prompts(rng, n_prompts):
    out = []
    for _ in range(n_prompts):
        k = int(rng.integers(0, 7))
        out.append(
            [
                PrefixCandidate(
                    rollout=j % 2,
                    node=j + 1,
                    depth=1 + j % 3,
                    value=float(rng.choice([0.2, 0.5, 0.8, rng.random()])),
                    reward=float(rng.integers(0, 2)),
                    cost=float(rng.choice([0.25, 0.5, 0.75])),
                    true_value=float(rng.random()),
                    concentration=float(rng.choice([1.0, 4.0, 20.0])),
                )
                for j in range(k)
            ]
        )
    return out


@pytest.mark.parametrize(
    "name,kw",
    [
        ("trace", {}),
        ("oracle", {}),
        ("trace", {"objective": "posterior"}),
        ("trace", {"cost_aware": True}),
        ("trace_roots_random_prefixes", {}),
        ("treepo", {}),
    ],
)
def test_every_allocator_batches_as_it_splits_one_prompt(name, kw):
    alloc = make_allocator(name, **kw)
    assert isinstance(alloc, BatchPrefixAllocator)
    rng = np.random.default_rng(5)
    prompts = _prompts(rng, 12)
    budgets = [
        round(float(rng.random() * 3), 2) if alloc.cost_aware else int(rng.integers(0, 9))
        for _ in prompts
    ]

    def rngs():
        return [np.random.default_rng(100 + g) for g in range(len(prompts))]

    got = alloc.allocate_prefixes_batch(prompts, budgets, rngs())
    ref = [
        alloc.allocate_prefixes(p, b, r) for p, b, r in zip(prompts, budgets, rngs(), strict=True)
    ]
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_trace_subclass_with_its_own_prefix_rule_is_batched_by_that_rule():
    class Half(TraceAllocator):
        name = "half_prefixes"

        def allocate_prefixes(self, prefixes, budget, rng):
            out = np.zeros(len(prefixes), dtype=np.int64)
            if prefixes:
                out[0] = budget
            return out

    prompts = _prompts(np.random.default_rng(2), 6)
    got = Half().allocate_prefixes_batch(prompts, [3] * 6, [np.random.default_rng(0)] * 6)
    for p, c in zip(prompts, got, strict=True):
        assert c.tolist() == ([3] + [0] * (len(p) - 1) if p else [])
