"""RayRunner: the `BranchingRunner` step with its prompts sharded over Ray rollout workers.

One step, split between the driver and the workers:

1. driver: score the candidates and allocate the M roots exactly as the local runner
   does (same code, same rngs), split the round(N * M) replays over the selected
   prompts by root count;
2. driver: shard the selected prompts over the live `RolloutWorker` actors, balancing
   accounted cost (roots + replay budget x replay cost), and ship each worker its shard
   plus this step's snapshots of the predictor, the allocator and (by default) the
   policy;
3. workers: run the local `StepScheduler` over their shard - batched rounds, each
   prompt expanded the moment its own roots finish, replays restored from checkpoints
   that never leave the worker - and send back closed trees and a `StepReport`;
4. driver: put the trees back in candidate order, update the visit histories and the
   predictor (one central update), merge the reports.

Predictor placement: **central, replicated by snapshot.** The predictor lives in the
driver; roots are scored there before dispatch. Prefix scoring happens on the workers
against a pickled snapshot of the predictor sent with every step. Within a step the
local runner never updates its predictor (one update after all trees close), so the
snapshot is exactly the model the local runner would query and the trees match.

Same seeds, same trees: every branch seed is a function of (run seed, step, prompt,
node, child, turn) and node ids do not depend on batching, so which worker ran a prompt
- and whether it ran twice - cannot change its tree.

Fault handling: a worker that dies mid-step (its process exits, its node goes away)
loses only its shard's partial work; those prompts are re-run from scratch on the
surviving workers (from the same per-branch seeds, so the trees are the ones the dead
worker would have made) and dead workers are replaced before the next step. A prompt
is re-run at most `RayConfig.max_retries` times. The step report lists the failures
and the re-run prompts. An exception *raised* on a worker (a bad allocator, say) is not
a lost worker: it is re-raised in the driver, as the local runner would raise it.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import gymnasium as gym

from trace_gym.alloc.base import Allocator
from trace_gym.budget import DEFAULT_REPLAY_COST, TIME_BUCKETS, Budget, StepReport, Stopwatch
from trace_gym.distributed.engine import EnginePool, Latency
from trace_gym.distributed.worker import RolloutWorker, ShardResult, WorkerPolicy, dumps, loads
from trace_gym.errors import (
    ConfigError,
    DependencyNotInstalled,
    EngineUnavailable,
    WorkerLost,
)
from trace_gym.plan import root_cost
from trace_gym.policy import Policy
from trace_gym.predict.base import Predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.step import PromptWork, StepContext

__all__ = [
    "DistributedStepReport",
    "RayConfig",
    "RayRunner",
    "WorkerLost",
    "accept_shard",
    "apportion_wait",
    "import_ray",
    "make_runner",
    "shard_works",
]

log = logging.getLogger(__name__)

INSTALL = 'pip install "trace-gym[ray]"'


def import_ray() -> Any:
    """The `ray` module, or `DependencyNotInstalled` with the install command."""
    try:
        import ray
    except ImportError as e:
        raise DependencyNotInstalled("ray", INSTALL) from e
    return ray


@dataclass
class RayConfig:
    """Where the Ray runner's workers run and how it survives losing one."""

    #: "local": start a private Ray instance here (or use the one already initialised);
    #: "auto" or "HOST:PORT" / "ray://HOST:PORT": join that running cluster
    address: str = "local"
    #: rollout-worker actors
    num_workers: int = 2
    #: CPUs / GPUs reserved per worker (a worker with an in-actor engine wants a GPU)
    worker_cpus: float = 1.0
    worker_gpus: float = 0.0
    #: times one prompt may be re-run after the worker running it died
    max_retries: int = 2
    #: re-ship the driver's policy object to the workers every step (so weight updates
    #: made by a trainer reach them); False ships it once. Ignored for a `WorkerPolicy`.
    sync_policy: bool = True
    #: CPUs of a local instance (None: all cores, at least enough for the workers)
    num_cpus: int | None = None
    #: seconds to wait for the workers to start (they may wait for free resources)
    start_timeout_s: float = 600.0
    #: extra keyword arguments for ``ray.init``
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    #: generation-engine actors shared by the workers (0: each worker holds its policy)
    num_engines: int = 0
    #: CPUs / GPUs reserved per engine actor
    engine_cpus: float = 1.0
    engine_gpus: float = 0.0
    #: "continuous" (each request on its own, `engine_slots` at once) or "batch" (one
    #: loop batching the queued requests, up to `engine_max_batch` conversations: HF)
    engine_batching: str = "continuous"
    engine_slots: int = 8
    engine_max_batch: int | None = None
    #: simulated per-conversation latency of an engine request (benchmarks): mean
    #: seconds and log-normal sigma (0: fixed)
    engine_latency_s: float = 0.0
    engine_latency_sigma: float = 0.0
    #: push weights instead of the pickled policy: "module:function" exporting them
    #: from the driver's policy and loading them into an engine's (trainers' sync code)
    engine_export: str | None = None
    engine_apply: str | None = None
    #: a `WorkerPolicy` each engine builds for itself (a `VLLMPolicy` on a local model
    #: directory, say) instead of a copy of the driver's policy; the driver's policy stays
    #: the source of versions and, with `engine_export`/`engine_apply`, of the weights
    #: pushed to the engines (without them only the step is)
    engine_policy: Any = None

    def __post_init__(self) -> None:
        if not self.address:
            raise ConfigError('RayConfig.address must be "local", "auto" or a cluster address')
        if self.num_workers < 1:
            raise ConfigError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.worker_cpus < 0 or self.worker_gpus < 0:
            raise ConfigError("worker_cpus and worker_gpus must be >= 0")
        if self.max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"num_cpus must be None or >= 1, got {self.num_cpus}")
        if self.start_timeout_s <= 0:
            raise ConfigError(f"start_timeout_s must be > 0, got {self.start_timeout_s}")
        if self.num_engines < 0 or self.engine_cpus < 0 or self.engine_gpus < 0:
            raise ConfigError("num_engines, engine_cpus and engine_gpus must be >= 0")
        if (self.engine_export is None) != (self.engine_apply is None):
            raise ConfigError("engine_export and engine_apply go together (both or neither)")
        Latency(self.engine_latency_s, self.engine_latency_sigma)  # validates
        if self.engine_policy is not None and not isinstance(self.engine_policy, WorkerPolicy):
            raise ConfigError(
                "engine_policy must be a WorkerPolicy (the engines build it themselves), "
                f"got {type(self.engine_policy).__name__}"
            )
        if self.engine_policy is not None and not self.num_engines:
            raise ConfigError("engine_policy needs num_engines >= 1")

    def engine_kwargs(self) -> dict[str, Any]:
        """`EnginePool` keyword arguments of these settings."""
        return dict(
            cpus=self.engine_cpus,
            gpus=self.engine_gpus,
            export=self.engine_export,
            apply=self.engine_apply,
            engine_policy=self.engine_policy,
            batching=self.engine_batching,
            slots=self.engine_slots,
            max_batch=self.engine_max_batch,
            latency=Latency(self.engine_latency_s, self.engine_latency_sigma),
        )


