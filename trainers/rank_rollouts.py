"""Every FSDP rank grows its share of a step's trees (``dist.rollouts = "all"``).

`RankRunner` is the `BranchingRunner` step of a sharded run with W ranks. Every rank
holds the same runner state (predictor, visit histories, rollout costs, allocator: built
from one config and seed, then updated on the same trees), so every rank scores and
allocates the step identically - no broadcast of the plan is needed, and a fingerprint
of it is compared over the ranks each step so a divergence fails loudly instead of
training on mismatched batches. Then:

1. the selected prompts are split over the ranks with `trace_gym.distributed.shard_works`
   (the Ray runner's balance of accounted cost; deterministic, so every rank computes the
   same split);
2. each rank grows its shard with its own generator copy (`trace_gym.distributed.worker.grow_shard`,
   the code a Ray worker runs);
3. the finished trees and shard reports are all-gathered: every rank ends the step with
   the whole step's trees in candidate order and one merged report, then updates its
   predictor on all of them (the same update on every rank keeps the predictors equal).
   An exception raised while a rank grows its shard (a bad allocator, say: failed
   branches are data, not exceptions) is told to every rank in that gather and every
   rank raises, so no rank is left waiting in a collective.

Every branch seed is a function of (seed, step, prompt, node, child, turn) and node ids do
not depend on batching, so which rank grew a prompt cannot change its tree: the union is
the one-process step's trees (tests/distributed/test_fsdp_rollouts.py checks it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trace_gym.distributed.runner import (
    DistributedStepReport,
    _accept,
    _apportion_wait,
    shard_works,
)
from trace_gym.distributed.worker import ShardResult, grow_shard
from trace_gym.errors import TraceGymError
from trace_gym.runner import BranchingRunner
from trace_gym.step import PromptWork, StepContext

__all__ = ["RankRunner", "plan_fingerprint"]

#: gathers one picklable object from every rank (``torch.distributed.all_gather_object``)
Gather = Callable[[Any], list[Any]]


def plan_fingerprint(works: list[PromptWork]) -> list[tuple[int, str, int, int]]:
    """What every rank must agree on before rolling out: (order, prompt, roots, replay budget)."""
    return [(w.order, w.tree.prompt_id, len(w.roots), w.replay_budget) for w in works]


class RankRunner(BranchingRunner):
    """A `BranchingRunner` whose rollout stage runs this rank's shard and gathers the others'."""

    def __init__(self, *args: Any, rank: int, world_size: int, gather: Gather, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rank, self.world_size, self.gather = rank, world_size, gather

    @classmethod
    def adopt(
        cls, runner: BranchingRunner, *, rank: int, world_size: int, gather: Gather
    ) -> RankRunner:
        """A `RankRunner` on `runner`'s parts (the one `build_parts` made); `runner` is closed."""
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

    def _new_report(self, step: int, candidates: int) -> DistributedStepReport:
        return DistributedStepReport(
            step=step, candidates=candidates, replay_cost=self.config.replay_cost
        )

    def _plan(self, ctx: StepContext, described: Any, history: Any) -> list[PromptWork]:
        """The local plan, checked against every rank's (every rank plans every step, so
        every rank joins this gather, even one whose plan has no tree)."""
        works = super()._plan(ctx, described, history)
        mine = plan_fingerprint(works)
        plans = self.gather(mine)
        bad = [r for r, p in enumerate(plans) if p != plans[0]]
        if bad:
            raise TraceGymError(
                f"step {ctx.step}: ranks {bad} planned other trees than rank 0 (their predictor, "
                "histories or allocator state differ); every rank must be built from one config "
                "and resume from one checkpoint"
            )
        return works

    def _run_works(self, ctx: StepContext, works: list[PromptWork]) -> int:
        report: DistributedStepReport = ctx.report  # type: ignore[assignment]
        t0 = time.perf_counter()
        shard = shard_works(works, self.world_size, self.config.replay_cost)[self.rank]
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
        report.workers = self.world_size
        by_order = {w.order: w for w in works}
        done: dict[int, int] = {}
        for result in results:
            _accept(result, by_order, done, report)
        if len(done) != len(works):
            raise TraceGymError(f"step {ctx.step}: trees missing after the gather (internal error)")
        _apportion_wait(report, ctx.stopwatch, time.perf_counter() - t0)
        return sum(r.env_instances for r in results) - self.pool.made
