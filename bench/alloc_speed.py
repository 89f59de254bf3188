"""`trace-gym bench alloc-speed`: the exact allocation solvers, fast vs reference, side by side.

P = 4096 candidates with U-shaped values (Beta(0.3, 0.3), most prompts near 0 or 1 as
in the paper), root budget B = 8192, m_max = 16: median wall time of the fast exact
solver and of the vectorised reference DP in the same run, their ratio, whether both
reach the same objective; then the prefix split of 64 prefixes with a budget of 32.
Goals (issue 3): fast <= 20 ms, >= 20x faster than the reference, prefix <= 100 us.

`--scale 256,4096,65536` times the whole allocation step at each size instead (issue 28):
P candidates (Beta(0.3, 0.3)), root budget 2P, the exact root solve; every selected
prompt's m roots of 4 turns give 3m inner prefixes (random values and 0/1 rewards); the
step's 2 replays per root split by root count (`split_budget`); then the prefix split,
per prompt (`solve_prefixes` in a loop, as the runner's per-prompt expansion calls it) and
batched (`solve_prefixes_batch`, one call, as the global expansion does), and through the
allocator API as the runner's global expansion pays it on real root-only trees: the tree
walk (`walk_prefixes`), the `PrefixColumns` built from it and the values, and
`TraceAllocator.allocate_prefixes_batch` on them; beside it the records path the runner
took before (`prefix_nodes` + `prefix_candidates` per prompt, the API on the records),
with a check that both give the same counts. Each figure with its ratio to the smallest
size. Goals at the largest size: the whole step (root solve + split + building the
columns + the API on them; `step`) <= 3x the root solve and <= 300 ms. `runner_step` adds
the tree walk, `records_step` is the records path with its building, `api_step` the
records path without it (the goal's step before the columns), `solver_step` the floor.

`--mixture 1024,16384,65536` times the mixture root solver instead (issue 28): P
candidates (Beta(0.3, 0.3)), each with a rollout cost drawn from `--costs` (default
0.3,1,3: three envs) and scaled to mean 1, budget 2P in those units, m_max = 16; per size
the flat solver (`solve_roots`, budget 2P, all costs 1) and the cost-class solver
(`solve_roots_costed`), interleaved, median of the repeats, and their ratio. Exactness in
the same run: the reference DP (`solve_roots_costed_reference`, a P x budget table) at
every size where its table stays under 50M cells (its time and the speedup beside it),
and brute force over every allocation on 300 tiny random instances (`--brute`). Goal at the largest
size: the cost-class solver <= 2x the flat one, and exact wherever checked.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trace_gym.alloc import make_allocator, prefix_candidates, split_budget, walk_prefixes
from trace_gym.alloc.base import PrefixCandidate
from trace_gym.alloc.solvers import (
    clip_values,
    root_value,
    solve_prefixes,
    solve_prefixes_batch,
    solve_roots,
    solve_roots_costed,
    solve_roots_costed_reference,
    solve_roots_reference,
)
from trace_gym.budget import DEFAULT_REPLAY_COST
from trace_gym.cli import Parser
from trace_gym.plan import prefix_nodes
from trace_gym.tree import RolloutTree, Turn

#: the timed stages of `--scale`, in the order the table prints them
STAGES = (
    "root_s",
    "split_s",
    "prefix_loop_s",
    "prefix_batch_s",
    "walk_s",
    "columns_build_s",
    "prefix_api_s",
    "records_build_s",
    "prefix_records_s",
    "solver_step_s",
    "api_step_s",
    "records_step_s",
    "step_s",
    "runner_step_s",
)


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(
    *,
    candidates: int = 4096,
    budget: int = 8192,
    m_max: int = 16,
    repeats: int = 21,
    reference_repeats: int = 3,
    prefixes: int = 64,
    prefix_budget: int = 32,
    prefix_repeats: int = 2000,
    seed: int = 0,
) -> dict:
    """Time both root solvers and the prefix split; returns the figures as a dict."""
    rng = np.random.default_rng(seed)
    values = rng.beta(0.3, 0.3, size=candidates)
    fast = solve_roots(values, budget, m_max)  # also warms up
    ref = solve_roots_reference(values, budget, m_max)
    fast_s = _median_seconds(lambda: solve_roots(values, budget, m_max), repeats)
    ref_s = _median_seconds(lambda: solve_roots_reference(values, budget, m_max), reference_repeats)

    pv = rng.random(prefixes)
    pr = rng.integers(0, 2, size=prefixes).astype(float)
    solve_prefixes(pv, pr, prefix_budget)
    prefix_s = _median_seconds(lambda: solve_prefixes(pv, pr, prefix_budget), prefix_repeats)
    return {
        "candidates": candidates,
        "budget": budget,
        "m_max": m_max,
        "values": "Beta(0.3, 0.3)",
        "repeats": repeats,
        "reference_repeats": reference_repeats,
        "root_fast_ms": fast_s * 1e3,
        "root_reference_ms": ref_s * 1e3,
        "speedup": ref_s / fast_s,
        "objective_fast": fast.objective,
        "objective_reference": ref.objective,
        "objective_equal": bool(np.isclose(fast.objective, ref.objective, rtol=0, atol=1e-9)),
        "selected_prompts": int((fast.counts > 0).sum()),
        "prefixes": prefixes,
        "prefix_budget": prefix_budget,
        "prefix_us": prefix_s * 1e6,
        "goals_met": {
            "root_fast_ms<=20": fast_s * 1e3 <= 20,
            "speedup>=20": ref_s / fast_s >= 20,
            "prefix_us<=100": prefix_s * 1e6 <= 100,
        },
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }


def _step_problem(p: int, seed: int) -> dict:
    """One synthetic step at `p` candidates: values, root counts, prefixes, replay shares."""
    rng = np.random.default_rng(seed)
    values = rng.beta(0.3, 0.3, size=p)
    counts = solve_roots(values, 2 * p, 16).counts
    kept = counts[counts > 0]
    sizes = 3 * kept  # 4-turn rollouts: 3 inner prefixes each
    n = int(sizes.sum())
    return {
        "values": values,
        "kept": kept,
        "sizes": sizes,
        "pv": rng.random(n),
        "pr": rng.integers(0, 2, size=n).astype(float),
    }


def _time_step(prob: dict, repeats: int, loop: bool) -> dict:
    """Median seconds of each stage of one step (`loop`: also the per-prompt prefix loop)."""
    values, kept, sizes, pv, pr = (prob[k] for k in ("values", "kept", "sizes", "pv", "pr"))
    p = values.size
    shares = split_budget(kept, 2 * int(kept.sum()))
    bounds = np.r_[0, np.cumsum(sizes)]
    out = {
        "root_s": _median_seconds(lambda: solve_roots(values, 2 * p, 16), repeats),
        "split_s": _median_seconds(lambda: split_budget(kept, 2 * int(kept.sum())), repeats),
        "prefix_batch_s": _median_seconds(
            lambda: solve_prefixes_batch(pv, pr, sizes, shares), repeats
        ),
    }
    if loop:

        def per_prompt():
            for g in range(sizes.size):
                solve_prefixes(
                    pv[bounds[g] : bounds[g + 1]], pr[bounds[g] : bounds[g + 1]], int(shares[g])
                )

        out["prefix_loop_s"] = _median_seconds(per_prompt, 1)
    out |= _time_runner_paths(prob, shares, repeats)
    # the goal's step: what the runner's global expansion pays after its tree walk (which
    # gives the prefixes to score; `prefix_nodes` did it before): building the columns
    # from the walk and the predictor's values, and the allocator call on them
    out["step_s"] = out["root_s"] + out["split_s"] + out["columns_build_s"] + out["prefix_api_s"]
    out["runner_step_s"] = out["step_s"] + out["walk_s"]  # the tree walk as well
    # the runner before the columns: records built per prompt, then the API on them
    out["records_step_s"] = (
        out["root_s"] + out["split_s"] + out["records_build_s"] + out["prefix_records_s"]
    )
    out["api_step_s"] = out["root_s"] + out["split_s"] + out["prefix_records_s"]  # `b266c91`'s
    out["solver_step_s"] = out["root_s"] + out["split_s"] + out["prefix_batch_s"]
    out |= {"candidates": p, "prompts": int(sizes.size), "prefixes": int(sizes.sum())}
    return out


def _step_trees(prob: dict) -> list[RolloutTree]:
    """The step's root-only trees: prompt g's `kept[g]` rollouts of 4 turns (3 inner
    prefixes each), each rollout's 0/1 reward that of its first prefix in `pr`."""
    trees, at = [], 0
    for g, m in enumerate(prob["kept"].tolist()):
        tree = RolloutTree(f"p{g}", "prompt")
        for _ in range(m):
            node = 0
            for _ in range(4):
                node = tree.add_child(node, _TURN).id
            tree.finish(node, reward=float(prob["pr"][at]))
            at += 3
        trees.append(tree)
    return trees


