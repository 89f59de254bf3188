"""RankShardedRunner: one step's trees grown by all the ranks of a torch.distributed job.

For trainers that already run as W processes (``accelerate launch``, ``torchrun``, the
FSDP trainer with ``dist.rollouts = "all"``), each holding the same policy weights: every
rank calls `run_step` with the same global candidates, and

1. every rank scores the candidates and allocates the step's roots and replay shares
   itself - the same predictor state, visit histories and seed give the same plan on
   every rank (checked: the ranks' plans are all-gathered and must agree);
2. the selected prompts are split by `shard_works` (the Ray runner's split, balanced on
   accounted cost); rank r grows the trees of its shard with the local scheduler
   (`trace_gym.distributed.worker.grow_shard`, the code a Ray worker runs);
3. the finished trees and shard reports are all-gathered (``all_gather_object``; gloo on
   CPU), so every rank returns the *global* trees in candidate order, updates its visit
   histories and predictor on them alike, and stays in step for the next plan.

Trees do not depend on where a prompt ran (branch seeds, per-row generators), so the
trees equal a single `BranchingRunner`'s on the same inputs (tests/distributed/
test_ranks.py). With no process group (or one rank) it is a plain `BranchingRunner`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from trace_gym.alloc.base import Allocator
from trace_gym.budget import StepReport
from trace_gym.distributed.runner import (
    DistributedStepReport,
    WorkerLost,
    accept_shard,
    apportion_wait,
    shard_works,
)
from trace_gym.distributed.worker import ShardResult, grow_shard
from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.optional import require
from trace_gym.policy import Policy
from trace_gym.predict.base import Predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.step import PromptWork, StepContext

__all__ = ["Gather", "RankShardedRunner", "all_gather", "plan_fingerprint", "rank_world"]


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


#: gathers one picklable object from every rank, in rank order (`all_gather` by default)
Gather = Callable[[Any], list[Any]]


def plan_fingerprint(works: list[PromptWork]) -> list[tuple[int, str, int, int]]:
    """What every rank must agree on before rolling out: (order, prompt, roots, replay share)."""
    return [(w.order, w.tree.prompt_id, len(w.roots), int(w.replay_budget)) for w in works]


class RankShardedRunner(BranchingRunner):
    """`BranchingRunner` whose prompts are split over the ranks of a torch.distributed job.

    Every rank builds one with the same settings and calls `run_step` with the same
    candidates at the same step; each returns the same global trees. Rank, world size and
    the gather come from the initialised process group unless given (`rank`,
    `world_size`, `gather`: an FSDP trainer's own, or threads in a test). The plan is
    checked on every rank every step (every rank joins that gather, even one whose plan
    has no tree); an exception while a rank grows its shard is told to every rank in the
    trees' gather and every rank raises, so none is left waiting in a collective.
    """

    def __init__(
        self,
        policy: Policy,
        env_factory: Callable[[], gym.Env],
        allocator: Allocator,
        predictor: Predictor | None,
        config: RunnerConfig,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        gather: Gather | None = None,
    ):
        super().__init__(policy, env_factory, allocator, predictor, config)
        own_rank, own_world = rank_world()
        self.rank = own_rank if rank is None else int(rank)
        self.world = own_world if world_size is None else int(world_size)
        self.gather: Gather = all_gather if gather is None else gather

    @property
    def world_size(self) -> int:
        return self.world

    @classmethod
    def adopt(
        cls,
        runner: BranchingRunner,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        gather: Gather | None = None,
    ) -> RankShardedRunner:
        """One on `runner`'s parts (a trainer's `build_parts` runner); `runner` is closed."""
        runner.close()
        return cls(
            runner.policy,
            runner.pool.factory,
            runner.allocator,
            runner.predictor,
            runner.config,
            rank=rank,
            world_size=world_size,
            gather=gather,
        )

    def _new_report(self, step: int, candidates: int) -> StepReport:
        return DistributedStepReport(
            step=step,
            candidates=candidates,
            replay_cost=self.config.replay_cost,
            workers=self.world,
        )

    def _plan(self, ctx: StepContext, described: Any, history: Any) -> list[PromptWork]:
        """The local plan, checked against every rank's."""
        works = super()._plan(ctx, described, history)
        if self.world == 1:
            return works
        mine = plan_fingerprint(works)
        plans = self.gather(mine)
        bad = [r for r, p in enumerate(plans) if p != mine]
        if bad:
            raise ConfigError(
                f"step {ctx.step}: ranks {bad} planned other trees than rank {self.rank} (their "
                "candidates, seed, predictor, visit histories or allocator state differ); every "
                "rank must be built from one config and resume from one checkpoint"
            )
        return works

    def _run_works(self, ctx: StepContext, works: list[PromptWork]) -> int:
        """Grow this rank's shard, then all-gather every rank's trees into ``w.tree``."""
        if self.world == 1:
            return super()._run_works(ctx, works)
        t0 = time.perf_counter()
        shard = shard_works(works, self.world, self.config.replay_cost)[self.rank]
        error: Exception | None = None
        try:
            own: ShardResult | str = grow_shard(
                self.rank,
                self.config,
                ctx.step,
                shard,
                self.policy,
                self.pool,
                self.allocator,
                self.predictor,
            )
        except Exception as e:  # noqa: BLE001 - told to every rank, then raised
            error, own = e, f"{type(e).__name__}: {e}"
        results = self.gather(own)
        failed = [(r, x) for r, x in enumerate(results) if isinstance(x, str)]
        if failed:  # every rank raises, so none waits in a later collective
            if error is not None:
                raise error
            raise TraceGymError(
                f"step {ctx.step}: rank {failed[0][0]} failed growing its trees ({failed[0][1]})"
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
