"""`trace-gym bench wrap-restore`: restore cost of `trace_gym.wrap` (replay) vs a native checkpoint.

One env, two ways: the env itself (its own `checkpoint()` / `restore()`), and the same
env behind ``trace_gym.wrap`` (seed + action log; restore = reset and replay every
action; ``restore="copy"`` keeps a deep copy as a local handle). For checkpoints taken
after k turns it times restore (median of ``--reps``) and reports wrapped / native.
Replay cost grows with k (k inner steps per restore); the native path does not.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import trace_gym
from trace_gym.cli import Parser, json_object
from trace_gym.provenance import write_provenance
from trace_gym.wrap import WrappedEnv, wrap

#: env id -> constructor kwargs (long episodes, so depth matters)
DEFAULT_ENV = "trace/Sim-v0"
DEFAULT_KWARGS: dict[str, Any] = {"preset": "bfcl", "num_tasks": 8}


def _median_restore_s(env: Any, ck: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        env.restore(ck)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _checkpoints(env: Any, depths: list[int], seed: int, action: str | None) -> dict[int, Any]:
    """Play one episode (`action` every turn, else the env's example actions); checkpoint at each depth."""
    rng = np.random.default_rng(seed)
    if isinstance(env, WrappedEnv):  # task 0 = inner reset(seed=0): the same episode as below
        env.reset(options={"task": 0})
    else:
        env.reset(seed=0)
    out = {0: env.checkpoint()} if 0 in depths else {}
    while not env.done and env.turn < max(depths):
        env.step(action if action is not None else env.example_action(rng))
        if env.turn in depths and not env.done:
            out[env.turn] = env.checkpoint()
    return out


def measure(
    env_id: str,
    kwargs: dict[str, Any],
    depths: list[int],
    reps: int,
    seed: int,
    action: str | None = None,
) -> list[dict[str, Any]]:
    """Rows of (depth, native_ms, replay_ms, copy_ms, replay/native) for one env."""
    native = trace_gym.unwrap(gym.make(env_id, **kwargs))
    ways = {
        "native": native,
        "replay": wrap(
            lambda: gym.make(env_id, **kwargs).unwrapped, restore="replay", max_turns=10_000
        ),
        "copy": wrap(
            lambda: gym.make(env_id, **kwargs).unwrapped, restore="copy", max_turns=10_000
        ),
    }
    # the wrapped env's task 0 is inner seed 0; the native env is reset the same way
    ckpts = {name: _checkpoints(env, depths, seed, action) for name, env in ways.items()}
    rows = []
    for d in sorted(set.intersection(*(set(c) for c in ckpts.values()))):
        ms = {
            name: 1e3 * _median_restore_s(env, ckpts[name][d], reps) for name, env in ways.items()
        }
        rows.append(
            {
                "depth": d,
                **{f"{k}_ms": v for k, v in ms.items()},
                "replay_over_native": ms["replay"] / ms["native"],
                "copy_over_native": ms["copy"] / ms["native"],
            }
        )
    return rows


def format_rows(env_id: str, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"restore cost on {env_id}: native checkpoint vs trace_gym.wrap (median ms per restore)",
        f"{'turns':>6} {'native':>9} {'replay':>9} {'copy':>9} {'replay/native':>14} {'copy/native':>12}",
    ]
    for r in rows:
        lines.append(
            f"{r['depth']:>6} {r['native_ms']:>9.3f} {r['replay_ms']:>9.3f} {r['copy_ms']:>9.3f} "
            f"{r['replay_over_native']:>13.1f}x {r['copy_over_native']:>11.1f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="trace-gym bench wrap-restore", description=__doc__.splitlines()[0])
    p.add_argument(
        "--env", default=DEFAULT_ENV, help=f"a registered trace-gym id (default {DEFAULT_ENV})"
    )
    p.add_argument("--env-kwargs", default=json.dumps(DEFAULT_KWARGS), help="JSON kwargs for --env")
    p.add_argument(
        "--depths", default="0,1,4,8,16", help="turns before the checkpoint, comma-separated"
    )
    p.add_argument(
        "--action",
        default="action 1",
        help="the action played every turn (default 'action 1', a simulator move); '' = example actions",
    )
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for wrap_restore.json")
    args = p.parse_args(argv)
    depths = [int(x) for x in args.depths.split(",")]
    rows = measure(
        args.env,
        json_object("--env-kwargs", args.env_kwargs),
        depths,
        args.reps,
        args.seed,
        args.action or None,
    )
    print(format_rows(args.env, rows))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "wrap_restore.json").write_text(
            json.dumps({"env": args.env, "rows": rows}, indent=2)
        )
        write_provenance(out, vars(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
