"""The batched prefix split (one call for every prompt of a step) equals the per-prompt one."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from trace_gym.alloc import (
    make_allocator,
    prefix_candidates,
    remaining_turn_cost,
    solve_prefixes,
    solve_prefixes_batch,
    walk_prefixes,
)
from trace_gym.alloc.base import BatchPrefixAllocator, PrefixCandidate, PrefixColumns
from trace_gym.alloc.policies import TraceAllocator
from trace_gym.errors import AllocationError
from trace_gym.tree import RolloutTree, Turn

#: every kind of prefix rule: TRACE's (plug-in, oracle, posterior, cost-aware), random,
#: TreePO's, none (a flat policy)
ALLOCATORS = [
    ("trace", {}),
    ("oracle", {}),
    ("trace", {"objective": "posterior"}),
    ("trace", {"cost_aware": True}),
    ("trace_roots_random_prefixes", {}),
    ("treepo", {}),
    ("grpo", {}),
]


def _chain_leaf(tree, node):
    while tree[node].children:
        node = tree[node].children[0]
    return node


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
    ALLOCATORS[:-1],
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


def _sparse_prompts(rng, n_prompts):
    """`_prompts` with some concentrations and true values None (columns: inf, NaN)."""
    out = []
    for ps in _prompts(rng, n_prompts):
        out.append(
            [
                replace(
                    p,
                    concentration=None if rng.random() < 0.4 else p.concentration,
                    rollout_turns=int(rng.integers(2, 6)),
                )
                for p in ps
            ]
        )
    return out


@pytest.mark.parametrize(
    "name,kw",
    ALLOCATORS,
)
def test_columns_records_and_per_prompt_give_the_same_counts(name, kw):
    alloc = make_allocator(name, **kw)
    rng = np.random.default_rng(7)
    for _ in range(25):
        prompts = _sparse_prompts(rng, int(rng.integers(1, 20)))
        budgets = [
            round(float(rng.random() * 3), 2) if alloc.cost_aware else int(rng.integers(0, 12))
            for _ in prompts
        ]

        def rngs(prompts=prompts):
            return [np.random.default_rng(100 + g) for g in range(len(prompts))]

        cols = PrefixColumns.from_records(prompts)
        assert cols.records() == prompts  # the columns hold the records exactly
        by_cols = alloc.allocate_prefixes_batch(cols, budgets, rngs())
        by_records = alloc.allocate_prefixes_batch(prompts, budgets, rngs())
        ref = [
            alloc.allocate_prefixes(p, b, r)
            for p, b, r in zip(prompts, budgets, rngs(), strict=True)
        ]
        assert len(by_cols) == len(by_records) == len(ref) == len(prompts)
        for a, b, c in zip(by_cols, by_records, ref, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
            np.testing.assert_array_equal(np.asarray(b), np.asarray(c))


def test_columns_of_no_prefix_give_empty_counts():
    cols = PrefixColumns.from_records([[], []])
    got = make_allocator("trace").allocate_prefixes_batch(cols, [0, 0], [None, None])
    assert [g.size for g in got] == [0, 0]


def _good_columns(n=3):
    cols = PrefixColumns.from_records(_prompts(np.random.default_rng(1), 4))
    while len(cols.value) < n:
        cols = PrefixColumns.from_records(_prompts(np.random.default_rng(n), 6))
    return {f.name: getattr(cols, f.name) for f in dataclasses.fields(cols)}


@pytest.mark.parametrize(
    "field,bad",
    [
        ("value", lambda a: np.r_[a[:-1], 1.5]),
        ("value", lambda a: np.r_[a[:-1], np.nan]),
        ("value", lambda a: a[:-1]),
        ("value", lambda a: np.array(["x"] * a.size)),
        ("reward", lambda a: np.r_[a[:-1], 2.0]),
        ("cost", lambda a: np.r_[a[:-1], -1.0]),
        ("cost", lambda a: np.r_[a[:-1], np.inf]),
        ("true_value", lambda a: np.r_[a[:-1], np.inf]),
        ("concentration", lambda a: np.r_[a[:-1], 0.0]),
        ("concentration", lambda a: np.r_[a[:-1], np.nan]),
        ("depth", lambda a: np.r_[a[:-1], 0]),
        ("node", lambda a: np.r_[a[:-1], 0.5]),
        ("rollout", lambda a: np.r_[a[:-1], -1]),
        ("rollout_turns", lambda a: a.reshape(1, -1)),
        ("bounds", lambda a: a[::-1]),
        ("bounds", lambda a: np.r_[a[:-1], a[-1] + 1]),  # rows: "... entries (bounds[-1])"
    ],
)
def test_bad_columns_raise_an_allocation_error_naming_the_field(field, bad):
    cols = _good_columns()
    cols[field] = bad(cols[field])
    pattern = rf"PrefixColumns\.{field}\b"
    if field == "bounds" and cols[field][0] == 0:  # a row field's length names bounds[-1]
        pattern = r"PrefixColumns\.rollout .* bounds\[-1\]"
    with pytest.raises(AllocationError, match=pattern):
        PrefixColumns(**cols)


def test_the_oracle_on_columns_without_true_values_says_so():
    prompts = [
        [replace(p, true_value=None) for p in ps] for ps in _prompts(np.random.default_rng(3), 4)
    ]
    cols = PrefixColumns.from_records(prompts)
    with pytest.raises(AllocationError, match="true success probabilities"):
        make_allocator("oracle").allocate_prefixes_batch(cols, [2] * 4, [None] * 4)


def _random_tree(rng, g):
    tree = RolloutTree(f"p{g}", "prompt", success_threshold=0.5)
    for _ in range(int(rng.integers(0, 5))):
        node = 0
        for _ in range(int(rng.integers(1, 6))):
            tv = None if rng.random() < 0.3 else float(rng.random())
            node = tree.add_child(node, Turn("a", "o"), true_value=tv).id
        if rng.random() < 0.15:
            tree.finish(node, error="env: broke")
        else:
            tree.finish(node, reward=float(rng.choice([0.0, 0.4, 0.6, 1.0])))
    return tree


@pytest.mark.parametrize(
    "cost", [remaining_turn_cost, 0.5, None, lambda d, t: 1.5 * remaining_turn_cost(d, t)]
)
def test_walk_prefixes_gives_prefix_candidates_rows(cost):
    rng = np.random.default_rng(4)
    trees = [_random_tree(rng, g) for g in range(40)]
    walk = walk_prefixes(trees)
    values = rng.random(int(walk.bounds[-1]))
    conc = [None if rng.random() < 0.5 else float(rng.choice([1.0, 8.0])) for _ in values]
    costs = [cost if g % 3 else (0.25 if cost is not None else None) for g in range(len(trees))]
    cols = walk.columns(values, costs, conc)
    b = cols.bounds.tolist()
    for g, tree in enumerate(trees):
        leaves = [_chain_leaf(tree, first) for first in tree.root.children]
        rows = dict(
            zip(cols.node[b[g] : b[g + 1]].tolist(), values[b[g] : b[g + 1]].tolist(), strict=True)
        )
        ref = prefix_candidates(tree, leaves, rows, cost=costs[g])
        ref = [replace(p, concentration=c) for p, c in zip(ref, conc[b[g] : b[g + 1]], strict=True)]
        assert cols.records()[g] == ref
