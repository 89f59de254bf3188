"""`trace-gym bench alloc --ray --engines ...`: the engine pool and per-prompt expansion, measured.

Each setting runs the same steps on the Ray runner with an engine pool (`RayConfig.
num_engines`), env workers calling the engines for every turn (streaming: a turn is
requested the moment the previous one is back). With the simulator's policy, each
engine request waits a simulated latency drawn per conversation from its seed (fixed,
or log-normal with ``--latency-sigma`` for heavy tails) and an engine serves
``--engine-slots`` requests at once, so the figures measure scheduling - how busy the
engines are kept - rather than this machine's cores. Every setting's trees are checked
against the in-process reference (`BranchingRunner`, synchronous rounds, no latency).

Two comparisons come out of the same table:

- throughput by engine count (``ray_speedup``: the largest count over the smallest;
  env workers = engines unless ``--env-workers``), a concurrency check;
- ``--barrier global,per-prompt``: expansion the moment a prompt's own roots are done
  versus after every root of the step (same allocations, same trees); the step-wall
  ratio and the engines' idle share (1 - busy slot-seconds / (slots x wall)) per engine
  count. The barrier is per env worker, so ``--env-workers 1`` makes it global.

``--hf`` adds HF-engine rows: the tiny HF model (built locally) on real CPU engines
(``batch`` mode: queued requests form one batched forward). Their numerics depend on
the batch padding, so for them the table checks the allocations (root and replay
counts per prompt) and tree shapes against a local run instead of exact equality.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from trace_gym.bench.distributed import RENAMED, StepBenchFields, step_bench_fields

from trace_gym.budget import DEFAULT_REPLAY_COST
from trace_gym.compat import old_names, renamed_fields
from trace_gym.errors import ConfigError
from trace_gym.runner import BranchingRunner, RunnerConfig, runner_config
from trace_gym.scheduling import EXPANSIONS
from trace_gym.seeding import stable_seed

__all__ = ["EngineBenchConfig", "format_engine_bench", "run_engine_bench", "tree_shape"]


@renamed_fields(**RENAMED)
@dataclass
class EngineBenchConfig(StepBenchFields):
    """One engine-pool comparison (CLI: `trace-gym bench alloc --ray --engines ...`)."""

    engines: tuple[int, ...] = (1, 2)
    #: env workers per setting (None: as many as engines)
    env_workers: int | None = None
    barriers: tuple[str, ...] = ("per-prompt",)
    latency_s: float = 0.02
    latency_sigma: float = 0.0
    engine_slots: int = 8
    #: most live episodes per env worker (None: all of its prompts' episodes)
    max_batch: int | None = None
    hf: bool = False
    #: roots per step of the HF rows (the tiny model is slow on 2 cores)
    hf_roots: int = 16
    address: str = "local"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.root_budget < 2 or self.hf_roots < 2:
            raise ConfigError("need steps >= 1 and roots >= 2")
        if not self.engines or min(self.engines) < 1:
            raise ConfigError(f"engine counts must be >= 1, got {self.engines}")
        if self.env_workers is not None and self.env_workers < 1:
            raise ConfigError(f"--env-workers must be >= 1, got {self.env_workers}")
        bad = [b for b in self.barriers if b not in EXPANSIONS]
        if bad or not self.barriers:
            raise ConfigError(
                f"--barrier takes {' / '.join(EXPANSIONS)} (comma-separated), got {bad}"
            )
        if self.latency_s < 0 or self.latency_sigma < 0 or self.engine_slots < 1:
            raise ConfigError("latency and its sigma must be >= 0, engine slots >= 1")


def _pools(cfg: EngineBenchConfig, preset: str, roots: int) -> tuple[Any, list[list[str]]]:
    import gymnasium as gym

    n_cand = int(np.ceil(4 * roots * (1 + DEFAULT_REPLAY_COST * cfg.replays_per_root) / 8))
    kwargs = dict(preset=preset, num_tasks=max(64, 2 * n_cand), seed=cfg.seed)

    def factory():
        return gym.make("trace/Sim-v0", **kwargs)

    env = factory()
    ids = list(env.unwrapped.task_ids)
    env.close()
    rng = [
        np.random.default_rng(stable_seed("engine-bench", cfg.seed, s))
        for s in range(cfg.steps + 1)
    ]
    return factory, [[str(t) for t in r.choice(ids, n_cand, replace=False)] for r in rng]


def _runner_config(
    cfg: EngineBenchConfig, roots: int, expansion: str, max_batch: int | None
) -> RunnerConfig:
    return runner_config(cfg, root_budget=roots, max_batch=max_batch, expansion=expansion)


def _steps(runner: Any, pools: list[list[str]], engine_stats: Any = None) -> dict[str, Any]:
    """Run every step (the first untimed); trees, wall and the engines' busy time."""
    trees, walls, episodes, turns, busy0, reports = [], [], 0, 0, None, []
    try:
        for step, pool in enumerate(pools):
            if step == 1 and engine_stats is not None:
                busy0 = engine_stats()
            t0 = time.perf_counter()
            step_trees, rep = runner.run_step(step, pool)
            dt = time.perf_counter() - t0
            trees.append(step_trees)
            reports.append(rep)
            if step:
                walls.append(dt)
                episodes += rep.roots + rep.replays
                turns += rep.measured_turns
        idle = _idle_share(busy0, engine_stats(), sum(walls)) if engine_stats else None
    finally:
        runner.close()
    wall = sum(walls)
    return {
        "wall_s": wall,
        "step_wall_s": wall / len(walls) if walls else float("nan"),
        "episodes": episodes,
        "turns": turns,
        "episodes_per_s": episodes / wall if wall else float("nan"),
        "turns_per_s": turns / wall if wall else float("nan"),
        "idle_share": idle,
        "engine_rerouted": sum(getattr(r, "engine_rerouted", 0) for r in reports),
        "trees": trees,
    }


