"""`trace-gym bench bfcl`: checkpoint/restore latency and steps per second of trace/BFCL-v0.

For every entry (800 by default) it times ``checkpoint()`` and ``restore()`` at the
initial state and at a mid-episode state (halfway through a ground-truth replay, one
call per step), and the env's steps per second on that replay (resets included; the
scripted player's own time is reported apart). Side by side it times the
alternative state copy, ``copy.deepcopy`` of the backends, against the pickle the env
uses. Medians and p99 are reported in milliseconds.
"""

from __future__ import annotations

import copy
import json
import pickle
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trace_gym.cli import Parser

__all__ = ["main", "run"]


def _stats(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values) * 1000.0
    return {"median": float(np.median(arr)), "p99": float(np.percentile(arr, 99)), "n": len(values)}


@dataclass
class _Timings:
    """Seconds per measurement, gathered over the entries."""

    checkpoint: dict[str, list[float]] = field(default_factory=lambda: {"initial": [], "mid": []})
    restore: dict[str, list[float]] = field(default_factory=lambda: {"initial": [], "mid": []})
    deepcopy: list[float] = field(default_factory=list)
    pickle: list[float] = field(default_factory=list)
    steps: int = 0
    step_time: float = 0.0
    player_time: float = 0.0
    rewards: list[float] = field(default_factory=list)


def _play(env: Any, player: Any, i: int, rng: np.random.Generator, t: _Timings) -> list[str]:
    """One ground-truth episode of entry `i`: the player's messages with the env (timed
    together), then the same messages replayed on the env alone; returns the messages."""
    entry = env.entries[i]
    env.reset(options={"task": i})
    actions: list[str] = []
    t0 = time.perf_counter()
    while True:
        actions.append(player.act(entry, actions, rng))
        _, reward, term, trunc, _ = env.step(actions[-1])
        if term or trunc:
            break
    t.player_time += time.perf_counter() - t0
    t.rewards.append(reward)
    t0 = time.perf_counter()
    env.reset(options={"task": i})
    for a in actions:
        env.step(a)
    t.step_time += time.perf_counter() - t0
    t.steps += len(actions)
    return actions


def _time_states(env: Any, i: int, actions: list[str], repeats: int, t: _Timings) -> None:
    """checkpoint/restore at the initial and the mid-episode state; backend copies at mid."""
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
            t.checkpoint[where].append(t1 - t0)
            t.restore[where].append(t2 - t1)
        if where == "mid":
            backends = env._backends
            t0 = time.perf_counter()
            copy.deepcopy(backends)
            t1 = time.perf_counter()
            pickle.loads(pickle.dumps(backends, protocol=pickle.HIGHEST_PROTOCOL))
            t2 = time.perf_counter()
            t.deepcopy.append(t1 - t0)
            t.pickle.append(t2 - t1)


def _report(t: _Timings, n: int, repeats: int) -> dict[str, Any]:
    both_ck = t.checkpoint["initial"] + t.checkpoint["mid"]
    both_rs = t.restore["initial"] + t.restore["mid"]
    return {
        "entries": n,
        "repeats": repeats,
        "checkpoint_ms": _stats(both_ck),
        "restore_ms": _stats(both_rs),
        "checkpoint_ms_by_state": {k: _stats(v) for k, v in t.checkpoint.items()},
        "restore_ms_by_state": {k: _stats(v) for k, v in t.restore.items()},
        "steps_per_s": t.steps / t.step_time if t.step_time else float("nan"),
        "steps_per_s_with_scripted_player": t.steps / t.player_time
        if t.player_time
        else float("nan"),
        "steps": t.steps,
        "ground_truth_success": float(np.mean(t.rewards)),
        "backend_copy_ms": {"pickle_roundtrip": _stats(t.pickle), "deepcopy": _stats(t.deepcopy)},
        "deepcopy_over_pickle": float(np.median(t.deepcopy) / max(np.median(t.pickle), 1e-12)),
    }


def run(
    limit: int | None = None, repeats: int = 5, categories: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """Measure on the first `limit` entries (all when None); returns the JSON report."""
    from trace_gym.envs.bfcl.data import CATEGORIES
    from trace_gym.envs.bfcl.env import BFCLEnv
    from trace_gym.envs.bfcl.scripted import ScriptedBFCL

    env = BFCLEnv(categories=categories or CATEGORIES)
    player = ScriptedBFCL(error_rate=0.0, syntax="hermes")
    n = len(env.entries) if limit is None else min(limit, len(env.entries))
    timings = _Timings()
    rng = np.random.default_rng(0)
    for i in range(n):
        actions = _play(env, player, i, rng, timings)
        _time_states(env, i, actions, repeats, timings)
    return _report(timings, n, repeats)


def main(argv: list[str]) -> int:
    """Entry point of ``trace-gym bench bfcl``."""
    parser = Parser(prog="trace-gym bench bfcl", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--limit", type=int, default=None, help="only the first N entries (default: all 800)"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="checkpoint/restore timings per state"
    )
    parser.add_argument(
        "--categories", nargs="+", default=None, help="BFCL categories (default: all four)"
    )
    parser.add_argument("--json", type=str, default=None, help="write the report to this path")
    args = parser.parse_args(argv)
    report = run(args.limit, args.repeats, tuple(args.categories) if args.categories else None)
    ck, rs = report["checkpoint_ms"], report["restore_ms"]
    print(
        f"trace/BFCL-v0 over {report['entries']} entries (initial + mid-episode states, x{report['repeats']})"
    )
    print(f"  checkpoint  median {ck['median']:.4f} ms   p99 {ck['p99']:.4f} ms")
    print(
        f"  restore     median {rs['median']:.4f} ms   p99 {rs['p99']:.4f} ms   (goal: median <= 1 ms)"
    )
    for where in ("initial", "mid"):
        c, r = report["checkpoint_ms_by_state"][where], report["restore_ms_by_state"][where]
        print(
            f"    {where:<8} checkpoint {c['median']:.4f} / {c['p99']:.4f}   restore {r['median']:.4f} / {r['p99']:.4f}"
        )
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
