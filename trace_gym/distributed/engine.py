"""Generation engines: a pool of policy servers that env workers send their turns to.

An `Engine` holds one copy of the policy (an HF model, a vLLM engine, the simulator's
policy) and answers requests - lists of `Conversation`s - either

- ``"continuous"``: every request on its own, up to ``slots`` at once (a continuous-
  batching server such as vLLM, or a remote API; each request holds a slot for its own
  latency), or
- ``"batch"``: one loop that takes every request queued at that moment (up to
  ``max_batch`` conversations) into one ``policy.generate`` call (an in-process HF model,
  whose cost is a batched forward).

An optional `Latency` model makes each request wait a simulated time first, drawn per
conversation from its seed (fixed, or log-normal for heavy tails), so a benchmark can
measure scheduling - how busy the engines are kept - apart from this machine's cores.
Every engine counts its busy time, so an idle share can be reported.

Two hosts use the same `Engine`:

- `LocalEngines`: n engines in this process behind a thread pool (the local runner's
  streaming mode; the reference of the benchmarks);
- Ray: `EnginePool` (driver) starts ``ray.remote(Engine)`` actors and pushes the policy
  to them by version before each step; `EngineClient` (shipped to every env worker as
  its policy) routes each conversation to the least-loaded live engine and, when an
  engine dies mid-request, re-sends the request to another one. Requests are pure
  functions of the conversation (its seed included), so a re-sent request gets the
  answer the dead engine would have given.

Both expose ``submit(conversations) -> futures`` (one per conversation), which makes the
`trace_gym.scheduling.StepScheduler` stream: an episode's next turn is requested the
moment its previous one is back. This module does not import ray at import time.
"""

from __future__ import annotations

import importlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from trace_gym.distributed.worker import WorkerPolicy, dumps, loads
from trace_gym.errors import ConfigError, EngineUnavailable, PolicyError
from trace_gym.policy import Conversation, PolicyOutput, policy_version
from trace_gym.scheduling import set_step
from trace_gym.seeding import stable_seed

__all__ = [
    "BATCHING",
    "Engine",
    "EngineClient",
    "EnginePool",
    "Latency",
    "LocalEngines",
    "current_engine",
    "resolve",
]

log = logging.getLogger(__name__)

#: how many times in a row `EnginePool.ensure` replaces fresh engines that die at start-up
REPLACE_ROUNDS = 3

BATCHING = ("continuous", "batch")

#: index of the engine this process hosts (None outside an engine actor)
_CURRENT_ENGINE: int | None = None


def current_engine() -> int | None:
    """The index of the engine actor running in this process, or None."""
    return _CURRENT_ENGINE