_TURN = Turn("a", "o")


def _time_runner_paths(prob: dict, shares: np.ndarray, repeats: int) -> dict:
    """The prefix split as the runner pays it on real trees, both ways, side by side.

    Columns (the global expansion now): `walk_prefixes` (the tree walk), the columns
    built from it and the predictor's values (`PrefixWalk.columns`), the allocator on
    them. Records (before): `prefix_nodes` + `prefix_candidates` per prompt (the old
    `_prefix_records`), the allocator on them. Both give the same counts (checked)."""
    trees, pv = _step_trees(prob), prob["pv"]
    alloc = make_allocator("trace")
    budgets, rngs = shares.tolist(), [np.random.default_rng(0)] * len(trees)
    costs = [DEFAULT_REPLAY_COST] * len(trees)  # the flat replay cost, one object
    walk = walk_prefixes(trees)
    cols = walk.columns(pv, costs)
    records = _runner_records(trees, pv)
    alloc.allocate_prefixes_batch(records[:2], budgets[:2], rngs[:2])  # numpy's lazy imports
    few = max(1, repeats // 2)
    out = {
        "walk_s": _median_seconds(lambda: walk_prefixes(trees), few),
        "columns_build_s": _median_seconds(lambda: walk.columns(pv, costs), repeats),
        "prefix_api_s": _median_seconds(  # as many runs as the solver on arrays
            lambda: alloc.allocate_prefixes_batch(cols, budgets, rngs), repeats
        ),
        "records_build_s": _median_seconds(lambda: _runner_records(trees, pv), 1),
        "prefix_records_s": _median_seconds(
            lambda: alloc.allocate_prefixes_batch(records, budgets, rngs), few
        ),
    }
    by_cols = alloc.allocate_prefixes_batch(cols, budgets, rngs)
    by_records = alloc.allocate_prefixes_batch(records, budgets, rngs)
    out["same_counts"] = all(np.array_equal(a, b) for a, b in zip(by_cols, by_records, strict=True))
    return out


def _runner_records(trees: list[RolloutTree], pv: np.ndarray) -> list[list[PrefixCandidate]]:
    """The records the runner built per prompt before the columns (`plan._prefix_records`):
    `prefix_nodes`, the values by node id, `prefix_candidates` on the chain leaves."""
    out, at = [], 0
    for tree in trees:
        ids = prefix_nodes(tree)
        values = dict(zip(ids, pv[at : at + len(ids)].tolist(), strict=True))
        at += len(ids)
        leaves = [_chain_leaf(tree, first) for first in tree.root.children]
        out.append(prefix_candidates(tree, leaves, values, cost=DEFAULT_REPLAY_COST))
    return out


def _chain_leaf(tree: RolloutTree, node: int) -> int:
    while tree[node].children:
        node = tree[node].children[0]
    return node


def run_scale(sizes: list[int], *, repeats: int = 5, loop_max: int = 65536, seed: int = 0) -> dict:
    """`--scale`: each stage of the allocation step per size, with ratios to the smallest."""
    rows = [_time_step(_step_problem(p, seed), repeats, p <= loop_max) for p in sizes]
    base = rows[0]
    for r in rows:
        r["ratio_to_smallest"] = {
            k: r[k] / base[k] for k in r if k.endswith("_s") and k in base and base[k] > 0
        }
    big = rows[-1]
    return {
        "sizes": sizes,
        "rows": rows,
        "goals_met": {
            f"step<=3x_root@{big['candidates']}": big["step_s"] <= 3 * big["root_s"],
            f"step<=300ms@{big['candidates']}": big["step_s"] <= 0.3,
        },
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


#: largest table (prompts x budget units) the mixture bench gives the reference DP
MIXTURE_REFERENCE_CELLS = 50_000_000


def run_mixture(
    sizes: list[int],
    costs: list[float],
    *,
    repeats: int = 5,
    m_max: int = 16,
    seed: int = 0,
    brute: int = 300,
) -> dict:
    """`--mixture`: the cost-class root solver against the flat one per size, and exactness."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in sizes:
        v = rng.beta(0.3, 0.3, p)
        c = rng.choice(np.asarray(costs, dtype=float), p)
        c = c / c.mean()
        budget = 2 * p
        flat_t, mixed_t = [], []
        for _ in range(repeats):  # interleaved, so both see the same machine
            t0 = time.perf_counter()
            solve_roots(v, budget, m_max)
            flat_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sol = solve_roots_costed(v, c, float(budget), m_max)
            mixed_t.append(time.perf_counter() - t0)
        units = int(np.floor(budget * 8 + 1e-9))
        w = np.ceil(c * 8 - 1e-9).astype(int)
        row = {
            "candidates": p,
            "distinct_costs": int(np.unique(w).size),
            "flat_s": statistics.median(flat_t),
            "mixture_s": statistics.median(mixed_t),
            "spent_units": int(w @ sol.counts),
            "budget_units": units,
            "reference_table_cells": p * (units + 1),
        }
        row["ratio"] = row["mixture_s"] / row["flat_s"]
        if p * (units + 1) <= MIXTURE_REFERENCE_CELLS:
            t0 = time.perf_counter()
            ref = solve_roots_costed_reference(v, c, float(budget), m_max)
            row["reference_s"] = time.perf_counter() - t0
            row["speedup_vs_reference"] = row["reference_s"] / row["mixture_s"]
            row["objective_equal"] = bool(abs(ref.objective - sol.objective) <= 1e-9)
        rows.append(row)
    brute = _mixture_brute_force(rng, brute)
    big = rows[-1]
    checked = [r["objective_equal"] for r in rows if "objective_equal" in r]
    return {
        "sizes": sizes,
        "costs": costs,
        "m_max": m_max,
        "rows": rows,
        "brute_force": brute,
        "goals_met": {
            f"mixture<=2x_flat@{big['candidates']}": big["ratio"] <= 2.0,
            "exact_where_checked": all(checked) and brute["equal"] == brute["instances"],
        },
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def _mixture_brute_force(rng: np.random.Generator, instances: int) -> dict:
    """The cost-class solver against every allocation of tiny random mixtures."""
    import itertools

    equal = 0
    for _ in range(instances):
        p, m_max = int(rng.integers(1, 5)), int(rng.integers(2, 6))
        v = rng.choice([rng.uniform(0, 1), 0.5, 0.2, 0.8], p) if rng.random() < 0.5 else None
        v = rng.uniform(0.02, 0.98, p) if v is None else v
        c = rng.choice([0.25, 0.5, 1.0, 1.5, 2.5, 3.0], p)
        budget = float(rng.uniform(0, p * m_max * 1.5))
        w, units = np.ceil(c * 8 - 1e-9).astype(int), int(np.floor(budget * 8 + 1e-9))
        best = max(
            float(root_value(clip_values(v), np.array(ms)).sum())
            for ms in itertools.product([0, *range(2, m_max + 1)], repeat=p)
            if int(w @ np.array(ms)) <= units
        )
        equal += abs(solve_roots_costed(v, c, budget, m_max).objective - best) <= 1e-9
    return {"instances": instances, "equal": int(equal)}


def _print_mixture(r: dict) -> None:
    print(f"mixture root solver (costs {r['costs']}, scaled to mean 1; budget 2P; ms)")
    print(
        f"{'P':>7} {'costs':>5} {'flat':>9} {'mixture':>9} {'ratio':>6} "
        f"{'reference':>10} {'speedup':>8} {'exact':>6}"
    )
    for row in r["rows"]:
        ref = row.get("reference_s")
        print(
            f"{row['candidates']:>7} {row['distinct_costs']:>5} {row['flat_s'] * 1e3:9.1f} "
            f"{row['mixture_s'] * 1e3:9.1f} {row['ratio']:6.2f} "
            + (
                f"{ref * 1e3:10.1f} {row['speedup_vs_reference']:7.0f}x "
                f"{str(row['objective_equal']):>6}"
                if ref is not None
                else f"{'-':>10} {'-':>8} {'-':>6}  (table {row['reference_table_cells']:.3g} cells)"
            )
        )
    b = r["brute_force"]
    print(f"brute force: {b['equal']} of {b['instances']} tiny instances equal")
    print(
        "goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in r["goals_met"].items())
    )


def _print_scale(r: dict) -> None:
    cols = STAGES
    print("allocation step by size (ms; x = ratio to the smallest size)")
    print(f"{'P':>7} {'prompts':>7} {'prefixes':>8} " + " ".join(f"{c[:-2]:>18}" for c in cols))
    for row in r["rows"]:
        cells = [
            f"{row[c] * 1e3:9.1f} ({row['ratio_to_smallest'].get(c, float('nan')):5.0f}x)"
            if c in row
            else f"{'-':>18}"
            for c in cols
        ]
        print(f"{row['candidates']:>7} {row['prompts']:>7} {row['prefixes']:>8} " + " ".join(cells))
    print(
        "goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in r["goals_met"].items())
    )


def _parser() -> Parser:
    p = Parser(
        prog="trace-gym bench alloc-speed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    p.add_argument("--candidates", type=int, default=4096)
    p.add_argument("--budget", type=int, default=8192)
    p.add_argument("--m-max", type=int, default=16)
    p.add_argument("--repeats", type=int, default=21, help="runs of the fast solver (median)")
    p.add_argument(
        "--reference-repeats", type=int, default=3, help="runs of the reference DP (median)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--scale",
        type=_sizes,
        help="comma-separated candidate counts, e.g. 256,4096,65536: the whole step per size",
    )
    p.add_argument(
        "--mixture",
        type=_sizes,
        help="comma-separated candidate counts: the mixture root solver vs the flat one per size",
    )
    p.add_argument(
        "--costs",
        type=_costs,
        default=[0.3, 1.0, 3.0],
        help="--mixture: the envs' rollout costs, comma-separated (default 0.3,1,3)",
    )
    p.add_argument(
        "--brute", type=int, default=300, help="--mixture: tiny instances checked by brute force"
    )
    return p


def main(argv: list[str]) -> int:
    """Entry point of `trace-gym bench alloc-speed [--json PATH]`."""
    args = _parser().parse_args(argv)
    if args.mixture:
        r = run_mixture(
            args.mixture,
            args.costs,
            repeats=max(1, min(args.repeats, 7)),
            seed=args.seed,
            brute=max(0, args.brute),
        )
        _print_mixture(r)
    elif args.scale:
        r = run_scale(args.scale, repeats=max(1, min(args.repeats, 5)), seed=args.seed)
        _print_scale(r)
    else:
        r = run(
            candidates=args.candidates,
            budget=args.budget,
            m_max=args.m_max,
            repeats=args.repeats,
            reference_repeats=args.reference_repeats,
            seed=args.seed,
        )
        _print_solvers(r)
    _write_json(args.json, r)
    return 0


def _print_solvers(r: dict) -> None:
    print(
        f"root allocation: P={r['candidates']} B={r['budget']} m_max={r['m_max']} values {r['values']}"
    )
    print(f"  fast exact solver   {r['root_fast_ms']:10.2f} ms  (median of {r['repeats']})")
    print(
        f"  reference DP        {r['root_reference_ms']:10.2f} ms  (median of {r['reference_repeats']})"
    )
    print(f"  speedup             {r['speedup']:10.1f} x")
    print(
        f"  objective equal     {r['objective_equal']}  ({r['objective_fast']:.6f}; "
        f"{r['selected_prompts']} prompts selected)"
    )
    print(
        f"prefix split: {r['prefixes']} prefixes, budget {r['prefix_budget']}: {r['prefix_us']:.1f} us"
    )
    print(
        "goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in r["goals_met"].items())
    )


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(x < 2 for x in sizes) or sizes != sorted(sizes):
        raise argparse.ArgumentTypeError(
            f"--scale wants increasing candidate counts >= 2 separated by commas, got {text!r}"
        )
    return sizes


def _costs(text: str) -> list[float]:
    try:
        costs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        costs = []
    if not costs or not all(np.isfinite(x) and x > 0 for x in costs):
        raise argparse.ArgumentTypeError(
            f"--costs wants positive numbers separated by commas, got {text!r}"
        )
    return costs


def _write_json(path: Path | None, r: dict) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(r, indent=2) + "\n")
        print(f"wrote {path}")
