"""``trace-gym bench learn``: does TRACE make RL learn faster at equal accounted cost?

Trains `trace_gym.bench.sim_learner.LearnedSimPolicy` on fresh simulator tasks with
each arm (allocator + optimiser), every arm at the same accounted cost per step, over
paired seeds (the same task stream, runner seed and held-out tasks per seed across arms),
and measures exact held-out success against cumulative accounted cost. The protocol is
the committed file configs/learn_protocol/v1.toml (see docs/learning.md); a comparison
refuses to run unless that file is tracked by git and unmodified.

    trace-gym bench learn --preset math --arms trace,treepo,trace_roots,grpo --seeds 20 \\
        --json runs/learn/math.json --out runs/learn/math
"""

from __future__ import annotations

import hashlib
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.budget import DEFAULT_REPLAY_COST
from trace_gym.compat import renamed_fields
from trace_gym.errors import ConfigError
from trace_gym.seeding import stable_seed

__all__ = [
    "LearnConfig",
    "check_protocol",
    "config_from_protocol",
    "heldout_tasks",
    "load_protocol",
    "run_arm",
    "task_stream",
]

DEFAULT_PROTOCOL = Path(__file__).resolve().parent.parent / "configs" / "learn_protocol" / "v1.toml"
#: the tiny-LM arms' protocol (`trace_gym.bench.learn_lm`)
TINY_LM_PROTOCOL = DEFAULT_PROTOCOL.with_name("tiny_lm_v1.toml")


@renamed_fields(roots="root_budget", replays="replays_per_root")
@dataclass
class LearnConfig:
    """One `bench learn` run: the protocol's values, with any command-line overrides.

    The runner's settings carry the runner's names (the protocol's ``[budget]`` says
    ``roots`` and ``replays``, which stay keyword arguments and attributes too).
    """

    preset: str = "math"
    arms: dict[str, tuple[str, str, bool]] = field(default_factory=dict)
    seeds: int = 20
    #: the paired seeds are seed_base .. seed_base + seeds - 1 (the protocol's
    #: ``[comparisons] seed_base``; 0 when absent, as in v1)
    seed_base: int = 0
    steps: int = 60
    root_budget: int = 32
    replays_per_root: float = 2.0
    replay_cost: float = DEFAULT_REPLAY_COST
    group_size: int = 8
    m_max: int = 16
    candidates: int = 32
    predictor: str = "bayes"
    train_pool_base: int = 1000
    heldout_pool_base: int = 900000
    heldout_tasks: int = 1024
    eval_every: int = 5
    lr: float = 0.05
    clip_low: float = 0.2
    clip_high: float = 0.28
    aggregation: str = "token_mean"
    progress: bool = True
    #: "softmax" (`sim_learner.LearnedSimPolicy`, exact evaluation) or "tiny-lm"
    #: (`learn_lm`: the LLM trainer on the tiny Qwen3, sampled evaluation)
    learner: str = "softmax"
    #: episodes per held-out task (sampled evaluation only)
    eval_samples: int = 1
    #: the protocol's [learner] table (the tiny LM's warm start and optimiser settings)
    lm: dict[str, Any] = field(default_factory=dict)
    #: where tiny-LM runs keep their trainer directories (None: a temporary directory)
    work_dir: str | None = None
    #: arm -> max_staleness of its asynchronous rollouts (the protocol's ``[staleness]``;
    #: absent arms: 0, synchronous); softmax learner only
    staleness: dict[str, int] = field(default_factory=dict)
    #: cap of the truncated importance weight of stale moves (``[learner] stale_is_cap``)
    stale_is_cap: float = 2.0

    @property
    def seed_list(self) -> list[int]:
        """The paired seeds of this run."""
        return list(range(self.seed_base, self.seed_base + self.seeds))

    @property
    def accounted_budget(self) -> float:
        return self.root_budget * (1.0 + self.replays_per_root * self.replay_cost)

    @property
    def flat_roots(self) -> int:
        return int(round(self.accounted_budget))