@dataclass
class DistributedStepReport(StepReport):
    """A `StepReport` plus where each tree was made and what had to be re-run."""

    #: live workers at the start of the step
    workers: int = 0
    #: prompt id -> index of the worker whose run produced its tree
    placement: dict[str, int] = field(default_factory=dict)
    #: prompt ids re-run because their worker died (once per re-run)
    retried_prompts: list[str] = field(default_factory=list)
    #: one entry per lost worker call: {"worker", "error", "prompts"}
    worker_failures: list[dict[str, Any]] = field(default_factory=list)
    #: wall time per bucket summed over the workers' successful shards
    worker_time_s: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(TIME_BUCKETS, 0.0)
    )
    #: live engine actors at the start of the step (0: no engine pool)
    engines: int = 0
    #: engine requests re-sent to another engine because theirs died
    engine_rerouted: int = 0
    #: prompts re-run because no engine was left to answer (once per re-run)
    engine_reruns: list[str] = field(default_factory=list)


#: StepReport fields the driver sets itself (never summed over workers)
_DRIVER_FIELDS = frozenset(
    {
        "step",
        "candidates",
        "selected",
        "roots",
        "root_charge",
        "replay_budget",
        "replay_cost",
        "accounted_cost",
        "wall_s",
        "env_instances",
        "largest_batch",
    }
)