def resolve(spec: str) -> Callable[..., Any]:
    """``"module:attr"`` -> the callable (how the core reaches trainers/agents code)."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigError(f"expected 'module:function', got {spec!r}")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot import {spec!r}: {e}") from e
    if not callable(fn):
        raise ConfigError(f"{spec!r} is not callable")
    return fn


@dataclass(frozen=True)
class Latency:
    """Simulated time one conversation's turn takes on an engine.

    ``mean_s * exp(sigma * z - sigma**2 / 2)`` with ``z`` standard normal, drawn from the
    conversation's seed (so a re-sent request waits as long): mean `mean_s` for any
    `sigma`; ``sigma = 0`` is a fixed latency, ``sigma >= 1`` a heavy tail.
    """

    mean_s: float = 0.0
    sigma: float = 0.0

    def __post_init__(self) -> None:
        if self.mean_s < 0 or self.sigma < 0:
            raise ConfigError(
                f"latency mean and sigma must be >= 0, got {self.mean_s}, {self.sigma}"
            )

    def of(self, conv: Conversation) -> float:
        if self.mean_s == 0:
            return 0.0
        if self.sigma == 0:
            return self.mean_s
        import numpy as np

        z = np.random.default_rng(stable_seed("latency", conv.seed)).standard_normal()
        return self.mean_s * math.exp(self.sigma * z - self.sigma**2 / 2)


class Engine:
    """One policy copy answering requests (see the module docstring)."""

    def __init__(
        self,
        index: int,
        policy: bytes | Any,
        *,
        batching: str = "continuous",
        slots: int = 8,
        max_batch: int | None = None,
        latency: Latency | None = None,
    ):
        global _CURRENT_ENGINE
        if batching not in BATCHING:
            raise ConfigError(f"engine batching must be one of {BATCHING}, got {batching!r}")
        if slots < 1 or (max_batch is not None and max_batch < 1):
            raise ConfigError("engine slots and max_batch must be >= 1")
        if isinstance(policy, bytes):  # an actor: this process hosts the engine
            _CURRENT_ENGINE = int(index)
            policy = loads(policy)
        self.index, self.batching, self.slots, self.max_batch = (
            int(index),
            batching,
            slots,
            max_batch,
        )
        self.latency = latency or Latency()
        self.policy = policy.build() if isinstance(policy, WorkerPolicy) else policy
        self.version: Any = policy_version(self.policy)
        self.busy_s, self.requests, self.conversations = 0.0, 0, 0
        self._lock = threading.Lock()  # policy calls, stats
        self._slots = threading.Semaphore(slots)
        self._queue: queue.Queue = queue.Queue()
        if batching == "batch":
            threading.Thread(target=self._batch_loop, daemon=True).start()

    @property
    def capacity(self) -> int:
        """Requests it serves at once (for the idle share)."""
        return self.slots if self.batching == "continuous" else 1

    def ping(self) -> int:
        return self.index

    def load(self, version: Any, step: int, payload: bytes, apply: str | None = None) -> Any:
        """Take the driver's policy (``apply`` None) or weights (``apply(policy, weights)``)."""
        data = loads(payload)
        with self._lock:
            if apply is None:
                self.policy = data.build() if isinstance(data, WorkerPolicy) else data
            elif data is not None:
                resolve(apply)(self.policy, data)
            set_step(self.policy, step)
            self.version = version
            if version is not None and hasattr(self.policy, "version"):
                self.policy.version = version
        return self.version

    def stats(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "busy_s": self.busy_s,
            "requests": self.requests,
            "conversations": self.conversations,
            "capacity": self.capacity,
            "version": self.version,
        }

    def generate(self, conversations: bytes | Sequence[Conversation]) -> Any:
        """Answer one request: (engine version, outputs); pickled when the request was."""
        pickled = isinstance(conversations, bytes)
        convs = list(loads(conversations) if isinstance(conversations, bytes) else conversations)
        if self.batching == "continuous":
            with self._slots:
                t0 = time.perf_counter()
                time.sleep(max((self.latency.of(c) for c in convs), default=0.0))
                with self._lock:
                    outs, version = list(self.policy.generate(convs)), self.version
                self._count(len(convs), time.perf_counter() - t0)
        else:
            box: Future = Future()
            self._queue.put((convs, box))
            outs, version = box.result()
        result = (version, outs)
        return dumps(result) if pickled else result

    def _count(self, n: int, busy: float) -> None:
        with self._lock:
            self.requests += 1
            self.conversations += n
            self.busy_s += busy

    def _batch_loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            size = len(batch[0][0])
            while not self._queue.empty() and (self.max_batch is None or size < self.max_batch):
                batch.append(self._queue.get_nowait())
                size += len(batch[-1][0])
            convs = [c for req, _ in batch for c in req]
            t0 = time.perf_counter()
            try:
                time.sleep(max((self.latency.of(c) for c in convs), default=0.0))
                with self._lock:
                    outs, version = list(self.policy.generate(convs)), self.version
            except Exception as e:  # noqa: BLE001 - every request of the batch sees it
                for _, box in batch:
                    box.set_exception(e)
                continue
            finally:
                busy = time.perf_counter() - t0
            with self._lock:
                self.busy_s += busy
                self.requests += len(batch)
                self.conversations += len(convs)
            k = 0
            for req, box in batch:
                box.set_result((outs[k : k + len(req)], version))
                k += len(req)


def _check(outs: list[PolicyOutput], n: int) -> list[PolicyOutput]:
    if len(outs) != n:
        raise PolicyError(f"engine returned {len(outs)} outputs for {n} conversations")
    return outs


class LocalEngines:
    """`n` engines in this process; ``submit`` answers on a thread pool (a streaming policy)."""

    def __init__(self, policy: Any, n: int = 1, **engine_kw: Any):
        if n < 1:
            raise ConfigError(f"need at least one engine, got {n}")
        self.engines = [Engine(i, policy, **engine_kw) for i in range(n)]
        self.version = self.engines[0].version
        threads = sum(e.slots for e in self.engines) + n
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="engine")
        self._outstanding = [0] * n
        self._lock = threading.Lock()

    def set_step(self, step: int) -> None:
        for e in self.engines:
            set_step(e.policy, step)

    def stats(self) -> list[dict[str, Any]]:
        return [e.stats() for e in self.engines]

    def submit(self, conversations: Sequence[Conversation]) -> list[Future]:
        return [self._one(c) for c in conversations]

    def _one(self, conv: Conversation) -> Future:
        with self._lock:
            i = min(range(len(self.engines)), key=lambda j: (self._outstanding[j], j))
            self._outstanding[i] += 1

        def run() -> PolicyOutput:
            try:
                return _check(self.engines[i].generate([conv])[1], 1)[0]
            finally:
                with self._lock:
                    self._outstanding[i] -= 1

        return self._pool.submit(run)

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        return [f.result() for f in self.submit(conversations)]

    def close(self) -> None:
        self._pool.shutdown(wait=False)


