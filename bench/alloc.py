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
    format_curves,
    format_error,
    format_health,
    format_quality,
    format_table,
    summarize,
    write_outputs,
)
from trace_gym.bench.report_html import write_index

from trace_gym.budget import DEFAULT_REPLAY_COST
from trace_gym.cli import Parser, json_object
from trace_gym.compat import old_names, renamed_fields
from trace_gym.errors import ConfigError, DependencyNotInstalled, did_you_mean
from trace_gym.predict.health import depth_health, tree_rows
from trace_gym.runner import BranchingRunner, add_runner_args, runner_config
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


def _preset_names() -> tuple[str, ...]:
    from trace_gym.sim.presets import PRESETS

    return tuple(PRESETS)


PRESET_NAMES = _preset_names()


@renamed_fields(roots="root_budget", replays="replays_per_root")
@dataclass
class BenchConfig:
    """One benchmark run (see `main` for the command-line flags).

    The runner's settings keep the runner's names (``root_budget`` for ``--roots``,
    ``replays_per_root`` for ``--replays``); ``roots=`` / ``replays=`` still work, and the
    JSON output keeps those keys.
    """

    preset: str = "math"
    drift: bool = False
    steps: int = 10
    #: M root rollouts per step (tree policies)
    root_budget: int = 256
    #: N replays per root (tree policies); flat policies get M (1 + N/2) roots instead
    replays_per_root: float = 2.0
    seeds: int = 1
    #: seeds are seed_base .. seed_base + seeds - 1 (the final goal run: 100)
    seed_base: int = 0
    #: allocation policies (empty: every registered one)
    policies: tuple[str, ...] = ()
    predictor: str = "clue"
    #: extra constructor options for `predictor` (rows with the same predictor name),
    #: e.g. {"epochs": 6} or {"device": "cuda:1"} for the critic
    predictor_kwargs: dict[str, Any] = field(default_factory=dict)
    #: keyword options for the policies' constructors (each takes those it knows), e.g.
    #: for a "module:Class" policy of `policies`
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
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
    #: False (default): every step draws prompts never seen before (real epochs);
    #: True: each step samples from one fixed pool, so prompts recur (the v1 protocol)
    revisit: bool = False
    #: share of prefix samples in each predictor update batch (paper: about 6%)
    prefix_share: float = 0.06
    #: candidates per step (default: pool_factor x the prompts a fixed-group policy takes)
    candidates: int | None = None
    #: extra rows (label, allocation policy, predictor spec), e.g.
    #: ("trace@noisy:0.9", "trace", "noisy:0.9") or ("first_visit", "first_visit", "bayes")
    rows: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.env_id is None and self.preset not in PRESET_NAMES:
            raise ConfigError(
                f"--preset must be one of {', '.join(PRESET_NAMES)}, got {self.preset!r}"
            )
        if self.env_id is not None and self.policy != "scripted":
            raise ConfigError(
                "--env needs --policy scripted (the only generic policy the harness can build)"
            )
        for flag, value, ok, rule in self._ranges():
            if not ok:
                raise ConfigError(f"{flag} must be {rule}, got {value}")
        name, _ = parse_predictor(self.predictor)
        if name != "cell_mean":
            from trace_gym.predict import predictor_entry_point

            predictor_entry_point(name)  # unknown: one line now, not after the first policy
        for flag, kw in (
            ("--predictor-kwargs", self.predictor_kwargs),
            ("--policy-kwargs", self.policy_kwargs),
        ):
            if not isinstance(kw, dict):
                raise ConfigError(f"{flag} must be a JSON object, got {kw!r}")

    def _ranges(self) -> tuple[tuple[str, Any, bool, str], ...]:
        """(flag, value, whether it is allowed, the rule) of every numeric option."""
        cand = self.candidates
        return (
            ("--steps", self.steps, self.steps >= 1, ">= 1"),
            ("--roots", self.root_budget, self.root_budget >= 2, ">= 2"),
            ("--seeds", self.seeds, self.seeds >= 1, ">= 1"),
            ("--seed-base", self.seed_base, self.seed_base >= 0, ">= 0"),
            ("--replays", self.replays_per_root, self.replays_per_root >= 0, ">= 0"),
            ("--group-size", self.group_size, self.group_size >= 2, ">= 2"),
            ("--m-max", self.m_max, self.m_max >= 2, ">= 2"),
            ("--pool-factor", self.pool_factor, self.pool_factor > 0, "> 0"),
            ("--prefix-share", self.prefix_share, 0.0 <= self.prefix_share <= 1.0, "in [0, 1]"),
            ("--candidates", cand, cand is None or cand >= 1, ">= 1"),
        )

    @property
    def accounted_budget(self) -> float:
        """M (1 + N/2) trajectory-equivalents per step, for every policy."""
        return self.root_budget * (1.0 + DEFAULT_REPLAY_COST * self.replays_per_root)

    @property
    def flat_roots(self) -> int:
        return int(round(self.accounted_budget))

    @property
    def candidates_per_step(self) -> int:
        if self.candidates is not None:
            return self.candidates
        return int(math.ceil(self.pool_factor * self.accounted_budget / self.group_size))

    @property
    def protocol(self) -> str:
        return "revisit" if self.revisit else "fresh"


#: predictors the bench can build by name (``noisy:RHO`` sets the target Spearman;
#: ``cell_mean`` is the cell-mean reference, `trace_gym.bench.first_visit.CellMeanPredictor`;
#: ``critic:PRESET`` or ``critic:PRESET@PATH`` a critic preset and its local model copy)
PREDICTOR_NAMES = (
    "bayes",
    "clue",
    "features",
    "empirical",
    "constant",
    "critic",
    "critic:PRESET[@PATH]",
    "oracle",
    "noisy:RHO",
    "cell_mean",
)