def shard_works(
    works: Sequence[PromptWork], n: int, replay_cost: float = DEFAULT_REPLAY_COST
) -> list[list[PromptWork]]:
    """Split prompts over `n` workers, balancing accounted cost (deterministic).

    Longest-first greedy: each prompt (heaviest first, ties by candidate order) goes to
    the currently lightest worker (ties: lowest index); each shard keeps candidate order.
    """
    loads_ = [0.0] * n
    shards: list[list[PromptWork]] = [[] for _ in range(n)]
    cost = {
        w.order: root_cost(w) * Budget(len(w.roots), w.replay_budget, replay_cost).accounted()
        for w in works
    }
    for w in sorted(works, key=lambda w: (-cost[w.order], w.order)):
        i = min(range(n), key=lambda j: (loads_[j], j))
        shards[i].append(w)
        loads_[i] += cost[w.order]
    return [sorted(s, key=lambda w: w.order) for s in shards]


class _Worker:
    """The driver's handle on one rollout-worker actor."""

    def __init__(self, index: int, actor: Any):
        self.index, self.actor, self.alive = index, actor, True


class RayRunner(BranchingRunner):
    """`BranchingRunner` whose rollouts run on Ray actors; same interface, same trees.

    `policy` is shipped to every worker (it must pickle; with ``sync_policy`` it is
    re-shipped each step) or, wrapped in `WorkerPolicy`, built on each worker.
    `env_factory` must pickle too (lambdas and closures do, through cloudpickle); the
    driver also makes envs from it, to read prompts before allocating roots.
    """

    def __init__(
        self,
        policy: Policy | WorkerPolicy,
        env_factory: Callable[[], gym.Env],
        allocator: Allocator,
        predictor: Predictor | None,
        config: RunnerConfig,
        ray_config: RayConfig | None = None,
    ):
        super().__init__(policy, env_factory, allocator, predictor, config)
        self.ray = import_ray()
        self.ray_config = rc = ray_config or RayConfig()
        self._started_ray = False
        self._env_factory_blob = _snapshot(env_factory, "env_factory")
        self._policy_blob = _snapshot(policy, "policy")
        if not self.ray.is_initialized():
            if rc.address == "local":
                # Ray's CPUs are a scheduling count: never fewer than the workers reserve
                need = math.ceil(rc.num_workers * rc.worker_cpus + rc.num_engines * rc.engine_cpus)
                kw = dict(
                    include_dashboard=False,
                    log_to_driver=False,
                    num_cpus=rc.num_cpus or max(os.cpu_count() or 1, need),
                )
                self.ray.init(**{**kw, **rc.init_kwargs})
            else:
                self.ray.init(address=rc.address, **rc.init_kwargs)
            self._started_ray = True
        self._actor_cls = self.ray.remote(RolloutWorker)
        self._next_index = 0
        self._workers: list[_Worker] = []
        self._engines: EnginePool | None = None
        if rc.num_engines:  # the workers' policy is a client of the engine pool
            self._engines = EnginePool(self.ray, policy, rc.num_engines, **rc.engine_kwargs())
            self._policy_blob = dumps(self._engines.client())
        self._ensure_workers()
        try:  # fail here, not mid-step, when a worker cannot build its env or policy
            self.ray.get([w.actor.ping.remote() for w in self._workers], timeout=rc.start_timeout_s)
        except self.ray.exceptions.GetTimeoutError as e:
            free = self.ray.available_resources()
            self.close()
            raise ConfigError(
                f"{rc.num_workers} rollout workers ({rc.worker_cpus} CPU, {rc.worker_gpus} GPU "
                f"each) did not start within {rc.start_timeout_s:g} s; the cluster has {free} "
                "free. Lower num_workers / worker_cpus or add resources"
            ) from e
        except self.ray.exceptions.RayError as e:
            self.close()
            raise ConfigError(
                f"a rollout worker failed to start: {e}. The policy (or WorkerPolicy factory) "
                "and env_factory must be importable on the workers"
            ) from e

    # ------------------------------------------------------------------ workers
    @property
    def workers(self) -> list[int]:
        """Indices of the live rollout workers."""
        return [w.index for w in self._workers if w.alive]

    def _spawn(self) -> _Worker:
        rc = self.ray_config
        index, self._next_index = self._next_index, self._next_index + 1
        actor = self._actor_cls.options(
            num_cpus=rc.worker_cpus, num_gpus=rc.worker_gpus, max_restarts=0
        ).remote(index, self._env_factory_blob, self._policy_blob, self.config)
        return _Worker(index, actor)

    def _ensure_workers(self) -> None:
        """Replace dead workers so the pool is back to `num_workers`."""
        self._workers = [w for w in self._workers if w.alive]
        while len(self._workers) < self.ray_config.num_workers:
            self._workers.append(self._spawn())

    def close(self) -> None:
        """Stop the workers (and the Ray instance, if this runner started it)."""
        for w in self._workers:
            if w.alive:
                try:
                    self.ray.kill(w.actor)
                except Exception as e:  # noqa: BLE001 - already gone
                    log.debug("killing worker %d: %s", w.index, e)
        self._workers = []
        if self._engines is not None:
            self._engines.close()
        super().close()
        if self._started_ray and self.ray.is_initialized():
            self.ray.shutdown()
            self._started_ray = False

    # ------------------------------------------------------------------ step
    # `BranchingRunner.run_step` scores and allocates here; only the rollout stage
    # (`_run_works`) runs on the workers, and the predictor is updated here afterwards.
    def _new_report(self, step: int, candidates: int) -> DistributedStepReport:
        return DistributedStepReport(
            step=step, candidates=candidates, replay_cost=self.config.replay_cost
        )

    def _run_works(self, ctx: StepContext, works: list[PromptWork]) -> int:
        return self._dispatch(ctx.step, works, ctx.report, ctx.stopwatch)  # type: ignore[arg-type]

    def _dispatch(
        self, step: int, works: list[PromptWork], report: DistributedStepReport, sw: Stopwatch
    ) -> int:
        """Run every prompt on some worker exactly once; fills ``w.tree``; returns env count."""
        ray = self.ray
        self._ensure_workers()
        report.workers = len(self._workers)
        snap = self._snapshots(step)
        report.engines = len(self._engines.handles) if self._engines is not None else 0
        by_order = {w.order: w for w in works}
        attempts = dict.fromkeys(by_order, 0)
        done: dict[int, int] = {}  # order -> worker index
        pending: dict[Any, tuple[_Worker, list[PromptWork]]] = {}
        env_counts: dict[int, int] = {}

        def submit(shards: list[list[PromptWork]], targets: list[_Worker]) -> None:
            for worker, shard in zip(targets, shards, strict=True):
                if shard:
                    ref = worker.actor.run_shard.remote(
                        step, dumps(shard), snap["allocator"], snap["predictor"], snap["policy"]
                    )
                    pending[ref] = (worker, shard)

        live = [w for w in self._workers if w.alive]
        submit(shard_works(works, len(live), self.config.replay_cost), live)
        t0 = time.perf_counter()
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            worker, shard = pending.pop(ready[0])
            try:
                result: ShardResult = loads(ray.get(ready[0]))
            except _lost_worker_errors(ray) as e:
                lost = self._lost(worker, shard, e, attempts, report)
                live = self._live()
                submit(shard_works(lost, len(live), self.config.replay_cost), live)
                continue
            except ray.exceptions.RayTaskError as e:
                if not isinstance(getattr(e, "cause", None), EngineUnavailable):
                    raise e.as_instanceof_cause() from None
                self._engines_lost(shard, e, attempts, report, snap)
                submit([shard], [worker])
                continue
            accept_shard(result, by_order, done, report)
            env_counts[result.worker] = result.env_instances
        missing = [by_order[o].tree.prompt_id for o in by_order if o not in done]
        if missing:
            raise WorkerLost(f"no tree came back for prompts {missing} (internal error)")
        apportion_wait(report, sw, time.perf_counter() - t0)
        return sum(env_counts.values())

    def _snapshots(self, step: int) -> dict[str, Any]:
        """The allocator, predictor and (with ``sync_policy``) policy, put once per step.

        With an engine pool the policy goes to the engines instead (by version) and the
        workers get a client holding this step's engine handles and version.
        """
        ray = self.ray
        snap = {
            "allocator": ray.put(dumps(self.allocator)),
            "predictor": ray.put(dumps(self.predictor)),
            "policy": None,
        }
        if self._engines is not None:
            if self.ray_config.sync_policy or self._engines.pushed is None:
                self._engines.begin_step(step, self.policy)
            snap["policy"] = ray.put(dumps(self._engines.client()))
        elif self.ray_config.sync_policy and not isinstance(self.policy, WorkerPolicy):
            snap["policy"] = ray.put(_snapshot(self.policy, "policy"))
        return snap

    def _engines_lost(
        self,
        shard: list[PromptWork],
        error: BaseException,
        attempts: dict[int, int],
        report: DistributedStepReport,
        snap: dict[str, Any],
    ) -> None:
        """Every engine a worker knew died: replace them, re-run the shard (bounded)."""
        assert self._engines is not None
        ids = [w.tree.prompt_id for w in shard]
        log.warning(
            "no engine left to answer prompts %s; replacing the engines and re-running", ids
        )
        for w in shard:
            attempts[w.order] += 1
            if attempts[w.order] > self.ray_config.max_retries:
                raise WorkerLost(
                    f"engines died {attempts[w.order]} times while running prompt "
                    f"{w.tree.prompt_id!r}: {error}"
                ) from None
        self._engines.ensure()
        snap["policy"] = self.ray.put(dumps(self._engines.client()))
        report.engine_reruns.extend(ids)

    def _live(self) -> list[_Worker]:
        """The live workers; fresh ones when nobody is left (for the re-runs)."""
        live = [w for w in self._workers if w.alive]
        if not live:
            self._ensure_workers()
            live = list(self._workers)
        return live

    def _lost(
        self,
        worker: _Worker,
        shard: list[PromptWork],
        error: BaseException,
        attempts: dict[int, int],
        report: DistributedStepReport,
    ) -> list[PromptWork]:
        """Record a dead worker; returns its prompts for a re-run (or raises past max_retries)."""
        worker.alive = False
        try:  # an unreachable (not dead) actor must not keep running a shard nobody reads
            self.ray.kill(worker.actor)
        except Exception as e:  # noqa: BLE001 - already gone
            log.debug("killing worker %d: %s", worker.index, e)
        ids = [w.tree.prompt_id for w in shard]
        msg = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        log.warning("rollout worker %d died (%s); re-running prompts %s", worker.index, msg, ids)
        report.worker_failures.append({"worker": worker.index, "error": msg, "prompts": ids})
        over = []
        for w in shard:
            attempts[w.order] += 1
            if attempts[w.order] > self.ray_config.max_retries:
                over.append(w.tree.prompt_id)
        if over:
            raise WorkerLost(
                f"rollout workers died {self.ray_config.max_retries + 1} times while running "
                f"prompts {over}; last error: {msg}. Check the workers' logs (a prompt that "
                "crashes its process every time?) or raise RayConfig.max_retries"
            )
        report.retried_prompts.extend(ids)
        return shard