class EngineClient:
    """An env worker's policy: routes each conversation to a live engine actor.

    Shipped by the driver with this step's engine handles and policy `version`; an
    answer from an engine holding another version is an error (it would mislabel the
    tree). A request whose engine died is re-sent to the least-loaded live engine;
    with none left, its future fails with `EngineUnavailable` (the runner re-runs the
    prompt after replacing the engines).
    """

    def __init__(self, engines: Sequence[tuple[int, Any]], version: Any):
        self.engines = list(engines)
        self.version = version
        self.dead: set[int] = set()
        self.rerouted = 0
        self._outstanding = {i: 0 for i, _ in self.engines}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"engines": self.engines, "version": self.version}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["engines"], state["version"])  # type: ignore[misc]

    def submit(self, conversations: Sequence[Conversation]) -> list[Future]:
        out = []
        for conv in conversations:
            fut: Future = Future()
            self._send(conv, fut)
            out.append(fut)
        return out

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        return [f.result() for f in self.submit(conversations)]

    def _pick(self) -> tuple[int, Any] | None:
        with self._lock:
            live = [(i, h) for i, h in self.engines if i not in self.dead]
            if not live:
                return None
            i, h = min(live, key=lambda e: (self._outstanding[e[0]], e[0]))
            self._outstanding[i] += 1
            return i, h

    def _send(self, conv: Conversation, fut: Future) -> None:
        picked = self._pick()
        if picked is None:
            fut.set_exception(
                EngineUnavailable(f"every engine of {sorted(self._outstanding)} is gone")
            )
            return
        index, handle = picked
        ref = handle.generate.remote(dumps([conv]))
        ref.future().add_done_callback(lambda f: self._answered(index, conv, fut, f))

    def _answered(self, index: int, conv: Conversation, fut: Future, done: Future) -> None:
        import ray

        with self._lock:
            self._outstanding[index] -= 1
        try:
            version, outs = loads(done.result())
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            with self._lock:
                self.dead.add(index)
                self.rerouted += 1
            log.warning("engine %d died (%s); re-sending its request", index, type(e).__name__)
            self._send(conv, fut)
            return
        except ray.exceptions.RayTaskError as e:  # the policy raised: a policy error
            fut.set_exception(e.as_instanceof_cause())
            return
        except Exception as e:  # noqa: BLE001 - anything else is the request's failure
            fut.set_exception(e)
            return
        if version != self.version:
            fut.set_exception(
                PolicyError(
                    f"engine {index} answered with policy version {version!r}, "
                    f"this step's is {self.version!r}"
                )
            )
        else:
            fut.set_result(_check(outs, 1)[0])


class _Handle:
    def __init__(self, index: int, actor: Any):
        self.index, self.actor, self.alive = index, actor, True