#: TRACE-rule options a policy spec may carry: ``trace:posterior``, ``trace:max_prompts=32``
POLICY_OPTIONS = ("plugin", "posterior", "max_prompts=K")


def parse_policy(spec: str) -> tuple[str, dict[str, Any]]:
    """``"trace:posterior:max_prompts=32"`` -> ("trace", {"objective": "posterior", "max_prompts": 32}).

    A name that is not registered but starts "module:Class" keeps both parts
    (``"mypkg.policies:HalfSure"``), so a policy from a user's module takes options too.
    """
    from trace_gym.alloc import ALLOCATORS
    from trace_gym.plugins import is_entry_point

    parts = str(spec).split(":")
    two = len(parts) > 1 and parts[0] not in (*ALLOCATORS, "first_visit")
    cut = 2 if two and is_entry_point(":".join(parts[:2])) else 1
    name, opts = ":".join(parts[:cut]), parts[cut:]
    kw: dict[str, Any] = {}
    for opt in opts:
        key, eq, val = opt.partition("=")
        if not eq and key in ("plugin", "posterior"):
            kw["objective"] = key
        elif key == "max_prompts" and val.isdigit() and int(val) >= 1:
            kw["max_prompts"] = int(val)
        else:
            raise ConfigError(
                f"bad policy option {opt!r} in {spec!r}; options: {', '.join(POLICY_OPTIONS)} "
                "(K >= 1), e.g. trace:posterior or trace:max_prompts=32"
            )
    return name, kw


def parse_predictor(spec: str) -> tuple[str, dict[str, Any]]:
    """``"noisy:0.9"`` -> ("noisy", {"rho": 0.9}); ``"critic:qwen3-0.6b@/models/q"`` ->
    ("critic", {"preset": "qwen3-0.6b", "model_path": "/models/q"}); other names take no options."""
    from trace_gym.plugins import is_entry_point

    name, _, arg = str(spec).partition(":")
    if name not in ("critic", "noisy") and is_entry_point(spec):  # "module:Class"
        return str(spec), {}
    if name == "critic" and arg:
        return name, _critic_spec(arg)
    if name == "noisy":
        try:
            rho = float(arg)
        except ValueError as e:
            raise ConfigError(
                f"--predictor noisy:RHO needs a number RHO in (0, 1), got {spec!r}"
            ) from e
        if not 0.0 < rho < 1.0:
            raise ConfigError(f"--predictor noisy:RHO needs RHO in (0, 1), got {rho}")
        return name, {"rho": rho}
    if arg:
        raise ConfigError(f"predictor {name!r} takes no ':' option (got {spec!r})")
    return name, {}


def _critic_spec(arg: str) -> dict[str, Any]:
    from trace_gym.agents.critic import CRITIC_PRESETS

    preset, _, path = arg.partition("@")
    if preset not in CRITIC_PRESETS:
        raise ConfigError(
            f"--predictor critic:PRESET needs a preset in {', '.join(CRITIC_PRESETS)}, got {preset!r}"
        )
    return {"preset": preset, **({"model_path": path} if path else {})}


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

    need = 0 if cfg.revisit else cfg.steps * cfg.candidates_per_step
    n = cfg.num_tasks or max(PRESETS[cfg.preset].num_tasks, 2 * cfg.candidates_per_step, need)
    kwargs = dict(preset=cfg.preset, num_tasks=n, seed=seed, drift=cfg.drift)

    def factory():
        return gym.make("trace/Sim-v0", **kwargs)

    env = factory()
    ids = list(env.unwrapped.task_ids)
    env.close()
    label = f"trace/Sim-v0 preset={cfg.preset} tasks={n}" + (" drift" if cfg.drift else "")
    return _Source(factory, lambda: SimPolicy(cfg.preset, drift=cfg.drift), ids, True, label)


def _env_source(cfg: BenchConfig, seed: int) -> _Source:
    from trace_gym.agents.scripted import make_env, make_scripted

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
    from trace_gym.alloc import ALLOCATORS, allocator_class

    names = list(cfg.policies) or [p for p in POLICY_ORDER if p in ALLOCATORS] + sorted(
        p for p in ALLOCATORS if p not in POLICY_ORDER
    )
    classes = [allocator_class(parse_policy(spec)[0]) for spec in names]
    _check_policy_kwargs(cfg.policy_kwargs, classes)
    if not has_true_value and "oracle" in names:
        log.warning("dropping 'oracle': this env has no exact true values")
        names.remove("oracle")
    return names


def _branch_counts(trees: list[RolloutTree]) -> tuple[int, int]:
    """(nodes with >= 2 children, those whose subtree holds both outcomes): TreeRPO's signal."""
    branch = mixed = 0
    for t in trees:
        t.compute_targets()
        for n in t.nodes:
            if len(n.children) >= 2:
                branch += 1
                mixed += 0 < n.num_success < n.num_leaves
    return branch, mixed


def _record(
    name: str,
    seed: int,
    step: int,
    candidates: int,
    trees: list[RolloutTree],
    report,
    budget: float = math.nan,
    exact_scored: list | None = None,
) -> StepRecord:
    m = batch_metrics(trees)
    ranked, calibrated = tree_rows(trees)
    health = depth_health(exact_scored or ranked, calibrated)
    scored = []
    for t in trees:
        for n in t.nodes:
            if n.value is not None and n.target is not None:
                tv = math.nan if n.true_value is None else float(n.true_value)
                scored.append((n.depth, float(n.value), float(n.target), tv))
    branch, mixed_branch = _branch_counts(trees)
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
        branch_nodes=branch,
        mixed_branch_nodes=mixed_branch,
        unspent_budget=max(0.0, budget - report.accounted_cost) if budget == budget else math.nan,
        exact_scored=exact_scored or [],
        health=health,
    )


