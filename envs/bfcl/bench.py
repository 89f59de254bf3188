"""`trace-gym bench bfcl`: checkpoint/restore latency and steps per second of trace/BFCL-v0.

For every entry (800 by default) it times ``checkpoint()`` and ``restore()`` at the
initial state and at a mid-episode state (halfway through a ground-truth replay, one
call per step), and the env's steps per second on that replay (resets included; the
scripted player's own time is reported apart). Side by side it times the
alternative state copy, ``copy.deepcopy`` of the backends, against the pickle the env
uses. Medians and p99 are reported in milliseconds.
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
import time
from typing import Any

import numpy as np

__all__ = ["main", "run"]


def _stats(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values) * 1000.0
    return {"median": float(np.median(arr)), "p99": float(np.percentile(arr, 99)), "n": len(values)}


def run(limit: int | None = None, repeats: int = 5, categories: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Measure on the first `limit` entries (all when None); returns the JSON report."""
    from trace_gym.envs.bfcl.data import CATEGORIES
    from trace_gym.envs.bfcl.env import BFCLEnv
    from trace_gym.envs.bfcl.scripted import ScriptedBFCL

    env = BFCLEnv(categories=categories or CATEGORIES)
    player = ScriptedBFCL(error_rate=0.0, syntax="hermes")
    n = len(env.entries) if limit is None else min(limit, len(env.entries))
    ck_times: dict[str, list[float]] = {"initial": [], "mid": []}
    rs_times: dict[str, list[float]] = {"initial": [], "mid": []}
    deepcopy_times: list[float] = []
    pickle_times: list[float] = []
    steps, step_time, player_time, rewards = 0, 0.0, 0.0, []
    rng = np.random.default_rng(0)
    for i in range(n):
        entry = env.entries[i]
        env.reset(options={"task": i})
        actions: list[str] = []
        # the scripted player's messages first (timed apart), then the env alone
        t0 = time.perf_counter()
        while True:
            actions.append(player.act(entry, actions, rng))
            _, reward, term, trunc, _ = env.step(actions[-1])
            if term or trunc:
                break
        player_time += time.perf_counter() - t0
        rewards.append(reward)
        t0 = time.perf_counter()
        env.reset(options={"task": i})
        for a in actions:
            env.step(a)
        step_time += time.perf_counter() - t0
        steps += len(actions)
        for where, prefix in (("initial", 0), ("mid", len(actions) // 2)):
            env.reset(options={"task": i})
            for a in actions[:prefix]:
                env.step(a)
            for _ in range(repeats):
                t0 = time.perf_counter()
                ck = env.checkpoint()
                t1 = time.perf_counter()
                env.restore(ck)
                t2 = time.perf_counter()
                ck_times[where].append(t1 - t0)
                rs_times[where].append(t2 - t1)
            if where == "mid":
                backends = env._backends
                t0 = time.perf_counter()
                copy.deepcopy(backends)
                t1 = time.perf_counter()
                pickle.loads(pickle.dumps(backends, protocol=pickle.HIGHEST_PROTOCOL))
                t2 = time.perf_counter()
                deepcopy_times.append(t1 - t0)
                pickle_times.append(t2 - t1)
    both_ck = ck_times["initial"] + ck_times["mid"]
    both_rs = rs_times["initial"] + rs_times["mid"]
    return {
        "entries": n,
        "repeats": repeats,
        "checkpoint_ms": _stats(both_ck),
        "restore_ms": _stats(both_rs),
        "checkpoint_ms_by_state": {k: _stats(v) for k, v in ck_times.items()},
        "restore_ms_by_state": {k: _stats(v) for k, v in rs_times.items()},
        "steps_per_s": steps / step_time if step_time else float("nan"),
        "steps_per_s_with_scripted_player": steps / player_time if player_time else float("nan"),
        "steps": steps,
        "ground_truth_success": float(np.mean(rewards)),
        "backend_copy_ms": {"pickle_roundtrip": _stats(pickle_times), "deepcopy": _stats(deepcopy_times)},
        "deepcopy_over_pickle": float(np.median(deepcopy_times) / max(np.median(pickle_times), 1e-12)),
    }


def main(argv: list[str]) -> int:
    """Entry point of ``trace-gym bench bfcl``."""
    parser = argparse.ArgumentParser(prog="trace-gym bench bfcl", description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N entries (default: all 800)")
    parser.add_argument("--repeats", type=int, default=5, help="checkpoint/restore timings per state")
    parser.add_argument("--categories", nargs="+", default=None, help="BFCL categories (default: all four)")
    parser.add_argument("--json", type=str, default=None, help="write the report to this path")
    args = parser.parse_args(argv)
    report = run(args.limit, args.repeats, tuple(args.categories) if args.categories else None)
    ck, rs = report["checkpoint_ms"], report["restore_ms"]
    print(f"trace/BFCL-v0 over {report['entries']} entries (initial + mid-episode states, x{report['repeats']})")
    print(f"  checkpoint  median {ck['median']:.4f} ms   p99 {ck['p99']:.4f} ms")
    print(f"  restore     median {rs['median']:.4f} ms   p99 {rs['p99']:.4f} ms   (goal: median <= 1 ms)")
    for where in ("initial", "mid"):
        c, r = report["checkpoint_ms_by_state"][where], report["restore_ms_by_state"][where]
        print(f"    {where:<8} checkpoint {c['median']:.4f} / {c['p99']:.4f}   restore {r['median']:.4f} / {r['p99']:.4f}")
    bc = report["backend_copy_ms"]
    print(
        f"  backend copy: pickle round trip {bc['pickle_roundtrip']['median']:.4f} ms, "
        f"deepcopy {bc['deepcopy']['median']:.4f} ms (deepcopy/pickle = {report['deepcopy_over_pickle']:.1f}x)"
    )
    print(
        f"  steps/s {report['steps_per_s']:.0f} env only (reset included), "
        f"{report['steps_per_s_with_scripted_player']:.0f} with the scripted player; {report['steps']} steps, "
        f"ground-truth success {report['ground_truth_success']:.3f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"  wrote {args.json}")
    return 0
