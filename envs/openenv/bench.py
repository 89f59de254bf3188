"""`trace-gym bench openenv-restore`: restoring an OpenEnv-served env, by handle vs replay.

One trace env served over OpenEnv (`make_app`, uvicorn in a thread on a free localhost
port) and wrapped back (``trace/Wrapped-v0`` with ``env="openenv:<url>"``). For
checkpoints after k turns it times the median restore by the server's handle (one call)
and by replay (a pickled checkpoint: reset plus k steps over the wire), beside the env's
native in-process restore. Needs the `openenv` extra.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym

import trace_gym
from trace_gym.cli import Parser, parse_env_kwargs
from trace_gym.core import roundtrip
from trace_gym.optional import require

__all__ = ["main", "measure"]


@contextmanager
def _served(env_id: str, kwargs: dict[str, Any]) -> Iterator[str]:
    """`env_id` served over OpenEnv on a free localhost port, for the block."""
    from trace_gym.envs.openenv.server import make_app

    uvicorn = require("uvicorn", "openenv")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = make_app(env_id, kwargs)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def _median_ms(restore: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        restore()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _row(env: Any, native: Any, depth: int, action: str, reps: int) -> dict[str, float]:
    env.reset(options={"task": 0})
    native.reset(seed=0)
    for _ in range(depth):
        env.step(action)
        native.step(action)
    held, ck = [trace_gym.checkpoint(env)], native.checkpoint()
    portable = roundtrip(held[0])  # no handle: restores by replay

    def by_handle() -> None:
        trace_gym.restore(env, held[0])

    def by_replay() -> None:
        trace_gym.restore(env, portable)
        held[0] = trace_gym.checkpoint(env)  # the replay's reset let the handle go

    return {
        "depth": depth,
        "native_ms": _median_ms(lambda: native.restore(ck), reps),
        "handle_ms": _median_ms(by_handle, reps),
        "replay_ms": _median_ms(by_replay, reps),
    }


def measure(
    env_id: str, kwargs: dict[str, Any], depths: list[int], reps: int, action: str
) -> list[dict[str, float]]:
    """Rows of (depth, native_ms, handle_ms, replay_ms) for `env_id` served over OpenEnv."""
    native = trace_gym.unwrap(gym.make(env_id, **kwargs))
    with _served(env_id, kwargs) as url:
        env = gym.make("trace/Wrapped-v0", env=f"openenv:{url}", num_tasks=1, max_turns=10_000)
        try:
            return [_row(env, native, d, action, reps) for d in depths]
        finally:
            env.close()


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="trace-gym bench openenv-restore", description=__doc__.splitlines()[0])
    p.add_argument("--env", default="trace/Sim-v0", help="a registered trace-gym id")
    p.add_argument("--env-kwargs", default='{"preset": "bfcl", "num_tasks": 8}')
    p.add_argument("--depths", default="0,1,4,8,16", help="turns before the checkpoint")
    p.add_argument("--action", default="action 1", help="the action played every turn")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    depths = [int(x) for x in args.depths.split(",")]
    rows = measure(args.env, parse_env_kwargs(args.env_kwargs), depths, args.reps, args.action)
    print(f"restore over OpenEnv on {args.env} (median ms per restore, {args.reps} reps)")
    print(f"{'turns':>6} {'native':>8} {'handle':>8} {'replay':>8} {'replay/handle':>14}")
    for r in rows:
        ratio = r["replay_ms"] / r["handle_ms"]
        print(
            f"{r['depth']:>6} {r['native_ms']:>8.3f} {r['handle_ms']:>8.2f} "
            f"{r['replay_ms']:>8.2f} {ratio:>13.1f}x"
        )
    return 0
