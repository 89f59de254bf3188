"""`trace-gym bench replay-cost`: what a replay from each depth costs, measured, vs a full rollout.

The paper prices a mid-trajectory replay at half a rollout (`trace_gym.budget.Budget`'s
``replay_cost = 0.5``). This bench measures it: per env (Sim, Math, HotpotQA) and engine
(vLLM with prefix caching, HF transformers), one full rollout per task, then a replay
from every depth d with the env restored from its checkpoint and the prefix's exact
tokens resumed, to the episode's end. Reported per depth, replay over full rollout:
prefill tokens handed to the engine, prefill tokens actually computed (the prefix cache
serves the rest), decode tokens, and wall time (**CPU / tiny-model figures**: they do
not transfer to a GPU). ``prefill_saved_share`` is the share of prefill tokens the cache
served. The measurement lives in `trace_gym.agents.replay_measure` (reached by its
"module:attr" string: the core never imports agents).

The default accounting stays 0.5; `table_cost` turns a measured table into the
``Budget.cost(depth, rollout_turns)`` function a ``cost_aware`` allocator is charged with.
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_gym.budget import DEFAULT_REPLAY_COST
from trace_gym.cli import Parser
from trace_gym.errors import ConfigError

__all__ = ["main", "run", "table_cost"]

ENVS = ("trace/Sim-v0", "trace/Math-v0", "trace/HotpotQA-v0")


def table_cost(
    table: dict[str, dict[str, float]], key: str = "decode", default: float = DEFAULT_REPLAY_COST
) -> Callable[[int, int], float]:
    """A ``Budget.cost`` from a measured ``replay_cost_by_depth`` table (one env, one engine).

    ``Budget(..., cost=table_cost(t))`` charges a replay from depth d the measured ratio
    ``t[str(d)][key]``; depths the table lacks are charged `default`.
    """
    by_depth = {int(d): float(row[key]) for d, row in table.items() if row.get(key) is not None}
    if any(v < 0 for v in by_depth.values()):
        raise ConfigError(f"a measured replay cost is negative: {by_depth}")

    def cost(depth: int, rollout_turns: int) -> float:
        return by_depth.get(int(depth), default)

    return cost


def _policy(engine: str, model_dir: Path, sampling: dict[str, Any]) -> Any:
    from trace_gym.agents import engines as eng

    if engine == "hf":
        return eng.hf_policy(model_dir, **sampling)
    if engine == "vllm":
        return eng.vllm_policy(model_dir, **sampling)
    raise ConfigError(f"unknown engine {engine!r}; choose hf or vllm")


def run(
    *,
    engines: tuple[str, ...] = ("vllm", "hf"),
    envs: tuple[str, ...] = ENVS,
    tasks: int = 4,
    max_turns: int = 6,
    replays: int = 1,
    max_new_tokens: int = 48,
    seed: int = 0,
    model_dir: str | None = None,
) -> dict[str, Any]:
    """Measure every (engine, env); returns the figures as a dict."""
    from trace_gym.agents import engines as eng

    path = Path(model_dir) if model_dir else eng.bench_model_dir()
    sampling = dict(temperature=1.0, max_new_tokens=max_new_tokens)
    from trace_gym.agents.replay_measure import measure_replay_cost as measure

    by_depth: dict[str, dict[str, Any]] = {}
    saved: dict[str, dict[str, float]] = {}
    extra: dict[str, dict[str, Any]] = {}
    for engine in engines:
        policy = _policy(engine, path, sampling)
        for env_id in envs:
            r = measure(
                policy, env_id, list(range(tasks)), seed=seed, max_turns=max_turns, replays=replays
            )
            by_depth.setdefault(env_id, {})[engine] = r["replay_cost_by_depth"]
            saved.setdefault(env_id, {})[engine] = r["prefill_saved_share"]
            extra.setdefault(env_id, {})[engine] = {
                k: r[k] for k in r if k not in ("replay_cost_by_depth", "prefill_saved_share")
            }
        del policy
    return {
        "replay_cost_by_depth": by_depth,
        "prefill_saved_share": saved,
        "totals": extra,
        "accounted_replay_cost": DEFAULT_REPLAY_COST,
        "model_dir": str(path),
        "tasks": tasks,
        "max_turns": max_turns,
        "replays_per_depth": replays,
        "max_new_tokens": max_new_tokens,
        "wall_note": "seconds ratios are CPU / tiny-model figures; they do not transfer to a GPU",
        "machine": platform.machine(),
    }


def _print(r: dict[str, Any]) -> None:
    print(
        "replay / full rollout, by depth (prefill handed | prefill computed | decode | wall CPU/tiny)"
    )
    for env_id, engines in r["replay_cost_by_depth"].items():
        for engine, table in engines.items():
            print(
                f"{env_id} [{engine}]  prefill saved by cache: {r['prefill_saved_share'][env_id][engine]:.1%}"
            )
            for d, row in table.items():
                print(
                    f"  depth {d:>2}: {row.get('prefill', 0):.2f} | {row.get('prefill_computed', 0):.2f} | "
                    f"{row.get('decode', 0):.2f} | {row.get('seconds', 0):.2f}   ({row['replays']} replays)"
                )


def main(argv: list[str]) -> int:
    """Entry point of `trace-gym bench replay-cost [--json PATH]`."""
    p = Parser(
        prog="trace-gym bench replay-cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    p.add_argument("--engines", default="vllm,hf", help="comma-separated: vllm, hf")
    p.add_argument("--envs", default=",".join(ENVS), help="comma-separated env ids")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--replays", type=int, default=1, help="replays per depth per task")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument(
        "--model", default=None, help="model directory (default: the cached tiny bench model)"
    )
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    r = run(
        engines=tuple(a.engines.split(",")),
        envs=tuple(a.envs.split(",")),
        tasks=a.tasks,
        max_turns=a.max_turns,
        replays=a.replays,
        max_new_tokens=a.max_new_tokens,
        seed=a.seed,
        model_dir=a.model,
    )
    _print(r)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(r, indent=2) + "\n")
        print(f"wrote {a.json}")
    return 0
