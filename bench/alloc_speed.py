"""`trace-gym bench alloc-speed`: the exact allocation solvers, fast vs reference, side by side.

P = 4096 candidates with U-shaped values (Beta(0.3, 0.3), most prompts near 0 or 1 as
in the paper), root budget B = 8192, m_max = 16: median wall time of the fast exact
solver and of the vectorised reference DP in the same run, their ratio, whether both
reach the same objective; then the prefix split of 64 prefixes with a budget of 32.
Goals (issue 3): fast <= 20 ms, >= 20x faster than the reference, prefix <= 100 us.
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

from trace_gym.alloc.solvers import solve_prefixes, solve_roots, solve_roots_reference
from trace_gym.cli import Parser


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


def main(argv: list[str]) -> int:
    """Entry point of `trace-gym bench alloc-speed [--json PATH]`."""
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
    args = p.parse_args(argv)
    r = run(
        candidates=args.candidates,
        budget=args.budget,
        m_max=args.m_max,
        repeats=args.repeats,
        reference_repeats=args.reference_repeats,
        seed=args.seed,
    )
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
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