def load_protocol(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read the protocol file {path}: {e}") from e


def config_from_protocol(proto: dict[str, Any], **over: Any) -> LearnConfig:
    b, t, lr = proto["budget"], proto["tasks"], proto["learner"]
    cfg = LearnConfig(
        arms={k: (v[0], v[1], bool(v[2])) for k, v in proto["arms"].items()},
        seeds=proto["comparisons"]["primary_seeds"],
        seed_base=proto["comparisons"].get("seed_base", 0),
        steps=lr["steps"],
        root_budget=b["roots"],
        replays_per_root=b["replays"],
        replay_cost=b["replay_cost"],
        group_size=b["group_size"],
        m_max=b["m_max"],
        candidates=b["candidates"],
        predictor=b["predictor"],
        train_pool_base=t["train_pool_base"],
        heldout_pool_base=t["heldout_pool_base"],
        heldout_tasks=t["heldout_tasks"],
        eval_every=t["eval_every"],
        lr=lr["lr"],
        clip_low=lr["clip_low"],
        clip_high=lr["clip_high"],
        aggregation=lr["aggregation"],
        learner=proto["protocol"].get("learner", "softmax"),
        eval_samples=t.get("eval_samples", 1),
        lm=dict(lr),
        staleness={str(k): int(v) for k, v in proto.get("staleness", {}).items()},
        stale_is_cap=float(lr.get("stale_is_cap", 2.0)),
    )
    for k, v in over.items():
        if v is not None:
            setattr(cfg, k, v)
    return cfg


def check_protocol(path: Path) -> str:
    """sha256 of the protocol file; raises `ConfigError` unless git tracks it unmodified."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ConfigError(f"protocol file {path} does not exist")
    cwd = str(path.parent)
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", path.name],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", path.name],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
    except OSError as e:
        raise ConfigError(f"cannot run git to check the protocol file: {e}") from e
    if tracked.returncode != 0:
        raise ConfigError(
            f"protocol file {path} is not committed (git does not track it): commit it before comparing arms"
        )
    if dirty.returncode != 0 or dirty.stdout.strip():
        raise ConfigError(
            f"protocol file {path} has uncommitted changes: commit them (a new protocol) before comparing arms"
        )
    return hashlib.sha256(path.read_bytes()).hexdigest()


def task_stream(cfg: LearnConfig, seed: int) -> list[list[str]]:
    """Each step's candidate task ids for `seed`: fresh (never offered twice), the same for every arm."""
    from trace_gym.sim import get_preset
    from trace_gym.sim.model import task_id

    preset = get_preset(cfg.preset)
    need = cfg.steps * cfg.candidates
    order = np.random.default_rng(stable_seed("learn-fresh", cfg.preset, seed)).permutation(need)
    pool = cfg.train_pool_base + seed
    ids = [task_id(preset, pool, int(i)) for i in order]
    return [ids[s * cfg.candidates : (s + 1) * cfg.candidates] for s in range(cfg.steps)]


def heldout_tasks(cfg: LearnConfig, seed: int) -> list[Any]:
    from trace_gym.sim import get_preset
    from trace_gym.sim.model import make_task

    preset = get_preset(cfg.preset)
    return [make_task(preset, cfg.heldout_pool_base + seed, i) for i in range(cfg.heldout_tasks)]


def _runner(cfg: LearnConfig, arm: str, seed: int, policy: Any) -> Any:
    from trace_gym.bench.alloc import parse_predictor
    from trace_gym.bench.sim_learner import LearnedValuePredictor, LearnerEnv

    from trace_gym.alloc import make_allocator
    from trace_gym.predict import make_predictor
    from trace_gym.runner import BranchingRunner, runner_config

    alloc_name, _, branching = cfg.arms[arm]
    allocator = make_allocator(alloc_name, m_max=cfg.m_max, group_size=cfg.group_size)
    holder: list[Any] = []
    gen = lambda: holder[0].policy  # noqa: E731 - the policy generating now (a snapshot when async)
    rc = runner_config(  # m_max, replay_cost: the protocol's
        cfg,
        root_budget=cfg.root_budget if branching else cfg.flat_roots,
        replays_per_root=cfg.replays_per_root if branching else 0.0,
        seed=seed,
    )
    if alloc_name == "oracle":
        pred = LearnedValuePredictor(gen)
    else:
        name, kw = parse_predictor(cfg.predictor)
        pred = make_predictor(name, **kw)
    kwargs = dict(
        preset=cfg.preset, num_tasks=cfg.steps * cfg.candidates, seed=cfg.train_pool_base + seed
    )
    runner = BranchingRunner(policy, lambda: LearnerEnv(gen, **kwargs), allocator, pred, rc)
    holder.append(runner)
    return runner


def _record(arm: str, seed: int, step: int, cands: list[str], rep: Any) -> dict[str, Any]:
    """The per-step fields of a record that come from the step's report."""
    return {
        "arm": arm,
        "seed": seed,
        "step": step,
        "tasks": hashlib.sha256(" ".join(cands).encode()).hexdigest()[:16],
        "accounted_cost": float(rep.accounted_cost),
        "measured_turns": int(rep.measured_turns),
        "generated_tokens": int(rep.generated_tokens),
        "roots": int(rep.roots),
        "replays": int(rep.replays),
    }


def _steps(cfg: LearnConfig, arm: str, seed: int, runner: Any, policy: Any) -> Any:
    """Each step's (candidates, trees, report, `Staleness` or None) - asynchronous (the
    producer of `trace_gym.async_rollouts`, ``cfg.staleness[arm]`` > 0) or not. The caller
    publishes its update after each step (the generator's ``send(None)``)."""
    from trace_gym.bench.sim_learner import Staleness

    from trace_gym.async_rollouts import AsyncRollouts

    stream = task_stream(cfg, seed)
    k = cfg.staleness.get(arm, 0)
    if k == 0:
        for step, cands in enumerate(stream):
            trees, rep = runner.run_step(step, cands)
            yield cands, trees, rep, None
        return
    with AsyncRollouts(
        runner, lambda s: stream[s], max_staleness=k, stop=len(stream), policy=policy
    ) as pipe:
        for step, cands in enumerate(stream):
            got = pipe.get(step)
            yield cands, got.trees, got.report, Staleness(got.policy, k, cfg.stale_is_cap)
            pipe.publish()


def run_arm(cfg: LearnConfig, arm: str, seed: int, tick: Any = None) -> list[dict[str, Any]]:
    """Per-step records of one (arm, seed): cost, turns, tokens, train reward, exact held-out success."""
    from trace_gym.bench.sim_learner import LearnedSimPolicy, exact_success, pg_update
    from trace_gym.trainers.losses import torch

    from trace_gym.tree import batch_metrics

    policy = LearnedSimPolicy(cfg.preset)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    held = heldout_tasks(cfg, seed)
    runner = _runner(cfg, arm, seed, policy)
    optimiser = cfg.arms[arm][1]
    records = [
        {
            "arm": arm,
            "seed": seed,
            "step": -1,
            "accounted_cost": 0.0,
            "measured_turns": 0,
            "generated_tokens": 0,
            "success": exact_success(policy, held),
        }
    ]
    try:
        for step, (cands, trees, rep, stale) in enumerate(_steps(cfg, arm, seed, runner, policy)):
            upd = pg_update(
                policy, opt, trees, optimiser, cfg.clip_low, cfg.clip_high, cfg.aggregation, stale
            )
            bm = batch_metrics(trees)
            last = step == cfg.steps - 1
            records.append(
                {
                    **_record(arm, seed, step, cands, rep),
                    "reward": float(bm["success_rate"]),
                    "effective_ratio": float(bm["effective_ratio"]),
                    **upd,
                    "success": exact_success(policy, held)
                    if last or (step + 1) % cfg.eval_every == 0
                    else None,
                }
            )
            if tick is not None:
                tick()
    finally:
        runner.close()
    return records