def _rows(cfg: BenchConfig, has_true_value: bool) -> list[tuple[str, str, str]]:
    """(label, allocation policy, predictor) of every row of the run."""
    rows = [(n, n, cfg.predictor) for n in _policies(cfg, has_true_value)]
    for label, alloc, pred in cfg.rows:
        if not has_true_value and (
            alloc in ("oracle", "first_visit") or pred.startswith(("oracle", "noisy", "cell_mean"))
        ):
            log.warning("dropping row %r: this env has no exact true values", label)
            continue
        parse_predictor(pred)
        rows.append((label, alloc, pred))
    return rows


def _budget_prompts(cfg: BenchConfig, name: str) -> int:
    """Prompts a flat policy's budget pays a fixed group for, M (1 + N/2) // group size; 0
    for a tree policy (its rule, not a group size, says how many prompts its roots open)."""
    from trace_gym.alloc import allocator_class

    if name == "first_visit" or getattr(allocator_class(parse_policy(name)[0]), "branching", True):
        return 0
    return cfg.flat_roots // cfg.group_size


def run_bench(cfg: BenchConfig) -> BenchResult:
    """Run every policy on every seed; returns the summary and per-step records."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a core dependency
        tqdm = None
    records: list[StepRecord] = []
    bar = None
    step2_pools: list[list[str]] = []
    for seed in range(cfg.seed_base, cfg.seed_base + cfg.seeds):
        source = _env_source(cfg, seed) if cfg.env_id else _sim_source(cfg, seed)
        rows = _rows(cfg, source.has_true_value)
        if bar is None and tqdm is not None:
            total = cfg.seeds * len(rows) * cfg.steps
            bar = tqdm(
                total=total,
                desc=f"bench alloc {cfg.env_id or cfg.preset}",
                file=sys.stderr,
                disable=not cfg.progress,
            )
        pools = (
            candidate_pools(cfg, source, seed) if cfg.revisit else fresh_pools(cfg, source, seed)
        )
        step2_pools += [[str(t) for t in pools[2]]] if len(pools) > 2 else []
        for label, name, pred in rows:
            runs = run_policy(cfg, source, name, seed, pools, predictor=pred, exact_log=True)
            for step, trees, report, exact in runs:
                record = _record(
                    label, seed, step, len(pools[step]), trees, report, cfg.accounted_budget, exact
                )
                record.budget_prompts = _budget_prompts(cfg, name)
                records.append(record)
                if bar is not None:
                    bar.set_postfix_str(f"{label} eff={record.effective_ratio:.0%}")
                    bar.update(1)
    if bar is not None:
        bar.close()
    summary = summarize(records, no_predictor=_no_predictor_rows(cfg))
    summary["config"] = _config_dict(cfg)
    summary["protocol"] = _protocol(cfg)
    summary["calibration"] = _calibration(cfg)
    summary["goals"] = goals(summary, cfg, records)
    policies = summary["policies"]
    if source.has_true_value and cfg.env_id is None and {"trace", "first_visit"} <= set(policies):
        summary["goals"] += _learned_goals(cfg, summary, records, step2_pools)
    return BenchResult(cfg, summary, records)


def _learned_goals(cfg: BenchConfig, summary, records, step2_pools) -> list[dict[str, Any]]:
    """Issue 25's learned-predictor goals (steps >= 1, depth-0 health vs the cell means);
    computed beside the first-visit reference row (``--reference``), as in the goal runs."""
    from trace_gym.bench.learned_goals import cell_gain_rank, depth0_health, learned_goals

    rank = cell_gain_rank(step2_pools, cfg.preset, 2, cfg.drift) if step2_pools else None
    summary["depth0_health"] = {str(k): v for k, v in depth0_health(records).items()}
    summary["cell_mean_gain_rank_step2"] = rank
    return learned_goals(summary["policies"], records, rank, paired_difference)


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


def fresh_pools(cfg: BenchConfig, source: _Source, seed: int) -> list[list[Any]]:
    """Each step's candidates, disjoint across steps: no prompt is ever offered twice."""
    n_cand = cfg.candidates_per_step
    need = cfg.steps * n_cand
    if len(source.task_ids) < need:
        raise ConfigError(
            f"fresh prompts need {cfg.steps} steps x {n_cand} candidates = {need} tasks, the pool "
            f"has {len(source.task_ids)}; raise --num-tasks or pass --revisit"
        )
    order = np.random.default_rng(stable_seed("bench-fresh", seed)).permutation(
        len(source.task_ids)
    )
    ids = [source.task_ids[i] for i in order[:need]]
    return [ids[s * n_cand : (s + 1) * n_cand] for s in range(cfg.steps)]


def _check_policy_kwargs(kwargs: dict[str, Any], classes: Sequence[type]) -> None:
    """Every --policy-kwargs key must be taken by some policy of the run (a typo otherwise)."""
    from trace_gym.alloc import allocator_options

    options = [allocator_options(c) for c in classes]
    if any(o is None for o in options):  # a policy that takes **kwargs takes every key
        return
    known = set().union(*options)
    for key in sorted(kwargs):
        if key not in known:
            raise ConfigError(
                f"--policy-kwargs key {key!r} is taken by no policy of the run"
                f"{did_you_mean(key, known)}; they take: {', '.join(sorted(known))}"
            )


