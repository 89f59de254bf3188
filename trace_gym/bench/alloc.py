"""`trace-gym bench alloc`: every allocation policy on one task pool at equal accounted cost.

For each seed, each policy runs S steps of a `BranchingRunner` with its own predictor
learning online. Every policy sees the same candidate pool each step (sampled from
(seed, step), several times more prompts than a fixed-group policy would take) and
spends the same accounted budget: tree policies M roots + N*M replays at half a
trajectory each, flat policies (``branching = False``) M (1 + N/2) roots and no
replays. The table reports effective ratio next to the counts that keep it honest
(mixed groups, contrastive pairs per unit of accounted and measured cost, distinct
prompts), predictor quality by depth, the predictor's share of wall time and the gap
to the oracle (the TRACE rule on exact values).

The simulator (``--preset``) is the default task source; ``--env ID --policy scripted``
runs any registered env with its scripted policy (`trace_gym.agents.scripted`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.bench.report import (
    StepRecord,
    format_quality,
    format_table,
    summarize,
    write_outputs,
)
from trace_gym.bench.report_html import write_index
from trace_gym.errors import ConfigError, DependencyNotInstalled, unknown
from trace_gym.optional import require
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.seeding import stable_seed
from trace_gym.tree import RolloutTree, batch_metrics

__all__ = ["BenchConfig", "BenchResult", "main", "run_bench"]

log = logging.getLogger(__name__)

#: table order; policies the alloc package does not define are skipped
POLICY_ORDER = (
    "grpo",
    "pcl",
    "greso",
    "knapsack",
    "treepo",
    "trace_roots_random_prefixes",
    "uniform_roots_trace_prefixes",
    "trace",
    "oracle",
)
PRESET_NAMES = ("math", "hotpotqa", "bfcl")
#: the scripted-policy registry (`make_env`, `make_scripted`), named by string: the core
#: does not import the agents package
SCRIPTED_POLICIES = "trace_gym.agents.scripted"


@dataclass
class BenchConfig:
    """One benchmark run (see `main` for the command-line flags)."""

    preset: str = "math"
    drift: bool = False
    steps: int = 10
    #: M root rollouts per step (tree policies)
    roots: int = 256
    #: N replays per root (tree policies); flat policies get M (1 + N/2) roots instead
    replays: float = 2.0
    seeds: int = 1
    #: allocation policies (empty: every registered one)
    policies: tuple[str, ...] = ()
    predictor: str = "bayes"
    #: fixed group size of uniform/flat policies
    group_size: int = 8
    m_max: int = 16
    #: candidates per step = pool_factor * (prompts a fixed-group policy takes)
    pool_factor: float = 4.0
    #: task pool size (default: the preset's, at least twice the candidates per step)
    num_tasks: int | None = None
    max_batch: int | None = None
    #: a registered env id instead of the simulator (with `policy="scripted"`)
    env_id: str | None = None
    policy: str = "sim"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.env_id is None and self.preset not in PRESET_NAMES:
            raise ConfigError(
                f"--preset must be one of {', '.join(PRESET_NAMES)}, got {self.preset!r}"
            )
        if self.env_id is not None and self.policy != "scripted":
            raise ConfigError(
                "--env needs --policy scripted (the only generic policy the harness can build)"
            )
        if self.steps < 1 or self.roots < 2 or self.seeds < 1:
            raise ConfigError("need --steps >= 1, --roots >= 2 and --seeds >= 1")
        if self.replays < 0 or self.group_size < 2 or self.m_max < 2 or self.pool_factor <= 0:
            raise ConfigError(
                "need --replays >= 0, --group-size >= 2, --m-max >= 2, --pool-factor > 0"
            )

    @property
    def accounted_budget(self) -> float:
        """M (1 + N/2) trajectory-equivalents per step, for every policy."""
        return self.roots * (1.0 + 0.5 * self.replays)

    @property
    def flat_roots(self) -> int:
        return int(round(self.accounted_budget))

    @property
    def candidates_per_step(self) -> int:
        return int(math.ceil(self.pool_factor * self.accounted_budget / self.group_size))


@dataclass
class BenchResult:
    config: BenchConfig
    summary: dict[str, Any]
    records: list[StepRecord]


# ---------------------------------------------------------------------- task sources
@dataclass
class _Source:
    env_factory: Callable[[], Any]
    make_policy: Callable[[], Any]
    task_ids: list[str]
    has_true_value: bool
    label: str


def _sim_source(cfg: BenchConfig, seed: int) -> _Source:
    import gymnasium as gym

    from trace_gym.sim import PRESETS, SimPolicy

    n = cfg.num_tasks or max(PRESETS[cfg.preset].num_tasks, 2 * cfg.candidates_per_step)
    kwargs = dict(preset=cfg.preset, num_tasks=n, seed=seed, drift=cfg.drift)

    def factory():
        return gym.make("trace/Sim-v0", **kwargs)

    env = factory()
    ids = list(env.unwrapped.task_ids)
    env.close()
    label = f"trace/Sim-v0 preset={cfg.preset} tasks={n}" + (" drift" if cfg.drift else "")
    return _Source(factory, lambda: SimPolicy(cfg.preset, drift=cfg.drift), ids, True, label)


def _env_source(cfg: BenchConfig, seed: int) -> _Source:
    scripted = require(
        SCRIPTED_POLICIES,
        "pip install -e . (the agents package)",
        what=f"{SCRIPTED_POLICIES} (scripted policies)",
    )
    make_env, make_scripted = scripted.make_env, scripted.make_scripted
    env_id = cfg.env_id
    assert env_id is not None

    def factory():
        return make_env(env_id, **cfg.env_kwargs)

    try:
        env = factory()
    except (ImportError, ConfigError):
        raise
    except Exception as e:  # gymnasium's NameNotFound and friends
        raise ConfigError(
            f"cannot make env {env_id!r} ({e}); `trace-gym envs` lists the ids"
        ) from e
    base = env.unwrapped
    ids = list(base.task_ids)
    has_tv = callable(getattr(base, "true_value", None))
    try:
        make_scripted(env_id, env=env)  # fail early with the list of known ids
    except ConfigError as e:
        raise ConfigError(f"no scripted policy for {env_id!r}: {e}") from e
    return _Source(
        factory,
        lambda: make_scripted(env_id, env=factory()),
        ids,
        has_tv,
        f"{env_id} (scripted policy)",
    )


# ---------------------------------------------------------------------- one run
def _policies(cfg: BenchConfig, has_true_value: bool) -> list[str]:
    from trace_gym.alloc import ALLOCATORS

    names = list(cfg.policies) or [p for p in POLICY_ORDER if p in ALLOCATORS] + sorted(
        p for p in ALLOCATORS if p not in POLICY_ORDER
    )
    for name in names:
        if name not in ALLOCATORS:
            raise unknown("allocation policy", name, ALLOCATORS)
    if not has_true_value and "oracle" in names:
        log.warning("dropping 'oracle': this env has no exact true values")
        names.remove("oracle")
    return names


def _record(
    name: str, seed: int, step: int, candidates: int, trees: list[RolloutTree], report
) -> StepRecord:
    m = batch_metrics(trees)
    scored = []
    for t in trees:
        for n in t.nodes:
            if n.value is not None and n.target is not None:
                tv = math.nan if n.true_value is None else float(n.true_value)
                scored.append((n.depth, float(n.value), float(n.target), tv))
    return StepRecord(
        policy=name,
        seed=seed,
        step=step,
        effective_ratio=m["effective_ratio"] if trees else 0.0,
        mixed_groups=int(m["mixed_groups"]),
        mixed_anchors=int(m["mixed_anchors"]),
        contrastive_pairs=int(m["contrastive_pairs"]),
        cost=report.accounted_cost,
        measured_turns=report.measured_turns,
        tokens=report.generated_tokens,
        distinct_prompts=len(trees),
        candidates=candidates,
        roots=report.roots,
        replays=report.replays,
        replays_unspent=report.replays_unspent,
        failed_branches=report.failed_branches,
        wall_s=report.wall_s,
        time_s=dict(report.time_s),
        replays_by_depth=dict(report.replays_by_depth),
        scored=scored,
        prompt_ids=[t.prompt_id for t in trees],
    )


def run_bench(cfg: BenchConfig) -> BenchResult:
    """Run every policy on every seed; returns the summary and per-step records."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a core dependency
        tqdm = None
    records: list[StepRecord] = []
    bar = None
    for seed in range(cfg.seeds):
        source = _env_source(cfg, seed) if cfg.env_id else _sim_source(cfg, seed)
        names = _policies(cfg, source.has_true_value)
        if bar is None and tqdm is not None:
            total = cfg.seeds * len(names) * cfg.steps
            bar = tqdm(
                total=total,
                desc=f"bench alloc {cfg.env_id or cfg.preset}",
                file=sys.stderr,
                disable=not cfg.progress,
            )
        pools = candidate_pools(cfg, source, seed)
        for name in names:
            for step, trees, report in run_policy(cfg, source, name, seed, pools):
                record = _record(name, seed, step, len(pools[step]), trees, report)
                records.append(record)
                if bar is not None:
                    bar.set_postfix_str(f"{name} eff={record.effective_ratio:.0%}")
                    bar.update(1)
    if bar is not None:
        bar.close()
    summary = summarize(records)
    summary["config"] = _config_dict(cfg)
    summary["goals"] = goals(summary, cfg)
    return BenchResult(cfg, summary, records)


