"""RankShardedRunner: one step's trees grown by all the ranks of a torch.distributed job.

For trainers that already run as W processes (``accelerate launch``, ``torchrun``), each
holding the same policy weights (DDP): every rank calls `run_step` with the same global
candidates, and

1. every rank scores the candidates and allocates the step's roots and replay shares
   itself - the same predictor state, visit histories and seed give the same plan on
   every rank (checked: the ranks' plans are all-gathered and must agree);
2. the selected prompts are split by `shard_works` (the Ray runner's split, balanced on
   accounted cost); rank r grows the trees of its shard with the local scheduler;
3. the finished trees and shard reports are all-gathered (``all_gather_object``; gloo on
   CPU), so every rank returns the *global* trees in candidate order, updates its visit
   histories and predictor on them alike, and stays in step for the next plan.

Trees do not depend on where a prompt ran (branch seeds, per-row generators), so the
trees equal a single `BranchingRunner`'s on the same inputs (tests/distributed/
test_ranks.py). With no process group (or one rank) it is a plain `BranchingRunner`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import gymnasium as gym

from trace_gym import plan
from trace_gym.alloc.base import Allocator
from trace_gym.budget import StepReport, Stopwatch
from trace_gym.distributed.runner import (
    DistributedStepReport,
    WorkerLost,
    accept_shard,
    apportion_wait,
    shard_works,
)
from trace_gym.distributed.worker import ShardResult
from trace_gym.errors import ConfigError
from trace_gym.optional import require
from trace_gym.policy import Policy
from trace_gym.predict.base import Predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.scheduling import StepScheduler
from trace_gym.step import PromptWork, StepContext

__all__ = ["RankShardedRunner", "all_gather", "rank_world"]


def rank_world() -> tuple[int, int]:
    """(this process's rank, world size) of the initialised torch.distributed group, else (0, 1)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def all_gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (``[obj]`` without a process group)."""
    _, world = rank_world()
    if world == 1:
        return [obj]
    dist = require("torch", "train").distributed
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


class RankShardedRunner(BranchingRunner):
    """`BranchingRunner` whose prompts are split over the ranks of a torch.distributed job.

    Every rank builds one with the same settings and calls `run_step` with the same
    candidates at the same step; each returns the same global trees. Rank and world size
    are read from the initialised process group when the runner is built.
    """

    def __init__(
        self,
        policy: Policy,
        env_factory: Callable[[], gym.Env],
        allocator: Allocator,
        predictor: Predictor | None,
        config: RunnerConfig,
    ):
        super().__init__(policy, env_factory, allocator, predictor, config)
        self.rank, self.world = rank_world()

    def _new_report(self, step: int, candidates: int) -> StepReport:
        return DistributedStepReport(
            step=step,
            candidates=candidates,
            replay_cost=self.config.replay_cost,
            workers=self.world,
        )

    def _run_works(self, ctx: StepContext, works: list[PromptWork]) -> int:
        """Grow this rank's shard, then all-gather every rank's trees into ``w.tree``."""
        if self.world == 1:
            return super()._run_works(ctx, works)
        mine = _plan_of(works)
        plans = all_gather(mine)
        if any(p != mine for p in plans):
            raise ConfigError(
                f"step {ctx.step}: the ranks planned different allocations; every rank needs "
                "the same candidates, seed, predictor and visit histories "
                f"(rank 0 {plans[0][:3]}..., rank {self.rank} {mine[:3]}...)"
            )
        t0 = time.perf_counter()
        shard = shard_works(works, self.world, self.config.replay_cost)[self.rank]
        part, sw = StepReport(step=ctx.step, replay_cost=self.config.replay_cost), Stopwatch()
        sub = self.context(ctx.step, part, sw)
        if shard:
            StepScheduler(sub, partial(plan.expand, sub), partial(plan.expand_all, sub)).run(shard)
        part.close(sw)
        results: list[ShardResult] = all_gather(
            ShardResult(
                self.rank, [(w.order, w.tree) for w in shard], part, self.pool.made, os.getpid()
            )
        )
        by_order = {w.order: w for w in works}
        done: dict[int, int] = {}  # order -> rank
        for result in results:
            accept_shard(result, by_order, done, ctx.report)  # type: ignore[arg-type]
        missing = [w.tree.prompt_id for w in works if w.order not in done]
        if missing:
            raise WorkerLost(f"no rank sent the trees of prompts {missing} (internal error)")
        apportion_wait(ctx.report, ctx.stopwatch, time.perf_counter() - t0)  # type: ignore[arg-type]
        return sum(r.env_instances for r in results if r.worker != self.rank)


def _plan_of(works: list[PromptWork]) -> list[tuple[str, int, int]]:
    """What every rank must agree on: each selected prompt's roots and replay share."""
    return [(w.tree.prompt_id, len(w.roots), int(w.replay_budget)) for w in works]