def _make_allocator(cfg: BenchConfig, name: str):
    from trace_gym.alloc import allocator_class, allocator_options, make_allocator

    if name == "first_visit":
        from trace_gym.bench.first_visit import FirstVisitAllocator

        return FirstVisitAllocator(m_max=cfg.m_max, group_size=cfg.group_size)
    base, options = parse_policy(name)
    takes = allocator_options(allocator_class(base))
    kw = {"m_max": cfg.m_max, "group_size": cfg.group_size, **cfg.policy_kwargs}
    kw = {k: v for k, v in kw.items() if takes is None or k in takes}  # each takes its own
    return make_allocator(base, **kw, **options)


def _make_predictor(cfg: BenchConfig, spec: str):
    """The predictor `spec` names; ``cell_mean`` wraps the run's own (`CellMeanPredictor`)."""
    from trace_gym.predict import make_predictor

    name, kw = parse_predictor(spec)
    if name == parse_predictor(cfg.predictor)[0]:  # --predictor-kwargs: the run's predictor
        kw = {**kw, **cfg.predictor_kwargs}
    if name == "cell_mean":
        from trace_gym.bench.first_visit import CellMeanPredictor

        inner = cfg.predictor if cfg.predictor != "cell_mean" else "bayes"
        iname, ikw = parse_predictor(inner)
        return CellMeanPredictor(make_predictor(iname, **ikw))
    return make_predictor(name, **kw)