def candidate_pools(cfg: BenchConfig, source: _Source, seed: int) -> list[list[Any]]:
    """Each step's candidate pool, shared by every policy of one seed."""
    n_cand = min(cfg.candidates_per_step, len(source.task_ids))
    return [
        list(
            np.random.default_rng(stable_seed("bench-candidates", seed, step)).choice(
                source.task_ids, n_cand, replace=False
            )
        )
        for step in range(cfg.steps)
    ]


def run_policy(
    cfg: BenchConfig, source: _Source, name: str, seed: int, pools: list[list[Any]]
) -> Iterator[tuple[int, list[RolloutTree], Any]]:
    """(step, trees, report) of one policy over the shared pools, at the harness's equal cost."""
    from trace_gym.alloc import make_allocator
    from trace_gym.predict import make_predictor

    allocator = make_allocator(name, m_max=cfg.m_max, group_size=cfg.group_size)
    branching = bool(getattr(allocator, "branching", True))
    rcfg = RunnerConfig(
        root_budget=cfg.roots if branching else cfg.flat_roots,
        replays_per_root=cfg.replays if branching else 0.0,
        m_max=cfg.m_max,
        max_batch=cfg.max_batch,
        seed=seed,
    )
    runner = BranchingRunner(
        source.make_policy(), source.env_factory, allocator, make_predictor(cfg.predictor), rcfg
    )
    try:
        for step, pool in enumerate(pools):
            trees, report = runner.run_step(step, [str(t) for t in pool])
            yield step, trees, report
    finally:
        runner.close()