def _idle_share(before: list[dict] | None, after: list[dict], wall: float) -> float | None:
    if before is None or wall <= 0:
        return None
    by = {s["index"]: s for s in before}
    busy = sum(
        s["busy_s"] / s["capacity"] - by.get(s["index"], {}).get("busy_s", 0.0) / s["capacity"]
        for s in after
    )
    return float(max(0.0, 1.0 - busy / (len(after) * wall)))


def tree_shape(tree: Any) -> tuple:
    """A tree's allocation and shape: root count, replays, and every node's (parent, origin)."""
    return (
        tree.prompt_id,
        tree.info.get("root_count"),
        tree.info.get("replays"),
        tuple((n.parent, n.origin) for n in tree.nodes),
    )


def _ray_row(
    cfg: EngineBenchConfig,
    policy: Any,
    factory: Any,
    pools: list,
    *,
    engines: int,
    expansion: str,
    roots: int,
    hf: bool,
) -> dict[str, Any]:
    from trace_gym.alloc import make_allocator
    from trace_gym.distributed import RayConfig, RayRunner
    from trace_gym.predict import make_predictor

    workers = cfg.env_workers or engines
    rc = RayConfig(
        address=cfg.address,
        num_workers=workers,
        worker_cpus=0.5,
        num_engines=engines,
        engine_cpus=0.5,
        engine_slots=cfg.engine_slots,
        engine_batching="batch" if hf else "continuous",
        engine_latency_s=0.0 if hf else cfg.latency_s,
        engine_latency_sigma=0.0 if hf else cfg.latency_sigma,
    )
    runner = RayRunner(
        policy,
        factory,
        make_allocator(cfg.policy, m_max=cfg.m_max),
        make_predictor(cfg.predictor),
        _runner_config(cfg, roots, expansion, cfg.max_batch),
        rc,
    )
    row = _steps(runner, pools, lambda: runner._engines.stats())
    return {
        "kind": "hf" if hf else "sim",
        "barrier": expansion,
        "engines": engines,
        "workers": workers,
        **row,
    }


def _reference(
    cfg: EngineBenchConfig,
    policy: Any,
    factory: Any,
    pools: list,
    roots: int,
    max_batch: int | None,
):
    from trace_gym.alloc import make_allocator
    from trace_gym.predict import make_predictor

    runner = BranchingRunner(
        policy,
        factory,
        make_allocator(cfg.policy, m_max=cfg.m_max),
        make_predictor(cfg.predictor),
        _runner_config(cfg, roots, "per-prompt", max_batch),
    )
    return {
        "kind": "reference",
        "barrier": "per-prompt",
        "engines": 0,
        "workers": 0,
        **_steps(runner, pools),
    }


