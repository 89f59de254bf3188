"""`trace-gym bench alloc --ray`: rollout throughput of the Ray runner, 1 vs 2 workers.

The policy is the simulator's, wrapped in `LatencyPolicy`: every ``generate`` call
sleeps a fixed time, the way a remote engine makes a caller wait, and each call takes at
most ``max_batch`` conversations (an engine's batch capacity). The figure therefore
measures how many calls the runner keeps in flight at once - the point of sharding -
rather than the speed of this machine's cores. The same steps run in-process
(`BranchingRunner`, the reference), then on Ray with each worker count, side by side;
the table also says whether every setting produced exactly the reference trees.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trace_gym.budget import DEFAULT_REPLAY_COST
from trace_gym.compat import old_names, renamed_fields
from trace_gym.errors import ConfigError
from trace_gym.runner import BranchingRunner, runner_config
from trace_gym.seeding import stable_seed

__all__ = ["RayBenchConfig", "format_ray_bench", "main_from_alloc_args", "run_ray_bench"]


#: the runner settings' names before the benchmarks took the runner's (``roots=`` still works)
RENAMED = {"roots": "root_budget", "replays": "replays_per_root"}


@renamed_fields(**RENAMED)
@dataclass
class StepBenchFields:
    """What the Ray benchmarks share: the simulator preset, the steps and their budget."""

    preset: str = "math"
    #: timed steps per setting (after one untimed warm-up step)
    steps: int = 3
    #: M (``--roots``)
    root_budget: int = 64
    #: N (``--replays``)
    replays_per_root: float = 2.0
    policy: str = "trace"
    predictor: str = "features"
    m_max: int = 16


@renamed_fields(**RENAMED)
@dataclass
class RayBenchConfig(StepBenchFields):
    """One throughput comparison (CLI: `trace-gym bench alloc --ray ...`)."""

    #: most conversations per policy call (the simulated engine's batch capacity)
    max_batch: int = 16
    #: seconds every policy call waits
    latency_s: float = 0.02
    workers: tuple[int, ...] = (1, 2)
    address: str = "local"
    #: candidates per step (default: 4x the prompts a group-of-8 policy would take)
    candidates: int | None = None
    seed: int = 0
    #: CPUs of a local Ray instance (None: one per worker of the largest setting)
    num_cpus: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.root_budget < 2 or self.max_batch < 1:
            raise ConfigError("need steps >= 1, roots >= 2 and max_batch >= 1")
        if self.latency_s < 0:
            raise ConfigError(f"latency must be >= 0 seconds, got {self.latency_s}")
        if not self.workers or min(self.workers) < 1:
            raise ConfigError(f"worker counts must be >= 1, got {self.workers}")


def _setup(cfg: RayBenchConfig):
    import gymnasium as gym

    from trace_gym.sim import PRESETS

    n_cand = cfg.candidates or int(
        np.ceil(4 * cfg.root_budget * (1 + DEFAULT_REPLAY_COST * cfg.replays_per_root) / 8)
    )
    num_tasks = max(PRESETS[cfg.preset].num_tasks, 2 * n_cand)
    kwargs = dict(preset=cfg.preset, num_tasks=num_tasks, seed=cfg.seed)

    def factory():
        return gym.make("trace/Sim-v0", **kwargs)

    env = factory()
    ids = list(env.unwrapped.task_ids)
    env.close()
    pools = [
        [
            str(t)
            for t in np.random.default_rng(stable_seed("ray-bench", cfg.seed, s)).choice(
                ids, n_cand, replace=False
            )
        ]
        for s in range(cfg.steps + 1)
    ]
    return factory, pools


def _run(cfg: RayBenchConfig, factory, pools, workers: int | None) -> dict[str, Any]:
    from trace_gym.alloc import make_allocator
    from trace_gym.distributed.testing import LatencyPolicy
    from trace_gym.predict import make_predictor
    from trace_gym.sim import SimPolicy

    policy = LatencyPolicy(SimPolicy(cfg.preset), cfg.latency_s)
    rcfg = runner_config(cfg)  # root_budget, replays_per_root, m_max, max_batch, seed
    args = (
        policy,
        factory,
        make_allocator(cfg.policy, m_max=cfg.m_max),
        make_predictor(cfg.predictor),
        rcfg,
    )
    if workers is None:
        runner: BranchingRunner = BranchingRunner(*args)
    else:
        from trace_gym.distributed import RayConfig, RayRunner

        runner = RayRunner(*args, RayConfig(address=cfg.address, num_workers=workers))
    trees, episodes, turns, calls, wall = [], 0, 0, 0, 0.0
    try:
        for step, pool in enumerate(pools):
            t0 = time.perf_counter()
            step_trees, rep = runner.run_step(step, pool)
            dt = time.perf_counter() - t0
            trees.append([t.to_dict() for t in step_trees])
            if step == 0:
                continue  # warm-up: imports, first env instances
            wall += dt
            episodes += rep.roots + rep.replays
            turns += rep.measured_turns
            calls += rep.policy_calls
    finally:
        runner.close()
    return {
        "workers": workers,
        "wall_s": wall,
        "episodes": episodes,
        "turns": turns,
        "policy_calls": calls,
        "episodes_per_s": episodes / wall if wall else float("nan"),
        "turns_per_s": turns / wall if wall else float("nan"),
        "trees": trees,
    }


def run_ray_bench(cfg: RayBenchConfig) -> dict[str, Any]:
    """The in-process reference, then the Ray runner with each worker count."""
    from trace_gym.distributed import import_ray

    ray = import_ray()
    factory, pools = _setup(cfg)
    rows = [_run(cfg, factory, pools, None)]
    started = False
    if not ray.is_initialized():
        if cfg.address == "local":
            ncpu = cfg.num_cpus or max(2, max(cfg.workers))
            ray.init(num_cpus=ncpu, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=cfg.address)
        started = True
    try:
        rows += [_run(cfg, factory, pools, n) for n in cfg.workers]
    finally:
        if started:
            ray.shutdown()
    reference = rows[0]["trees"]
    base = next((r for r in rows if r["workers"] == min(cfg.workers)), rows[1])
    for r in rows:
        r["same_trees"] = r.pop("trees") == reference
        r["speedup_vs_1"] = r["episodes_per_s"] / base["episodes_per_s"]
    return {"config": {k: v for k, v in old_names(cfg).items() if k != "extra"}, "rows": rows}


def format_ray_bench(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"Ray runner throughput: trace/Sim-v0 {c['preset']}, M={c['roots']} N={c['replays']:g}, "
        f"allocator={c['policy']}, {c['steps']} timed steps (+1 warm-up), "
        f"policy latency {1000 * c['latency_s']:.0f} ms per call, max_batch={c['max_batch']}",
        "runner              wall s   episodes/s   turns/s   policy calls   vs 1 worker   same trees",
    ]
    for r in result["rows"]:
        name = "local (in-process)" if r["workers"] is None else f"ray, {r['workers']} worker(s)"
        lines.append(
            f"{name:<18} {r['wall_s']:7.2f}   {r['episodes_per_s']:10.1f}   {r['turns_per_s']:7.1f}"
            f"   {r['policy_calls']:12d}   {r['speedup_vs_1']:10.2f}x   {'yes' if r['same_trees'] else 'NO'}"
        )
    return "\n".join(lines)


def step_bench_fields(args: Any) -> dict[str, Any]:
    """The `StepBenchFields` of `trace-gym bench alloc` flags (the first policy named, else trace)."""
    policies = [p.strip() for p in (args.policies or "").split(",") if p.strip()]
    return {
        "preset": args.preset,
        "steps": args.ray_steps,
        "root_budget": args.root_budget,
        "replays_per_root": args.replays_per_root,
        "policy": policies[0] if policies else "trace",
        "predictor": args.predictor,
        "m_max": args.m_max,
    }


def config_from_alloc_args(args: Any, workers: Sequence[int]) -> RayBenchConfig:
    """`trace-gym bench alloc` flags -> a `RayBenchConfig` (used by ``--ray``)."""
    return RayBenchConfig(
        **step_bench_fields(args),
        max_batch=args.max_batch or 16,
        latency_s=args.latency,
        workers=tuple(workers),
        address=args.ray,
    )


def main_from_alloc_args(args: Any) -> int:
    """Run the comparison for `trace-gym bench alloc --ray` and print the table."""
    import json
    import sys

    from trace_gym.errors import DependencyNotInstalled

    try:
        workers = [int(x) for x in str(args.ray_workers).split(",") if x.strip()]
        result = run_ray_bench(config_from_alloc_args(args, workers))
    except (ConfigError, DependencyNotInstalled, ValueError) as e:
        print(f"trace-gym bench alloc --ray: {e}", file=sys.stderr)
        return 2
    print(format_ray_bench(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0