def _config_dict(cfg: BenchConfig) -> dict[str, Any]:
    d = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__ if k != "progress"}
    d["policies"] = list(cfg.policies)
    d.update(
        accounted_budget=cfg.accounted_budget,
        flat_roots=cfg.flat_roots,
        candidates_per_step=cfg.candidates_per_step,
    )
    return d


# ---------------------------------------------------------------------- goals
def goals(summary: dict[str, Any], cfg: BenchConfig) -> list[dict[str, Any]]:
    """The issue's goals, measured (reported, never asserted)."""
    p = summary["policies"]
    out: list[dict[str, Any]] = []

    def add(goal: str, measured: str, met: bool | None) -> None:
        out.append({"goal": goal, "measured": measured, "met": met})

    if "trace" in p and "grpo" in p:
        t, g = p["trace"], p["grpo"]
        ratio = t["effective_ratio"] / g["effective_ratio"] if g["effective_ratio"] else math.inf
        add(
            "TRACE effective ratio >= 2x GRPO's (paper math: 26.8% -> 60.6%)",
            f"{t['effective_ratio']:.1%} vs {g['effective_ratio']:.1%} ({ratio:.2f}x)",
            ratio >= 2.0,
        )
        add(
            "TRACE mixed groups per measured turn >= GRPO's",
            f"{t['mixed_per_kturn']:.2f} vs {g['mixed_per_kturn']:.2f} per 1k turns",
            t["mixed_per_kturn"] >= g["mixed_per_kturn"],
        )
    if "trace" in p and "treepo" in p:
        d = p["trace"]["effective_ratio"] - p["treepo"]["effective_ratio"]
        add(
            "TRACE >= 8 points above random branching (paper hotpotqa 1024x2: 42.8% -> 52.3%)",
            f"{p['trace']['effective_ratio']:.1%} vs {p['treepo']['effective_ratio']:.1%} ({100 * d:+.1f} points)",
            d >= 0.08,
        )
    if "trace" in p and "oracle" in p:
        t = p["trace"]
        add(
            "learned-predictor TRACE >= 90% of the oracle (effective ratio and mixed groups)",
            f"{t['oracle_gap']:.0%} of effective ratio, {t['oracle_gap_mixed']:.0%} of mixed groups",
            t["oracle_gap"] >= 0.9 and t["oracle_gap_mixed"] >= 0.9,
        )
    order = ["trace", "trace_roots_random_prefixes", "uniform_roots_trace_prefixes", "treepo"]
    if all(k in p for k in order):
        e = {k: p[k]["effective_ratio"] for k in order}
        met = (
            e["trace"] > max(e[order[1]], e[order[2]])
            and min(e[order[1]], e[order[2]]) > e["treepo"]
        )
        add(
            "ablation: adaptive/adaptive > each single stage > random/uniform (paper: 52.3 > 49.1, 47.3 > 42.8)",
            ", ".join(f"{k}={v:.1%}" for k, v in e.items()),
            met,
        )
    if "trace" in p:
        t = p["trace"]
        add(
            "candidates skipped and rollouts per selected prompt (paper bfcl: 65-71% skipped, 5-7 rollouts)",
            f"{t['skipped_share']:.0%} skipped, {t['rollouts_per_prompt']:.1f} rollouts per selected prompt",
            None,
        )
    return out


