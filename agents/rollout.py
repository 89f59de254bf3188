"""`trace-gym rollout`: collect rollout trees with a policy and an allocator, as JSONL.

Runs `trace_gym.runner.BranchingRunner` for ``--steps`` steps over a candidate pool of
tasks (``--tasks`` per step, drawn in order, cycling), with the allocator and predictor
named on the command line, and appends each step's trees to ``--out`` (the versioned
tree format of `trace_gym.tree.save_trees`; ``.gz`` compresses). A progress bar counts
steps; one summary line per step reports budget, effective ratio and measured cost.
``--ray [ADDRESS]`` collects the same trees on Ray rollout workers (`trace_gym.distributed`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trace_gym.cli import Parser

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from trace_gym.agents.evaluate import add_common_args

    from trace_gym.runner import add_runner_args

    p = Parser(prog="trace-gym rollout", description=main.__doc__)
    add_common_args(p)
    p.add_argument(
        "--allocator",
        default="trace",
        help="allocation policy: a name of trace_gym.alloc.ALLOCATORS, an installed entry point or module:Class",
    )
    p.add_argument(
        "--predictor",
        default="features",
        help='predictor name (trace_gym.predict.PREDICTORS), a "module:Class" entry point, or none',
    )
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--tasks", type=int, default=16, help="candidate prompts per step")
    add_runner_args(
        p, root_budget=32, replays_per_root=2.0, m_max=16
    )  # --seed, --max-batch: common
    p.add_argument("--group-size", dest="group_size", type=int, default=8)
    p.add_argument("--out", required=True, help="trees JSONL path (.gz to compress)")
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="run on Ray rollout workers (local instance, or a cluster: auto, host:port)",
    )
    p.add_argument(
        "--ray-workers", dest="ray_workers", type=int, default=2, help="Ray rollout workers"
    )
    return p


def _check_args(args: argparse.Namespace) -> None:
    """Refuse bad values before anything is built (one `ConfigError` line each, exit 2)."""
    from trace_gym.alloc import allocator_class
    from trace_gym.errors import ConfigError
    from trace_gym.registration import check_env_id
    from trace_gym.runner import runner_config

    least = {
        "--steps": (args.steps, 0),
        "--tasks": (args.tasks, 1),
        "--group-size": (args.group_size, 2),
        "--ray-workers": (args.ray_workers, 1),
        "--limit": (1 if args.limit is None else args.limit, 1),
    }
    for flag, (value, low) in least.items():
        if value < low:
            raise ConfigError(f"{flag} must be >= {low}, got {value}")
    runner_config(args)  # --roots, --replays, --m-max, --max-batch: the runner's own rules
    allocator_class(args.allocator)  # a registered name, an entry point or "module:Class"
    if args.predictor != "none":
        from trace_gym.predict import predictor_entry_point

        predictor_entry_point(args.predictor)
    check_env_id(args.env)
    from trace_gym.agents.evaluate import parse_env_kwargs

    parse_env_kwargs(args.env_kwargs)  # validated here; the env factory parses it again
    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.open("w").close()  # fails now, not after the first step's rollouts
    except OSError as e:
        raise ConfigError(f"cannot write --out {out}: {e.strerror or e}") from e


def _runner(args: argparse.Namespace, factory: Any, env: Any) -> Any:
    """The (local or Ray) runner the command line asks for."""
    from trace_gym.agents.evaluate import policy_from

    from trace_gym.alloc import make_allocator
    from trace_gym.distributed import make_runner
    from trace_gym.predict import make_predictor
    from trace_gym.runner import runner_config

    policy = policy_from(args, env)  # before the predictor, which may seed torch
    predictor = None if args.predictor == "none" else make_predictor(args.predictor)
    return make_runner(
        policy,
        factory,
        make_allocator(args.allocator, m_max=args.m_max, group_size=args.group_size),
        predictor,
        runner_config(args),
        ray_address=args.ray,
        num_workers=args.ray_workers,
        sync_policy=False,
    )


def _summary(step: int, res: Any) -> dict[str, Any]:
    """The one JSON line printed per step."""
    from trace_gym.tree import batch_metrics

    m, rep = batch_metrics(res.trees), res.report
    return {
        "step": step,
        "trees": len(res.trees),
        "roots": rep.roots,
        "replays": rep.replays,
        "effective_ratio": round(m["effective_ratio"], 4),
        "success_rate": round(m["success_rate"], 4),
        "turns": m["turns"],
        "tokens": m["tokens"],
        "failed_branches": m["failed_branches"],
    }


def main(argv: list[str]) -> int:
    """Collect rollout trees and write them as JSONL."""
    from trace_gym.agents.evaluate import env_factory_from

    from trace_gym.tree import save_trees

    args = _parser().parse_args(argv)
    _check_args(args)
    factory = env_factory_from(args)
    env = factory()
    ids = list(env.unwrapped.task_ids)[: args.limit] if args.limit else list(env.unwrapped.task_ids)
    runner = _runner(args, factory, env)
    out = Path(args.out)
    out.unlink()  # created empty by _check_args; steps append to it
    steps = range(args.steps)
    if not args.no_progress:
        from tqdm import tqdm

        steps = tqdm(steps, desc="steps", file=sys.stderr)
    try:
        for step in steps:
            start = (step * args.tasks) % len(ids)
            cands = [ids[(start + i) % len(ids)] for i in range(min(args.tasks, len(ids)))]
            res = runner.run_step(step, cands)
            save_trees(res.trees, out, append=True)
            print(json.dumps(_summary(step, res)))
    finally:
        runner.close()
        env.close()
    print(f"wrote {out}")
    return 0