class EnginePool:
    """The driver's engine actors: started, replaced when dead, given the policy by version.

    `policy` is the driver's policy object (or a `WorkerPolicy`, built on each engine
    and never re-pushed). Before each step, `begin_step` pushes it to every engine -
    only when its version changed (every step when it has none): the pickled policy, or
    with ``export``/``apply`` ("module:function" strings, e.g. the trainers' weight
    sync) the weights ``export(policy)`` returns, which each engine loads with
    ``apply(engine_policy, weights)``.

    With `engine_policy` (a `WorkerPolicy`) the engines build their own policy from it
    (a vLLM engine each, say) and `policy` - the trainer's, in the driver - is only the
    source of versions and of the weights ``export`` takes from it; without ``export``
    such engines are told the step and never pushed anything.
    """

    def __init__(
        self,
        ray: Any,
        policy: Any,
        n: int,
        *,
        cpus: float = 1.0,
        gpus: float = 0.0,
        export: str | None = None,
        apply: str | None = None,
        engine_policy: WorkerPolicy | None = None,
        **engine_kw: Any,
    ):
        if n < 1:
            raise ConfigError(f"num_engines must be >= 1, got {n}")
        self.ray, self.n, self.engine_kw = ray, n, engine_kw
        self.export, self.apply = export, apply
        #: the engines host their own policy: never replaced by a pickled driver policy
        self.own_policy = engine_policy is not None
        #: ... and are never pushed weights (no ``export``): told the step only, version None
        self._keeps_own = self.own_policy and export is None
        self._blob = dumps(engine_policy if engine_policy is not None else policy)
        self._options = dict(num_cpus=cpus, num_gpus=gpus, max_restarts=0, max_concurrency=256)
        self._actor_cls = ray.remote(Engine)
        self._next = 0
        self.version: Any = None if self._keeps_own else policy_version(policy)
        self.pushed: tuple[Any, int] | None = None  # (version, step) last pushed
        self._payload: bytes | None = None
        self._apply: str | None = None
        #: engines found dead and replaced; pushes of new weights (or policy objects)
        self.replaced = self.pushes = 0
        self.handles: list[_Handle] = []
        self.ensure()

    def _spawn(self) -> _Handle:
        index, self._next = self._next, self._next + 1
        actor = self._actor_cls.options(**self._options).remote(index, self._blob, **self.engine_kw)
        return _Handle(index, actor)

    def ensure(self, timeout_s: float = 600.0) -> None:
        """Ping every engine; replace the dead ones (fresh ones get the last push).

        A fresh engine that dies while it starts or loads (an engine killed in the first
        second of a step) is replaced again, up to `REPLACE_ROUNDS` times.
        """
        for h in self.handles:
            try:
                self.ray.get(h.actor.ping.remote(), timeout=timeout_s)
            except self.ray.exceptions.RayError:
                h.alive = False
        self._drop([h for h in self.handles if not h.alive])
        for _ in range(REPLACE_ROUNDS):
            fresh = [self._spawn() for _ in range(self.n - len(self.handles))]
            self.handles += fresh
            if not fresh:
                return
            if self.pushed is not None:
                version, step = self.pushed
                payload = self._payload or dumps(None)
                apply = self._apply if self._payload else _KEEP
                died = self._load(fresh, version, step, payload, apply, timeout_s)
            else:
                died = self._died(fresh, [h.actor.ping.remote() for h in fresh], timeout_s)
            if not died:
                return
            log.warning("engines %s died while starting; replacing them", [h.index for h in died])
            self._drop(died)
        raise EngineUnavailable(
            f"fresh engines died {REPLACE_ROUNDS} times in a row while starting; "
            "is the node out of memory or the engine crashing at start-up?"
        )

    def _drop(self, dead: Sequence[_Handle]) -> None:
        for h in dead:
            h.alive = False
        self.replaced += len(dead)
        self.handles = [h for h in self.handles if h.alive]

    def _died(
        self, handles: Sequence[_Handle], refs: Sequence[Any], timeout_s: float
    ) -> list[_Handle]:
        """Wait for one call per handle; the handles whose actor died meanwhile (other
        errors - the engine's own code raising, a timeout - propagate)."""
        errors = self.ray.exceptions
        died = []
        for h, ref in zip(handles, refs, strict=True):
            try:
                self.ray.get(ref, timeout=timeout_s)
            except (errors.RayActorError, errors.WorkerCrashedError):
                died.append(h)
        return died

    def _load(
        self,
        handles: Sequence[_Handle],
        version: Any,
        step: int,
        payload: bytes,
        apply: str | None,
        timeout_s: float = 600.0,
    ) -> list[_Handle]:
        refs = [h.actor.load.remote(version, step, payload, apply) for h in handles]
        return self._died(handles, refs, timeout_s)

    def begin_step(self, step: int, policy: Any) -> Any:
        """Push the driver's policy (by version) and the step to every engine; the version.

        An engine that dies during the push is replaced (`ensure`) and the fresh one
        gets this push.
        """
        # engines that keep the policy they built have no version the driver could give
        version = self.version = None if self._keeps_own else policy_version(policy)
        same = self.pushed is not None and version is not None and self.pushed[0] == version
        apply: str | None
        if (
            isinstance(policy, WorkerPolicy) or self._keeps_own or same
        ):  # nothing new to load: tell the step only
            payload, apply = dumps(None), _KEEP
        else:
            if self.export is not None:
                payload, apply = dumps(resolve(self.export)(policy)), self.apply
            else:
                payload, apply = dumps(policy), None
            self._payload, self._apply = payload, apply
            self.pushes += 1
        self.ensure()
        died = self._load(self.handles, version, step, payload, apply)
        self.pushed = (version, step)
        if died:
            log.warning("engines %s died during the push; replacing them", [h.index for h in died])
            self._drop(died)
            self.ensure()
        return version

    def client(self) -> EngineClient:
        return EngineClient([(h.index, h.actor) for h in self.handles if h.alive], self.version)

    def stats(self) -> list[dict[str, Any]]:
        return self.ray.get([h.actor.stats.remote() for h in self.handles if h.alive])

    def close(self) -> None:
        for h in self.handles:
            try:
                self.ray.kill(h.actor)
            except Exception as e:  # noqa: BLE001 - already gone
                log.debug("killing engine %d: %s", h.index, e)
        self.handles = []


def _keep(policy: Any, weights: Any) -> None:
    """The ``apply`` of a push that only moves the step: nothing to load."""


_KEEP = "trace_gym.distributed.engine:_keep"