def format_goals(items: Sequence[dict[str, Any]]) -> str:
    mark = {True: "met", False: "NOT met", None: "report"}
    return "\n".join(f"  [{mark[g['met']]}] {g['goal']}: {g['measured']}" for g in items)


# ---------------------------------------------------------------------- budget shapes
def parse_shapes(text: str) -> list[tuple[int, float]]:
    """``"1024x2,512x6"`` -> [(1024, 2.0), (512, 6.0)]."""
    out = []
    for part in text.split(","):
        try:
            m, n = part.lower().split("x")
            out.append((int(m), float(n)))
        except ValueError as e:
            raise ConfigError(
                f"bad --shapes entry {part!r}; write ROOTSxREPLAYS, e.g. 1024x2,512x6"
            ) from e
    return out


def run_shapes(
    cfg: BenchConfig,
    shapes: Sequence[tuple[int, float]],
    policies: Sequence[str],
    reuse: BenchResult | None = None,
) -> dict[str, Any]:
    """The same policies at several (M, N) budget shapes; returns shape -> summary rows.

    A shape equal to `reuse`'s (M, N) takes its rows from `reuse` instead of rerunning.
    """
    cols = (
        "effective_ratio",
        "effective_ratio_ci",
        "mixed_groups",
        "contrastive_pairs",
        "pairs_per_cost",
        "pairs_per_kturn",
        "measured_turns",
        "distinct_prompts",
    )
    out = {}
    for m, n in shapes:
        sub = BenchConfig(**{**cfg.__dict__, "roots": m, "replays": n, "policies": tuple(policies)})
        same = reuse is not None and (reuse.config.roots, reuse.config.replays) == (m, n)
        if same and all(p in reuse.summary["policies"] for p in policies):
            rows = reuse.summary["policies"]
        else:
            rows = run_bench(sub).summary["policies"]
        out[f"{m}x{n:g}"] = {
            "accounted_budget": sub.accounted_budget,
            "policies": {k: {c: rows[k][c] for c in cols} for k in policies},
        }
    return out