class _Recorder:
    """A predictor wrapper that keeps every state it was asked about and the answer."""

    def __init__(self, inner):
        self.inner = inner
        self.log: list[tuple[str, tuple[str, ...], float]] = []

    def predict(self, states):
        v = self.inner.predict(states)
        self.log += [
            (s.prompt_id, tuple(a for a, _ in s.turns), float(x))
            for s, x in zip(states, v, strict=True)
        ]
        return v

    def update(self, *args, **kwargs):
        return self.inner.update(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _exact_scores(cfg: BenchConfig, log_: list, step: int) -> list[tuple[int, float, float]]:
    """(depth, predicted, exact) of every state scored in a step (the simulator only)."""
    from trace_gym.sim import get_preset, skill_at, true_value

    skill = skill_at(get_preset(cfg.preset), step, cfg.drift)
    return [(len(acts), v, true_value(pid, acts, skill=skill)) for pid, acts, v in log_]


def run_policy(
    cfg: BenchConfig,
    source: _Source,
    name: str,
    seed: int,
    pools: list[list[Any]],
    predictor: str | None = None,
    exact_log: bool = False,
) -> Iterator[tuple]:
    """(step, trees, report) of one policy over the shared pools, at the harness's equal cost.

    With `exact_log` (the simulator only) each item also carries the (depth, predicted,
    exact) triple of every state the predictor scored: every candidate at depth 0, every
    visited prefix deeper.
    """
    allocator = _make_allocator(cfg, name)
    branching = bool(getattr(allocator, "branching", True))
    rcfg = runner_config(  # m_max, max_batch, prefix_share: the bench's own
        cfg,
        root_budget=cfg.root_budget if branching else cfg.flat_roots,
        replays_per_root=cfg.replays_per_root if branching else 0.0,
        seed=seed,
    )
    exact = exact_log and source.has_true_value and cfg.env_id is None
    made = _make_predictor(cfg, predictor or cfg.predictor)
    pred = _Recorder(made) if exact else made
    runner = BranchingRunner(source.make_policy(), source.env_factory, allocator, pred, rcfg)
    try:
        for step, pool in enumerate(pools):
            if exact and hasattr(pred.inner, "skill"):  # the reference predictors track drift
                from trace_gym.sim import get_preset, skill_at

                pred.inner.skill = skill_at(get_preset(cfg.preset), step, cfg.drift)
            trees, report = runner.run_step(step, [str(t) for t in pool])
            if not exact_log:
                yield step, trees, report
                continue
            scores = _exact_scores(cfg, pred.log, step) if exact else []
            if exact:
                pred.log = []
            yield step, trees, report, scores
    finally:
        runner.close()


def _no_predictor_rows(cfg: BenchConfig) -> set[str]:
    """Rows whose predictor figures mean nothing: the oracle allocator, oracle predictors."""
    out = {"oracle"}
    if cfg.predictor == "oracle":
        out |= set(cfg.policies) | {p for p in POLICY_ORDER}
    out |= {label for label, _, pred in cfg.rows if pred == "oracle"}
    return out


def _protocol(cfg: BenchConfig) -> dict[str, Any]:
    return {
        "prompts": cfg.protocol,
        "steps": cfg.steps,
        "seeds": cfg.seeds,
        "seed_base": cfg.seed_base,
        "roots": cfg.root_budget,
        "replays_per_root": cfg.replays_per_root,
        "accounted_budget": cfg.accounted_budget,
        "candidates_per_step": cfg.candidates_per_step,
        "predictor": cfg.predictor,
        "prefix_share": cfg.prefix_share,
        "drift": cfg.drift,
        "ci": "95% Student t over seeds" if cfg.seeds > 1 else "95% Student t over steps (1 seed)",
    }


def _calibration(cfg: BenchConfig) -> dict[str, Any]:
    if cfg.env_id is not None:
        return {"resolved_share": None, "preset": None}
    from trace_gym.sim import get_preset
    from trace_gym.sim.exact import preset_stats

    p = get_preset(cfg.preset)
    return {
        "preset": cfg.preset,
        "preset_name": p.name,
        "resolved_share": p.resolved_share,
        "resolved_share_measured": preset_stats(p, 400).resolved_share,
    }


def _config_dict(cfg: BenchConfig) -> dict[str, Any]:
    d = {k: v for k, v in old_names(cfg).items() if k != "progress"}
    d["policies"] = list(cfg.policies)
    d.update(
        accounted_budget=cfg.accounted_budget,
        flat_roots=cfg.flat_roots,
        candidates_per_step=cfg.candidates_per_step,
    )
    return d


# ---------------------------------------------------------------------- goals
def paired_difference(records: Sequence[StepRecord], a: str, b: str, key: str = "effective_ratio"):
    """Mean and 95% CI half-width of (a - b) per seed (steps averaged within a seed)."""
    from trace_gym.bench.report import mean_ci

    def per_seed(name: str) -> dict[int, float]:
        out: dict[int, list[float]] = {}
        for r in records:
            if r.policy == name:
                out.setdefault(r.seed, []).append(r.metrics[key])
        return {s: float(np.mean(v)) for s, v in out.items()}

    pa, pb = per_seed(a), per_seed(b)
    seeds = sorted(set(pa) & set(pb))
    if len(seeds) < 2:  # one seed: pair the steps instead
        xa = [r.metrics[key] for r in records if r.policy == a]
        xb = [r.metrics[key] for r in records if r.policy == b]
        return mean_ci([x - y for x, y in zip(xa, xb, strict=False)])
    return mean_ci([pa[s] - pb[s] for s in seeds])


def goals(
    summary: dict[str, Any], cfg: BenchConfig, records: Sequence[StepRecord] = ()
) -> list[dict[str, Any]]:
    """The issue's goals, measured (reported, never asserted)."""
    p = summary["policies"]
    out: list[dict[str, Any]] = []

    def add(goal: str, measured: str, met: bool | None) -> None:
        out.append({"goal": goal, "measured": measured, "met": met})

    if "trace" in p and "grpo" in p:
        t, g = p["trace"], p["grpo"]
        ratio = t["effective_ratio"] / g["effective_ratio"] if g["effective_ratio"] else math.inf
        add(
            "TRACE effective ratio >= 2.2x GRPO's, with more mixed groups per TE (paper math: 26.8% -> 60.6%)",
            f"{t['effective_ratio']:.1%} vs {g['effective_ratio']:.1%} ({ratio:.2f}x); "
            f"mixed/TE {t['mixed_per_te']:.3f} vs {g['mixed_per_te']:.3f}",
            ratio >= 2.2 and t["mixed_per_te"] > g["mixed_per_te"],
        )
    if "trace" in p and "treepo" in p:
        d, h = paired_difference(records, "trace", "treepo") if records else (math.nan, math.nan)
        add(
            "TRACE >= +10 points over random branching at this shape (paper hotpotqa: +9.5..+10.2)",
            f"{p['trace']['effective_ratio']:.1%} vs {p['treepo']['effective_ratio']:.1%} ({100 * d:+.1f} ± {100 * h:.1f} points)",
            d >= 0.10,
        )
    out += _stage_goals(p, records)
    if "trace" in p:
        t = p["trace"]
        add(
            "candidates skipped and rollouts per selected prompt (paper bfcl: 65-71% skipped, 5-7 rollouts)",
            f"{t['skipped_share']:.0%} skipped, {t['rollouts_per_prompt']:.1f} rollouts per selected prompt",
            None,
        )
    return out


def _stage_goals(p: dict[str, Any], records: Sequence[StepRecord]) -> list[dict[str, Any]]:
    """The ablation, first-visit and predictor-depth goals (those whose rows ran)."""
    out: list[dict[str, Any]] = []

    def add(goal: str, measured: str, met: bool | None) -> None:
        out.append({"goal": goal, "measured": measured, "met": met})

    order = ["trace", "trace_roots_random_prefixes", "uniform_roots_trace_prefixes", "treepo"]
    if all(k in p for k in order):
        e = {k: p[k]["effective_ratio"] for k in order}
        d, h = paired_difference(records, "trace", order[1]) if records else (math.nan, math.nan)
        met = (
            e["trace"] > max(e[order[1]], e[order[2]])
            and min(e[order[1]], e[order[2]]) > e["treepo"]
            and d >= 0.03
            and d - h > 0
        )
        add(
            "ablation: adaptive/adaptive > each single stage > uniform/uniform, adaptive prefixes >= +3 points "
            "over random ones under adaptive roots, CI excluding 0 (paper: 52.3 > 49.1, 47.3 > 42.8)",
            ", ".join(f"{k}={v:.1%}" for k, v in e.items())
            + f"; prefixes {100 * d:+.1f} ± {100 * h:.1f} points",
            met,
        )
    if "trace" in p and "first_visit" in p:
        t, f = p["trace"], p["first_visit"]
        share = t["mixed_per_te"] / f["mixed_per_te"] if f["mixed_per_te"] else math.nan
        oracle = (
            f"; {t['mixed_per_te'] / p['oracle']['mixed_per_te']:.0%} of the oracle's"
            if "oracle" in p
            else ""
        )
        add(
            "learned TRACE mixed groups per TE >= 95% of the first-visit reference's",
            f"{t['mixed_per_te']:.3f} vs {f['mixed_per_te']:.3f} ({share:.0%}){oracle}",
            share >= 0.95,
        )
    err = p.get("trace", {}).get("prediction_error_by_depth") or {}
    if "0" in err and "4" in err:
        e0, e4 = err["0"]["mse"], err["4"]["mse"]
        add(
            "learned predictor's error vs exact Z at depth 4 <= half its depth-0 error (paper critic: ~1/3)",
            f"MSE d0 {e0:.4f}, d4 {e4:.4f} ({e4 / e0:.2f}x)",
            e4 <= 0.5 * e0,
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


SHAPE_COLUMNS = (
    "effective_ratio",
    "effective_ratio_ci",
    "mixed_groups",
    "mixed_per_te",
    "contrastive_pairs",
    "pairs_per_cost",
    "pairs_per_kturn",
    "mixed_branch_share",
    "measured_turns",
    "distinct_prompts",
)

#: prompts per step of the budget-shape protocol at our CPU scale
SHAPE_PROMPTS = 32


def run_shapes(
    cfg: BenchConfig,
    shapes: Sequence[tuple[int, float]],
    policies: Sequence[str],
    scale: float = 0.5,
    prompts: int = SHAPE_PROMPTS,
) -> dict[str, Any]:
    """The paper's budget-shape protocol: a fixed number of prompts and a fixed pool.

    Shape ``MxN`` (the paper's M roots, N replays per root) runs with ``round(M * scale)``
    roots and N replays per root. Fixed-group policies take `prompts` prompts per step
    with ``roots / prompts`` roots each; every policy sees the same candidates per step
    (``pool_factor * prompts``, whatever the shape), so a deeper shape varies roots per
    prompt and replays per root, not how many prompts there are.
    """
    n_cand = int(math.ceil(cfg.pool_factor * prompts))
    out = {}
    for m, n in shapes:
        roots = int(round(m * scale))
        group = roots // prompts
        if group < 2 or group > cfg.m_max:
            raise ConfigError(
                f"shape {m}x{n:g} at --scale {scale:g} gives {roots} roots = {group} per prompt "
                f"for {prompts} prompts; need 2..{cfg.m_max} (change --scale)"
            )
        sub = BenchConfig(
            **{
                **cfg.__dict__,
                "root_budget": roots,
                "replays_per_root": n,
                "group_size": group,
                "candidates": n_cand,
                "policies": tuple(policies),
                "rows": (),
            }
        )
        rows = run_bench(sub).summary["policies"]
        out[f"{m}x{n:g}"] = {
            "roots": roots,
            "roots_per_prompt": group,
            "candidates_per_step": n_cand,
            "accounted_budget": sub.accounted_budget,
            "policies": {k: {c: rows[k][c] for c in SHAPE_COLUMNS} for k in policies},
        }
    return out


def run_shapes_fixed_group(
    cfg: BenchConfig,
    shapes: Sequence[tuple[int, float]],
    policies: Sequence[str],
    reuse: BenchResult | None = None,
) -> dict[str, Any]:
    """The v1 comparison: (M, N) shapes at the run's fixed group size (so a deeper shape
    gets fewer prompts); shape -> summary rows.

    A shape equal to `reuse`'s (M, N) takes its rows from `reuse` instead of rerunning.
    """
    cols = SHAPE_COLUMNS
    out = {}
    for m, n in shapes:
        sub = BenchConfig(
            **{**cfg.__dict__, "root_budget": m, "replays_per_root": n, "policies": tuple(policies)}
        )
        done = reuse.config if reuse is not None else None
        same = done is not None and (done.root_budget, done.replays_per_root) == (m, n)
        if same and all(p in reuse.summary["policies"] for p in policies):
            rows = reuse.summary["policies"]
        else:
            rows = run_bench(sub).summary["policies"]
        out[f"{m}x{n:g}"] = {
            "accounted_budget": sub.accounted_budget,
            "policies": {k: {c: rows[k][c] for c in cols} for k in policies},
        }
    return out


def format_shapes(shapes: dict[str, Any], title: str = "budget shape") -> str:
    lines = [f"{title} (equal accounted cost)   eff         mixed  mixed/TE  pairs/TE  mixed-br"]
    for shape, d in shapes.items():
        for name, r in d["policies"].items():
            ci = r.get("effective_ratio_ci") or 0.0
            lines.append(
                f"  {shape:>9} ({d['accounted_budget']:.0f} TE) {name:<12} {r['effective_ratio']:6.1%}±{100 * ci:4.1f} "
                f"{r['mixed_groups']:7.1f}  {r['mixed_per_te']:8.3f}  {r['pairs_per_cost']:8.2f}  {r['mixed_branch_share']:7.0%}"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="trace-gym bench alloc",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset", default="math", choices=PRESET_NAMES, help="simulator preset (default math)"
    )
    p.add_argument("--drift", action="store_true", help="the simulated policy improves every step")
    p.add_argument("--steps", type=int, default=10, help="training steps per policy (default 10)")
    add_runner_args(p, root_budget=256, replays_per_root=2.0)
    p.add_argument(
        "--seeds", type=int, default=1, help="repeat with K seeds; report means and 95%% CIs"
    )
    p.add_argument(
        "--seed-base", type=int, default=0, help="first seed (seeds BASE..BASE+K-1; default 0)"
    )
    p.add_argument(
        "--policies",
        default="",
        help="comma-separated allocation policies (default: all): registered names, names an "
        "installed package declares (entry-point group trace_gym.allocators) or module:Class "
        "(its module importable, e.g. on PYTHONPATH); TRACE-rule ones take options "
        "after ':', e.g. trace:posterior (the posterior objective), trace:max_prompts=32",
    )
    p.add_argument(
        "--policy-kwargs",
        default="{}",
        help="JSON options for the policies' constructors; each policy takes the keys it knows, "
        "e.g. '{\"lo\": 0.3}' for a module:Class policy",
    )
    p.add_argument(
        "--predictor",
        default="clue",
        help="predictor every policy learns online: clue (default: a Bayesian logistic model on "
        "generic text features, refit on every label, with a Beta concentration), bayes (the "
        "features text model + per-prompt visit counts; the v1 protocol's), features, empirical, constant, critic (critic:qwen3-0.6b, "
        "critic:qwen3-0.6b@PATH: the 0.6B preset from the hub or a local copy); or the references "
        "oracle (exact values) and noisy:RHO (exact values with noise sized to Spearman RHO)",
    )
    p.add_argument(
        "--predictor-kwargs",
        default="{}",
        help="JSON options for the predictor's constructor, e.g. '{\"epochs\": 6}' for critic",
    )
    _protocol_args(p)
    _reference_args(p)
    _output_args(p)
    return p


def _protocol_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--revisit",
        action="store_true",
        help="v1 protocol: prompts recur (default: fresh prompts every step)",
    )
    add_runner_args(p, prefix_share=0.06)
    p.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="candidates per step (default: pool factor x fixed-group prompts)",
    )
    p.add_argument("--group-size", type=int, default=8, help="group size of fixed-group policies")
    add_runner_args(p, m_max=16)
    p.add_argument(
        "--pool-factor",
        type=float,
        default=4.0,
        help="candidates = factor x prompts a fixed-group policy takes",
    )
    p.add_argument("--num-tasks", type=int, default=None, help="task pool size (simulator)")
    add_runner_args(p, max_batch=None)
    p.add_argument(
        "--shapes",
        default="",
        help="also compare budget shapes at 32 prompts per step and a fixed pool, e.g. 512x2,512x6,1024x2",
    )
    p.add_argument(
        "--scale",
        type=float,
        default=0.5,
        help="--shapes: roots = M x scale (default 0.5: 512x2 -> 256 roots, 8 per prompt)",
    )
    p.add_argument(
        "--shapes-fixed-group",
        default="",
        help="the v1 comparison: shapes at the fixed --group-size (fewer prompts when deeper)",
    )
    p.add_argument("--shape-policies", default="treepo,trace", help="policies for --shapes")