def accept_shard(
    result: ShardResult,
    by_order: dict[int, PromptWork],
    done: dict[int, int],
    report: DistributedStepReport,
) -> None:
    """Take one shard's trees and add its report into the step report."""
    for order, tree in result.trees:
        if order in done:
            raise WorkerLost(f"prompt {tree.prompt_id!r} came back twice (internal error)")
        done[order] = result.worker
        by_order[order].tree = tree
        report.placement[tree.prompt_id] = result.worker
    report.engine_rerouted += result.rerouted
    _merge(report, result.report)


def apportion_wait(report: DistributedStepReport, sw: Stopwatch, wait: float) -> None:
    """The driver's wait for the workers is spent the way the workers spent it."""
    busy = {k: v for k, v in report.worker_time_s.items() if k != "bookkeeping"}
    total = sum(report.worker_time_s.values())
    for k, v in busy.items():
        sw.seconds[k] += wait * v / total if total > 0 else 0.0


def _lost_worker_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """What a call raises when its worker process or node is gone (not when its code raised)."""
    ex = ray.exceptions
    return (ex.RayActorError, ex.WorkerCrashedError, ex.ObjectLostError)


def _snapshot(obj: Any, what: str) -> bytes:
    try:
        return dumps(obj)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same fix
        raise ConfigError(
            f"the {what} ({type(obj).__name__}) cannot be pickled for the Ray workers: {e}. "
            "Pass a WorkerPolicy(factory, ...) to build the policy on each worker instead"
        ) from e