def _hf_policy() -> Any:
    from trace_gym.agents.tiny import default_test_config, load_tiny_policy

    from trace_gym.distributed import WorkerPolicy

    tiny = default_test_config(("trace/Sim-v0",), episodes_per_env=16, sft_steps=60)
    return WorkerPolicy(load_tiny_policy, tiny)


def _same(rows: list[dict[str, Any]], reference: dict[str, Any], exact: bool) -> None:
    ref = reference["trees"]
    for r in rows:
        trees = r.pop("trees")
        if exact:
            r["same_trees"] = [[t.to_dict() for t in s] for s in trees] == [
                [t.to_dict() for t in s] for s in ref
            ]
        r["same_shapes"] = [[tree_shape(t) for t in s] for s in trees] == [
            [tree_shape(t) for t in s] for s in ref
        ]


def _summary(cfg: EngineBenchConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    sim = [r for r in rows if r["kind"] == "sim"]
    first = [r for r in sim if r["barrier"] == cfg.barriers[-1]]
    lo, hi = min(first, key=lambda r: r["engines"]), max(first, key=lambda r: r["engines"])
    out: dict[str, Any] = {
        "ray_speedup": hi["episodes_per_s"] / lo["episodes_per_s"],
        "ray_speedup_settings": [
            f"{lo['engines']}+{lo['workers']}",
            f"{hi['engines']}+{hi['workers']}",
        ],
        "trees_identical": all(r["same_trees"] for r in sim),
    }
    if set(cfg.barriers) == set(EXPANSIONS):
        by = {(r["barrier"], r["engines"]): r for r in sim}
        out["barrier"] = {
            str(n): {
                "step_wall_ratio": by["global", n]["step_wall_s"]
                / by["per-prompt", n]["step_wall_s"],
                "idle_share_global": by["global", n]["idle_share"],
                "idle_share_per_prompt": by["per-prompt", n]["idle_share"],
            }
            for n in cfg.engines
        }
    hf = [r for r in rows if r["kind"] == "hf"]
    if hf:
        out["hf_shapes_identical"] = all(r["same_shapes"] for r in hf)
        out["hf_episodes_per_s"] = {
            f"{r['barrier']}/{r['engines']}": r["episodes_per_s"] for r in hf
        }
        if set(cfg.barriers) == set(EXPANSIONS):
            by_hf = {(r["barrier"], r["engines"]): r for r in hf}
            out["hf_barrier_step_wall_ratio"] = {
                str(n): by_hf["global", n]["step_wall_s"] / by_hf["per-prompt", n]["step_wall_s"]
                for n in cfg.engines
            }
    return out


def run_engine_bench(cfg: EngineBenchConfig) -> dict[str, Any]:
    """The in-process references, then every (barrier, engine count) setting on Ray."""
    from trace_gym.distributed import import_ray
    from trace_gym.sim import SimPolicy

    ray = import_ray()
    factory, pools = _pools(cfg, cfg.preset, cfg.root_budget)
    ref = _reference(cfg, SimPolicy(cfg.preset), factory, pools, cfg.root_budget, None)
    started = not ray.is_initialized()
    if started:
        need = max(cfg.engines) + (cfg.env_workers or max(cfg.engines))
        kw = {"num_cpus": need, "include_dashboard": False, "log_to_driver": False}
        ray.init(**kw) if cfg.address == "local" else ray.init(address=cfg.address)
    try:
        rows = [
            _ray_row(
                cfg,
                SimPolicy(cfg.preset),
                factory,
                pools,
                engines=n,
                expansion=b,
                roots=cfg.root_budget,
                hf=False,
            )
            for b in cfg.barriers
            for n in cfg.engines
        ]
        _same(rows, ref, exact=True)
        hf_rows: list[dict[str, Any]] = []
        if cfg.hf:
            hf_rows = _hf_rows(cfg)
    finally:
        if started:
            ray.shutdown()
    ref.pop("trees")
    rows = [ref, *rows, *hf_rows]
    return {"config": old_names(cfg), "rows": rows, **_summary(cfg, rows)}


def _hf_rows(cfg: EngineBenchConfig) -> list[dict[str, Any]]:
    policy = _hf_policy()
    factory, pools = _pools(cfg, cfg.preset, cfg.hf_roots)
    ref = _reference(cfg, policy.build(), factory, pools, cfg.hf_roots, cfg.max_batch)
    ref["kind"] = "hf-reference"
    rows = [
        _ray_row(cfg, policy, factory, pools, engines=n, expansion=b, roots=cfg.hf_roots, hf=True)
        for b in cfg.barriers
        for n in cfg.engines
    ]
    _same(rows, ref, exact=False)
    ref.pop("trees")
    return [ref, *rows]


def format_engine_bench(result: dict[str, Any]) -> str:
    c = result["config"]
    lat = f"{1000 * c['latency_s']:.0f} ms mean" + (
        f", log-normal sigma {c['latency_sigma']:g}" if c["latency_sigma"] else " fixed"
    )
    lines = [
        f"Engine pool: trace/Sim-v0 {c['preset']}, M={c['roots']} N={c['replays']:g}, allocator={c['policy']}, "
        f"{c['steps']} timed steps (+1 warm-up); simulated engine latency {lat} per turn, "
        f"{c['engine_slots']} slots per engine (a concurrency check)",
        "policy       barrier      engines+workers   step wall s   episodes/s   turns/s   engine idle   same trees",
    ]
    for r in result["rows"]:
        setting = "in-process" if r["engines"] == 0 else f"{r['engines']}+{r['workers']}"
        idle = "-" if r["idle_share"] is None else f"{100 * r['idle_share']:.0f}%"
        same = r.get("same_trees", r.get("same_shapes"))
        same_s = (
            "-"
            if same is None
            else ("yes" if same else "NO") + ("" if "same_trees" in r else " (shapes)")
        )
        lines.append(
            f"{r['kind']:<12} {r['barrier']:<12} {setting:<17} {r['step_wall_s']:11.2f}   "
            f"{r['episodes_per_s']:10.1f}   {r['turns_per_s']:7.1f}   {idle:>11}   {same_s}"
        )
    lines.append(
        f"ray_speedup {result['ray_speedup']:.2f}x ({' vs '.join(reversed(result['ray_speedup_settings']))} "
        f"engines+workers), trees_identical {result['trees_identical']}"
    )
    for n, b in result.get("barrier", {}).items():
        lines.append(
            f"{n} engine(s): global barrier / per-prompt step wall {b['step_wall_ratio']:.2f}x, engine idle "
            f"{100 * b['idle_share_global']:.0f}% vs {100 * b['idle_share_per_prompt']:.0f}%"
        )
    for n, ratio in result.get("hf_barrier_step_wall_ratio", {}).items():
        lines.append(
            f"HF engines, {n} engine(s): global barrier / per-prompt step wall {ratio:.2f}x"
        )
    return "\n".join(lines)


def config_from_alloc_args(args: Any) -> EngineBenchConfig:
    """`trace-gym bench alloc --ray --engines ...` flags -> an `EngineBenchConfig`."""
    return EngineBenchConfig(
        **step_bench_fields(args),
        engines=_ints(args.engines, "--engines"),
        env_workers=args.env_workers,
        barriers=tuple(b.strip() for b in args.barrier.split(",") if b.strip()),
        latency_s=args.latency,
        latency_sigma=args.latency_sigma,
        engine_slots=args.engine_slots,
        max_batch=args.max_batch,
        hf=args.hf,
        address=args.ray,
    )


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated integers, got {text!r}") from None


def main_from_alloc_args(args: Any) -> int:
    import json
    import sys

    from trace_gym.errors import DependencyNotInstalled

    try:
        result = run_engine_bench(config_from_alloc_args(args))
    except (ConfigError, DependencyNotInstalled) as e:
        print(f"trace-gym bench alloc --ray --engines: {e}", file=sys.stderr)
        return 2
    print(format_engine_bench(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0
