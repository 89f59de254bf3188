"""Policy wrappers for testing and benchmarking the Ray runner.

- `CrashOnCall`: deterministic fault injection - the wrapped policy's process exits on
  its k-th ``generate`` call, on one chosen rollout worker (or engine) only;
  `crash_on_call` builds one around a `WorkerPolicy` where it lands;
- `LatencyPolicy`: a simulated latency per ``generate`` call (fixed, or the engines'
  heavy-tailed one), so a benchmark measures how many calls run concurrently (or what
  overlaps them) rather than how fast these cores are.

Both delegate ``set_step`` to the wrapped policy and keep its outputs unchanged, so the
trees they produce equal the wrapped policy's. They live in the package (not in the
tests) because the workers must be able to import them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from trace_gym.distributed.worker import WorkerPolicy, current_worker
from trace_gym.errors import ConfigError
from trace_gym.policy import Conversation, PolicyOutput
from trace_gym.scheduling import set_step

__all__ = [
    "CrashOnCall",
    "LatencyPolicy",
    "crash_on_call",
    "export_answer_prob",
    "load_answer_prob",
]

log = logging.getLogger(__name__)


class _Wrapper:
    def __init__(self, policy: Any):
        if not callable(getattr(policy, "generate", None)):
            raise ConfigError(f"{type(policy).__name__} has no generate(conversations) method")
        self.policy = policy

    def set_step(self, step: int) -> None:
        set_step(self.policy, step)

    def __getattr__(self, name: str) -> Any:
        """Other attributes (``version``, ``llm`` for a weight push ...) are the wrapped policy's."""
        if name == "policy":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.policy, name)


class CrashOnCall(_Wrapper):
    """Kills the rollout-worker (or engine) process on its `call`-th ``generate`` call (1-based).

    Only on the worker whose index is `worker` (None: any worker) - or, with `engine`
    set, only in the engine actor of that index (`trace_gym.distributed.engine`); calls
    are counted from when the wrapper arrived in the process (the runner re-ships the
    policy each step with ``sync_policy``, so the count restarts every step). Outside a
    rollout worker / engine it never exits - it would kill the driver - and raises.
    """

    def __init__(
        self, policy: Any, call: int, worker: int | None = None, engine: int | None = None
    ):
        super().__init__(policy)
        if call < 1:
            raise ConfigError(f"call must be >= 1, got {call}")
        self.call, self.worker, self.engine, self.calls = int(call), worker, engine, 0

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        from trace_gym.distributed.engine import current_engine

        here = current_worker() if self.engine is None else current_engine()
        target = self.worker if self.engine is None else self.engine
        if (target is None and self.engine is None) or here == target:
            self.calls += 1
            if self.calls == self.call:
                if here is None:
                    raise RuntimeError(f"CrashOnCall: injected failure on call {self.calls}")
                log.warning("CrashOnCall: worker %s exits on call %d", here, self.calls)
                os._exit(1)
        return self.policy.generate(conversations)


def crash_on_call(
    policy: WorkerPolicy, call: int, worker: int | None = None, engine: int | None = None
) -> CrashOnCall:
    """`CrashOnCall` around a policy built here: ``WorkerPolicy(crash_on_call, inner, call=2,
    engine=0)`` makes engines that host their own policy (``RayConfig.engine_policy``, a
    vLLM engine each) crash as the wrapped driver policy would."""
    return CrashOnCall(policy.build(), call, worker=worker, engine=engine)


class LatencyPolicy(_Wrapper):
    """Sleeps a simulated latency per ``generate`` call, then answers with the wrapped policy.

    With ``sigma = 0`` every call waits `latency_s`. With ``sigma > 0`` each conversation's
    turn takes the engines' heavy-tailed `Latency` (log-normal, mean `latency_s`, drawn from
    the conversation's seed) and the call - one batched round - waits for its slowest
    conversation. Other attributes (``version``, ``snapshot`` ...) are the wrapped policy's.
    """

    def __init__(self, policy: Any, latency_s: float = 0.05, sigma: float = 0.0):
        super().__init__(policy)
        if latency_s < 0 or sigma < 0:
            raise ConfigError(f"latency_s and sigma must be >= 0, got {latency_s}, {sigma}")
        self.latency_s, self.sigma = float(latency_s), float(sigma)

    def wait_s(self, conversations: Sequence[Conversation]) -> float:
        """What one call on `conversations` waits."""
        if not self.sigma:
            return self.latency_s
        from trace_gym.distributed.engine import Latency

        lat = Latency(self.latency_s, self.sigma)
        return max((lat.of(c) for c in conversations), default=0.0)

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        time.sleep(self.wait_s(conversations))
        return self.policy.generate(conversations)


def export_answer_prob(policy: Any) -> float:
    """The "weights" of `trace_gym.testing`'s countdown policies (their ``answer_prob``), for
    tests of weight pushes by version (``RayConfig(engine_export=...)``)."""
    return float(policy.answer_prob)


def load_answer_prob(policy: Any, answer_prob: float) -> None:
    """Load what `export_answer_prob` exported into an engine's policy."""
    policy.answer_prob = answer_prob