def _merge(report: DistributedStepReport, part: StepReport) -> None:
    """Add one worker's shard report into the step report."""
    for f in fields(StepReport):
        name, value = f.name, getattr(part, f.name)
        if name in _DRIVER_FIELDS:
            continue
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            setattr(report, name, getattr(report, name) + value)
    report.largest_batch = max(report.largest_batch, part.largest_batch)
    for depth, n in part.replays_by_depth.items():
        report.replays_by_depth[depth] = report.replays_by_depth.get(depth, 0) + n
    # rounds in these events count the policy calls of the worker that ran the prompt
    report.events.extend(part.events)
    for k, v in part.time_s.items():
        report.worker_time_s[k] = report.worker_time_s.get(k, 0.0) + v


def make_runner(
    policy: Policy | WorkerPolicy,
    env_factory: Callable[[], gym.Env],
    allocator: Allocator,
    predictor: Predictor | None,
    config: RunnerConfig,
    *,
    ray_address: str | None = None,
    **ray_options: Any,
) -> BranchingRunner:
    """The local `BranchingRunner` (``ray_address=None``) or a `RayRunner` on that address.

    ``ray_address``: None (no Ray), "local" (a Ray instance on this machine) or a cluster
    address ("auto", "HOST:PORT", "ray://HOST:PORT"). `ray_options` are `RayConfig`
    fields (``num_workers=4``, ``worker_gpus=1``, ...).
    """
    if ray_address is None:
        if isinstance(policy, WorkerPolicy):
            policy = policy.build()
        if ray_options:
            log.debug("ignoring Ray options %s for the local runner", sorted(ray_options))
        return BranchingRunner(policy, env_factory, allocator, predictor, config)
    ray_config = RayConfig(address=ray_address, **ray_options)
    return RayRunner(policy, env_factory, allocator, predictor, config, ray_config)
