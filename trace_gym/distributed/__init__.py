"""Distributed rollouts on Ray: the branching runner's step with prompts sharded over actors.

- `RayRunner` / `RayConfig`: same interface and same `RolloutTree`s as
  `trace_gym.runner.BranchingRunner`, rollouts and expansions on rollout-worker actors;
- `make_runner(..., ray_address=None | "local" | ADDRESS)`: one switch between the local
  runner and the Ray runner (what `trace-gym rollout --ray` and the trainer config use);
- `WorkerPolicy`: build the policy on each worker (an engine or a server client)
  instead of shipping the driver's object;
- `EnginePool` / `EngineClient` / `Engine` / `LocalEngines` (`trace_gym.distributed.engine`):
  generation-engine actors the workers call (``RayConfig.num_engines``), pushed the
  driver's policy by version, replaced when dead; `Latency` simulates per-request time;
- `RankShardedRunner` (`trace_gym.distributed.ranks`): the ranks of a torch.distributed
  job (accelerate, torchrun) split one step's prompts and all-gather the trees (what the
  TRL adapter uses under ``accelerate launch``);
- `trace_gym.distributed.testing`: fault injection and a fixed-latency policy;
- `trace_gym.bench.distributed`: `trace-gym bench alloc --ray` (throughput, 1 vs 2 workers);
  `trace_gym.bench.engines`: `... --ray --engines` (engine pool, per-prompt vs barrier).

Ray is optional (``pip install "trace-gym[ray]"``); nothing here imports it until a
`RayRunner` is built. See docs/distributed.md.
"""

from __future__ import annotations

from trace_gym.distributed.engine import Engine, EngineClient, EnginePool, Latency, LocalEngines
from trace_gym.distributed.ranks import RankShardedRunner
from trace_gym.distributed.runner import (
    DistributedStepReport,
    RayConfig,
    RayRunner,
    WorkerLost,
    import_ray,
    make_runner,
    shard_works,
)
from trace_gym.distributed.worker import RolloutWorker, WorkerPolicy, current_worker

__all__ = [
    "DistributedStepReport",
    "Engine",
    "EngineClient",
    "EnginePool",
    "Latency",
    "LocalEngines",
    "RayConfig",
    "RankShardedRunner",
    "RayRunner",
    "RolloutWorker",
    "WorkerLost",
    "WorkerPolicy",
    "current_worker",
    "import_ray",
    "make_runner",
    "shard_works",
]