def format_shapes(shapes: dict[str, Any]) -> str:
    lines = ["budget shape (equal accounted cost)   eff      mixed   pairs/TE  pairs/kturn"]
    for shape, d in shapes.items():
        for name, r in d["policies"].items():
            lines.append(
                f"  {shape:>9} ({d['accounted_budget']:.0f} TE) {name:<12} {r['effective_ratio']:6.1%}  "
                f"{r['mixed_groups']:7.1f}  {r['pairs_per_cost']:8.2f}  {r['pairs_per_kturn']:10.0f}"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trace-gym bench alloc",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset", default="math", choices=PRESET_NAMES, help="simulator preset (default math)"
    )
    p.add_argument("--drift", action="store_true", help="the simulated policy improves every step")
    p.add_argument("--steps", type=int, default=10, help="training steps per policy (default 10)")
    p.add_argument("--roots", type=int, default=256, help="M root rollouts per step (default 256)")
    p.add_argument("--replays", type=float, default=2.0, help="N replays per root (default 2)")
    p.add_argument(
        "--seeds", type=int, default=1, help="repeat with K seeds; report means and 95%% CIs"
    )
    p.add_argument(
        "--policies", default="", help="comma-separated allocation policies (default: all)"
    )
    p.add_argument(
        "--predictor",
        default="bayes",
        choices=("bayes", "features", "empirical", "constant"),
        help="predictor every policy learns online (default bayes: the features text model + per-prompt visit counts)",
    )
    p.add_argument("--group-size", type=int, default=8, help="group size of fixed-group policies")
    p.add_argument("--m-max", type=int, default=16, help="most root rollouts per prompt")
    p.add_argument(
        "--pool-factor",
        type=float,
        default=4.0,
        help="candidates = factor x prompts a fixed-group policy takes",
    )
    p.add_argument("--num-tasks", type=int, default=None, help="task pool size (simulator)")
    p.add_argument("--max-batch", type=int, default=None, help="most live episodes per policy call")
    p.add_argument("--shapes", default="", help="also compare budget shapes, e.g. 1024x2,512x6")
    p.add_argument("--shape-policies", default="treepo,trace", help="policies for --shapes")
    p.add_argument("--env", default=None, help="a registered env id instead of the simulator")
    p.add_argument("--policy", default=None, choices=("scripted",), help="policy for --env")
    p.add_argument("--env-kwargs", default="{}", help="JSON kwargs for --env")
    p.add_argument("--json", type=Path, default=None, help="write the summary JSON here")
    p.add_argument(
        "--out", type=Path, default=None, help="write summary/steps CSV, JSON and PNG plots here"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    # --ray: rollout throughput of trace_gym.distributed (1 vs 2 workers), not the policy table
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="compare Ray runner throughput with 1 and 2 workers (ADDRESS: local, auto, host:port)",
    )
    p.add_argument("--latency", type=float, default=0.02, help="--ray: seconds per policy call")
    p.add_argument("--ray-workers", default="1,2", help="--ray: worker counts to compare")
    p.add_argument("--ray-steps", type=int, default=3, help="--ray: timed steps per setting")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.ray is not None:
        from trace_gym.bench.distributed import main_from_alloc_args

        return main_from_alloc_args(args)
    try:
        cfg = BenchConfig(
            preset=args.preset,
            drift=args.drift,
            steps=args.steps,
            roots=args.roots,
            replays=args.replays,
            seeds=args.seeds,
            policies=tuple(x.strip() for x in args.policies.split(",") if x.strip()),
            predictor=args.predictor,
            group_size=args.group_size,
            m_max=args.m_max,
            pool_factor=args.pool_factor,
            num_tasks=args.num_tasks,
            max_batch=args.max_batch,
            env_id=args.env,
            policy=args.policy or ("scripted" if args.env else "sim"),
            env_kwargs=json.loads(args.env_kwargs),
            progress=not args.no_progress,
        )
        shapes = parse_shapes(args.shapes) if args.shapes else []
        result = run_bench(cfg)
    except (ConfigError, DependencyNotInstalled) as e:
        print(f"trace-gym bench alloc: {e}", file=sys.stderr)
        return 2
    s = result.summary
    title = (
        f"{cfg.env_id or 'trace/Sim-v0 ' + cfg.preset}{' (drift)' if cfg.drift else ''}: "
        f"{cfg.steps} steps x {cfg.seeds} seed(s), M={cfg.roots} N={cfg.replays:g} "
        f"({cfg.accounted_budget:.0f} trajectory-equivalents per step; flat policies {cfg.flat_roots} roots), "
        f"{cfg.candidates_per_step} candidates per step, predictor={cfg.predictor}"
    )
    print(format_table(s, title))
    print(
        "(eff: mean over steps; ± 95% CI over "
        + next(iter(s["policies"].values()))["ci_over"]
        + ")"
    )
    print(format_quality(s, [n for n in ("trace", "oracle") if n in s["policies"]]))
    if s.get("oracle_effective_ratio") is not None:
        print(f"oracle effective ratio: {s['oracle_effective_ratio']:.1%}")
    print("goals:\n" + format_goals(s["goals"]))
    if shapes:
        pols = [x.strip() for x in args.shape_policies.split(",") if x.strip()]
        s["budget_shapes"] = run_shapes(cfg, shapes, pols, reuse=result)
        print(format_shapes(s["budget_shapes"]))
    for path in write_outputs(s, result.records, json_path=args.json, out_dir=args.out):
        print(f"wrote {path}")
    if args.out is not None:  # index.html beside the files: tables, plots and this command
        cmd = ["trace-gym", "bench", "alloc", *(sys.argv[1:] if argv is None else argv)]
        print(f"wrote {write_index(args.out, 'trace-gym bench alloc', cmd, summary=s, notes=[title])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