def _reference_args(p: argparse.ArgumentParser) -> None:
    """The extra rows: references, noisy oracles and the distinct-prompt cap."""
    p.add_argument(
        "--noisy-curve",
        default="",
        help="add TRACE rows with noisy:RHO predictors, e.g. 0.95,0.9,0.8,0.7",
    )
    p.add_argument(
        "--reference",
        action="store_true",
        help="add the first-visit reference row (exact posterior given the prompt's clues) and "
        "the cell-mean row (TRACE on each clue cell's mean success)",
    )
    p.add_argument(
        "--oracle-predictor-row",
        action="store_true",
        help="add a TRACE row with the oracle predictor",
    )
    p.add_argument(
        "--max-prompts",
        type=int,
        default=None,
        help="add a TRACE row that opens at most K prompts per step (trace:max_prompts=K), "
        "e.g. GRPO's count, beside the uncapped one",
    )
    p.add_argument(
        "--oracle-prefix-ablation",
        action="store_true",
        help="add TRACE and adaptive roots / random prefixes rows with the oracle predictor",
    )


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help="a registered env id instead of the simulator")
    p.add_argument("--policy", default=None, choices=("scripted",), help="policy for --env")
    p.add_argument("--env-kwargs", default="{}", help="JSON kwargs for --env")
    p.add_argument("--json", type=Path, default=None, help="write the summary JSON here")
    p.add_argument(
        "--out", type=Path, default=None, help="write summary/steps CSV, JSON and PNG plots here"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--wide",
        action="store_true",
        help="print every column of the table (default: the compact one, <= 100 characters)",
    )
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
    # --ray --engines: the engine pool (trace_gym.distributed.engine) and per-prompt expansion
    p.add_argument(
        "--engines", default=None, help="--ray: engine-actor counts to compare (e.g. 1,2,4)"
    )
    p.add_argument(
        "--env-workers", type=int, default=None, help="--engines: env workers (default: = engines)"
    )
    p.add_argument(
        "--barrier", default="per-prompt", help="--engines: global, per-prompt or both (comma)"
    )
    p.add_argument(
        "--latency-sigma",
        type=float,
        default=0.0,
        help="--engines: log-normal sigma of the latency",
    )
    p.add_argument(
        "--engine-slots", type=int, default=8, help="--engines: requests one engine serves at once"
    )
    p.add_argument("--hf", action="store_true", help="--engines: add tiny-HF-engine rows")


