"""The rollout-worker actor: one shard of a step's prompts, roots and replays, on one process.

A `RolloutWorker` owns its env instances and its policy for the life of the actor.
Each step the driver sends it a shard of `PromptWork`s (roots already allocated, each
with its share of the continuation budget) plus snapshots of the predictor and the
allocator; the worker runs the same `StepScheduler` as the local runner over the shard,
with the same `trace_gym.plan.expand` hook: batched rounds, per-prompt expansion the
moment a prompt's roots are done, replays restored from checkpoints that never leave
this process. It answers with the finished trees and its `StepReport`.

This module does not import ray: the driver wraps the class with ``ray.remote`` (see
`trace_gym.distributed.runner`), so the class is also usable - and tested - in-process.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import gymnasium as gym

from trace_gym import plan
from trace_gym.budget import StepReport, Stopwatch
from trace_gym.errors import ConfigError
from trace_gym.runner import RunnerConfig, step_context
from trace_gym.scheduling import StepScheduler
from trace_gym.step import EnvPool, PromptWork, tell_step
from trace_gym.tree import RolloutTree

__all__ = [
    "RolloutWorker",
    "ShardResult",
    "WorkerPolicy",
    "current_worker",
    "dumps",
    "grow_shard",
    "loads",
]

#: index of the worker this process hosts (None outside a rollout-worker actor)
_CURRENT_WORKER: int | None = None


def current_worker() -> int | None:
    """The index of the rollout worker running in this process, or None in the driver."""
    return _CURRENT_WORKER


def dumps(obj: Any) -> bytes:
    """Pickle `obj` (lambdas and closures included) into one self-contained snapshot.

    Snapshots travel as plain bytes so the receiver unpickles a private, writable copy
    (Ray would otherwise hand out read-only numpy views of its object store).
    """
    from ray import cloudpickle

    return cloudpickle.dumps(obj)


def loads(data: bytes) -> Any:
    return pickle.loads(data)


class WorkerPolicy:
    """A policy built *on* each worker by ``factory(*args, **kwargs)`` instead of shipped.

    Use it for policies that hold something that cannot or should not travel: an
    in-actor HF/vLLM engine, or an OpenAI-compatible client
    (``WorkerPolicy(OpenAIPolicy, OpenAIConfig(base_url=..., model=...))``). The
    factory and its arguments must pickle (module-level callables do).
    """

    def __init__(self, factory: Callable[..., Any], *args: Any, **kwargs: Any):
        if not callable(factory):
            raise ConfigError(f"WorkerPolicy needs a callable factory, got {factory!r}")
        self.factory, self.args, self.kwargs = factory, args, kwargs

    def __repr__(self) -> str:
        return f"WorkerPolicy({getattr(self.factory, '__name__', self.factory)!r})"

    def build(self) -> Any:
        policy = self.factory(*self.args, **self.kwargs)
        if not callable(getattr(policy, "generate", None)):
            raise ConfigError(
                f"WorkerPolicy factory {self.factory!r} built {type(policy).__name__}, "
                "which has no generate(conversations) method"
            )
        return policy

    # the driver holds a WorkerPolicy where the local runner holds the policy
    def generate(self, conversations: Any) -> Any:
        raise ConfigError(
            "a WorkerPolicy only generates on the Ray workers; call WorkerPolicy.build() "
            "for a local copy"
        )


class ShardResult(NamedTuple):
    """What one worker sends back for one shard."""

    worker: int
    #: (PromptWork.order, finished tree) for every prompt of the shard
    trees: list[tuple[int, RolloutTree]]
    report: StepReport
    #: env instances this worker has made so far
    env_instances: int
    pid: int
    #: engine requests this shard re-sent because their engine died (engine pools only)
    rerouted: int = 0


def grow_shard(
    index: int,
    config: RunnerConfig,
    step: int,
    shard: list[PromptWork],
    policy: Any,
    pool: EnvPool,
    allocator: Any,
    predictor: Any,
    *,
    batched: bool = True,
) -> ShardResult:
    """Run every prompt of `shard` to a closed tree with the local scheduler (a Ray worker's
    shard, or one rank's share: `trace_gym.distributed.ranks.RankShardedRunner`).

    `batched`: give the scheduler the global-expansion hook (`plan.expand_all`) as the
    local runner does; the Ray worker passes False and expands prompt by prompt, as it
    always has (with an engine pool and the global barrier, its batched expansion grew
    other trees than the in-process reference, tests/distributed/test_engines.py; the
    cause is not found yet).
    """
    tell_step(step, pool, policy)
    sw = Stopwatch()
    report = StepReport(step=step, replay_cost=config.replay_cost)
    ctx = step_context(config, step, policy, pool, allocator, predictor, report, sw)
    expand_all = partial(plan.expand_all, ctx) if batched else None
    StepScheduler(ctx, partial(plan.expand, ctx), expand_all).run(shard)
    ctx.report.close(sw)
    return ShardResult(
        worker=index,
        trees=[(w.order, w.tree) for w in shard],
        report=ctx.report,
        env_instances=pool.made,
        pid=os.getpid(),
        rerouted=int(getattr(policy, "rerouted", 0)),
    )


class RolloutWorker:
    """Holds env instances and a policy; runs shards of a step with the local scheduler."""

    def __init__(
        self,
        index: int,
        env_factory: bytes,
        policy: bytes,
        config: RunnerConfig,
    ):
        global _CURRENT_WORKER
        _CURRENT_WORKER = int(index)
        self.index = int(index)
        self.config = config
        spec = loads(policy)
        factory: Callable[[], gym.Env] = loads(env_factory)
        self.policy = spec.build() if isinstance(spec, WorkerPolicy) else spec
        self.pool = EnvPool(factory)

    def ping(self) -> int:
        return os.getpid()

    def run_shard(
        self,
        step: int,
        works: bytes,
        allocator: bytes,
        predictor: bytes,
        policy: bytes | None = None,
    ) -> bytes:
        """Run every prompt of the shard to a closed tree; returns a pickled `ShardResult`."""
        if policy is not None:  # the driver's policy object, re-shipped with its latest weights
            self.policy = loads(policy)
        shard: list[PromptWork] = loads(works)
        result = grow_shard(
            self.index,
            self.config,
            step,
            shard,
            self.policy,
            self.pool,
            loads(allocator),
            loads(predictor),
            batched=False,
        )
        return dumps(result)

    def close(self) -> None:
        self.pool.close()