def _extra_rows(args: argparse.Namespace) -> tuple[tuple[str, str, str], ...]:
    rows = []
    for rho in [x.strip() for x in args.noisy_curve.split(",") if x.strip()]:
        rows.append((f"trace@noisy:{rho}", "trace", f"noisy:{rho}"))
    if args.oracle_predictor_row or args.oracle_prefix_ablation:
        rows.append(("trace@oracle", "trace", "oracle"))
    if args.oracle_prefix_ablation:
        rnd = "trace_roots_random_prefixes"
        rows.append((f"{rnd}@oracle", rnd, "oracle"))
    if args.reference:
        rows.append(("first_visit", "first_visit", args.predictor))
        rows.append(("cell_mean", "trace", "cell_mean"))
    if args.max_prompts is not None:
        if args.max_prompts < 1:
            raise ConfigError(f"--max-prompts must be >= 1, got {args.max_prompts}")
        spec = f"trace:max_prompts={args.max_prompts}"
        rows.append((spec, spec, args.predictor))
    return tuple(rows)


def _config(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(
        preset=args.preset,
        drift=args.drift,
        steps=args.steps,
        root_budget=args.root_budget,
        replays_per_root=args.replays_per_root,
        seeds=args.seeds,
        seed_base=args.seed_base,
        policies=tuple(x.strip() for x in args.policies.split(",") if x.strip()),
        predictor=args.predictor,
        predictor_kwargs=json_object("--predictor-kwargs", args.predictor_kwargs),
        policy_kwargs=json_object("--policy-kwargs", args.policy_kwargs),
        group_size=args.group_size,
        m_max=args.m_max,
        pool_factor=args.pool_factor,
        num_tasks=args.num_tasks,
        max_batch=args.max_batch,
        env_id=args.env,
        policy=args.policy or ("scripted" if args.env else "sim"),
        env_kwargs=json_object("--env-kwargs", args.env_kwargs),
        progress=not args.no_progress,
        revisit=args.revisit,
        prefix_share=args.prefix_share,
        candidates=args.candidates,
        rows=_extra_rows(args),
    )


def _title(cfg: BenchConfig) -> str:
    return (
        f"{cfg.env_id or 'trace/Sim-v0 ' + cfg.preset}{' (drift)' if cfg.drift else ''}: "
        f"{cfg.steps} steps x {cfg.seeds} seed(s), {cfg.protocol} prompts, M={cfg.root_budget} N={cfg.replays_per_root:g} "
        f"({cfg.accounted_budget:.0f} trajectory-equivalents per step; flat policies {cfg.flat_roots} roots), "
        f"{cfg.candidates_per_step} candidates per step, predictor={cfg.predictor}"
        + (f" {json.dumps(cfg.predictor_kwargs)}" if cfg.predictor_kwargs else "")
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.ray is not None and args.engines is not None:
        from trace_gym.bench.engines import main_from_alloc_args as engines_main

        return engines_main(args)
    if args.ray is not None:
        from trace_gym.bench.distributed import main_from_alloc_args

        return main_from_alloc_args(args)
    try:
        cfg = _config(args)
        shapes = parse_shapes(args.shapes) if args.shapes else []
        fixed = parse_shapes(args.shapes_fixed_group) if args.shapes_fixed_group else []
        if args.scale <= 0:
            raise ConfigError(f"--scale must be > 0, got {args.scale}")
        result = run_bench(cfg)
        s = result.summary
        pols = [x.strip() for x in args.shape_policies.split(",") if x.strip()]
        if shapes:
            s["budget_shapes"] = run_shapes(cfg, shapes, pols, scale=args.scale)
            s["goals"] += shape_goals(s["budget_shapes"])
        if fixed:
            s["budget_shapes_fixed_group"] = run_shapes_fixed_group(cfg, fixed, pols, reuse=result)
    except (ConfigError, DependencyNotInstalled) as e:
        print(f"trace-gym bench alloc: {e}".splitlines()[0], file=sys.stderr)
        return 2
    _print_report(cfg, s, wide=args.wide)
    for path in write_outputs(s, result.records, json_path=args.json, out_dir=args.out):
        print(f"wrote {path}")
    if args.out is not None:  # index.html beside the files: tables, plots and this command
        cmd = ["trace-gym", "bench", "alloc", *(sys.argv[1:] if argv is None else argv)]
        print(
            f"wrote {write_index(args.out, 'trace-gym bench alloc', cmd, summary=s, notes=[_title(cfg)])}"
        )
    return 0


def shape_goals(shapes: dict[str, Any]) -> list[dict[str, Any]]:
    """TRACE >= +10 points over random branching at every budget shape."""
    cells, met = [], True
    for shape, d in shapes.items():
        pol = d["policies"]
        if "trace" not in pol or "treepo" not in pol:
            return []
        diff = pol["trace"]["effective_ratio"] - pol["treepo"]["effective_ratio"]
        cells.append(f"{shape}: {100 * diff:+.1f}")
        met = met and diff >= 0.10
    return [
        {
            "goal": "TRACE >= +10 points over TreePO random branching at each shape (paper: +10.2, +10.1, +9.5)",
            "measured": ", ".join(cells) + " points",
            "met": met,
        }
    ]


def _print_report(cfg: BenchConfig, s: dict[str, Any], *, wide: bool = False) -> None:
    print(format_table(s, _title(cfg), wide=wide))
    print(
        "(eff: mean over steps; ± 95% CI over "
        + next(iter(s["policies"].values()))["ci_over"]
        + "; budget / filter: the part of a flat policy's skipped share that its budget"
        " could not pay a group for / that its filter left out)"
    )
    cal = s.get("calibration") or {}
    if cal.get("resolved_share_measured") is not None:
        print(
            f"preset {cal['preset']} ({cal['preset_name']}): resolved share {cal['resolved_share_measured']:.2f}"
        )
    print(format_curves(s))
    print(format_curves(s, "mixed_per_te"))
    quality = format_quality(
        s, [n for n in ("trace",) if s["policies"].get(n, {}).get("predictor_quality")]
    )
    if quality:
        print(quality)
    err = format_error(s)
    if err:
        print(err)
    health = format_health(s)
    if health:
        print(health)
    if s.get("oracle_effective_ratio") is not None:
        print(f"oracle effective ratio: {s['oracle_effective_ratio']:.1%}")
    if s.get("budget_shapes"):
        print(format_shapes(s["budget_shapes"], "budget shape, 32 prompts per step"))
    if s.get("budget_shapes_fixed_group"):
        print(format_shapes(s["budget_shapes_fixed_group"], "budget shape, fixed group size (v1)"))
    print("goals:\n" + format_goals(s["goals"]))


if __name__ == "__main__":
    raise SystemExit(main())
