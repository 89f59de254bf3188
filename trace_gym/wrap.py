"""`wrap(env)`: make any Gymnasium-style text env restorable.

The wrapped env is a `TraceEnv`. Its tasks are inner seeds: task ``i`` is
``inner.reset(seed=seed_offset + i)``. Its checkpoint is that seed plus the log of the
actions taken since, with a digest of what each step returned; restore is
reset-and-replay, and every replayed step is compared with its digest, so an env
whose replay is not deterministic fails with a `CheckpointError` naming the step that
diverged (``check_checkpoint`` surfaces it). Faster paths, chosen by ``restore=``:

- ``"state"``: the env's own ``get_state()`` / ``set_state()`` (gem offers them on
  some envs); the state travels in the checkpoint, the action log stays as fallback;
- ``"copy"``: a ``copy.deepcopy`` of the inner env, kept as the checkpoint's
  process-local handle (dropped when pickled: a pickled checkpoint replays);
- ``"handle"``: the env's own ``checkpoint()``, returning a handle with ``restore()``
  and ``release()`` (the checkpointable-environment protocol proposed for OpenEnv in
  NeMo Gym issue 3245 and ares PR 96; an ``openenv:`` server run by ``trace-gym
  serve-openenv`` offers it). The handle is the checkpoint's process-local part, used
  only by the env that took it; a handle the env has let go (or one that crossed a
  process) falls back to replay, and an env whose ``checkpoint()`` raises
  `CheckpointRefused` is replayed from then on;
- ``"replay"``: always reset-and-replay; ``"auto"`` (default) is ``"state"`` when the
  env has both methods, else ``"handle"`` when it has ``checkpoint()``, else ``"replay"``.

Envs that draw from the global ``random`` / ``np.random`` generators (gem seeds them
in ``reset``) get their own copies: the wrapper swaps its generator states in around
every inner call and out again, so the caller's randomness cannot leak into a replay,
and the states are part of every checkpoint.

``env`` is an instance, a zero-argument factory, or a spec string (nothing is imported
until the env is made): ``"gem:<gem id>"`` (``gem.make``), ``"reasoning_gym:<dataset>"``
(a single-turn env over a reasoning-gym dataset, graded reward), ``"gym:<gymnasium id>"``
``"openenv:<server url>"`` (an OpenEnv server, `trace_gym.envs.openenv.client.OpenEnvTextEnv`;
needs the `openenv` extra) or ``"module:Factory"``.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import logging
import pickle
import random
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from trace_gym.core import TraceEnv, Transition
from trace_gym.errors import CheckpointError, CheckpointRefused, ConfigError
from trace_gym.optional import require
from trace_gym.policy import Conversation, PolicyOutput

__all__ = [
    "RESTORE_MODES",
    "ReasoningGymTextEnv",
    "WrappedEnv",
    "WrappedScripted",
    "make_inner",
    "replay_cost",
    "wrap",
]

log = logging.getLogger(__name__)

RESTORE_MODES = ("auto", "replay", "state", "copy", "handle")
_PEERS = 'pip install "trace-gym[peers]"  (gem-llm and reasoning-gym)'


# ---------------------------------------------------------------------- spec strings
def make_inner(spec: Any, **kwargs: Any) -> Any:
    """Build the inner env from an instance, a factory or a spec string (see module doc)."""
    if not isinstance(spec, str):
        if kwargs:
            raise ConfigError("env_kwargs only apply to a spec string or a factory")
        is_instance = not isinstance(spec, type) and callable(getattr(spec, "step", None))
        return spec if is_instance else spec()
    prefix, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ConfigError(
            f"env spec {spec!r} is not 'gem:<id>', 'reasoning_gym:<dataset>', 'gym:<id>', "
            "'openenv:<url>' or 'module:Factory'"
        )
    if prefix == "gem":
        return require("gem", _PEERS, what="gem (gem-llm)").make(rest, **kwargs)
    if prefix == "reasoning_gym":
        return ReasoningGymTextEnv(rest, **kwargs)
    if prefix == "gym":
        import gymnasium as gym

        return gym.make(rest, **kwargs)
    if prefix == "openenv":
        client = importlib.import_module("trace_gym.envs.openenv.client")
        return client.OpenEnvTextEnv(rest, **kwargs)
    try:
        factory = getattr(importlib.import_module(prefix), rest)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"env spec {spec!r}: cannot import {rest!r} from {prefix!r} ({e})") from e
    return factory(**kwargs)


class ReasoningGymTextEnv:
    """A reasoning-gym dataset as a single-turn text env: reset(seed) -> item seed % size.

    The answer is the last ``\\boxed{...}`` of the action (else the whole action) and the
    reward is the dataset's own ``score_answer`` (graded, in [0, 1]).
    """

    def __init__(self, dataset: str, size: int = 100, seed: int = 0, **config: Any):
        rg = require("reasoning_gym", _PEERS, what="reasoning-gym")
        self.name = dataset
        self.ds = rg.create_dataset(dataset, size=int(size), seed=int(seed), **config)
        self.size = int(size)
        self.entry: dict[str, Any] | None = None

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[str, dict[str, Any]]:
        self.entry = self.ds[int(seed or 0) % self.size]
        return str(self.entry["question"]), {"dataset": self.name}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.entry is None:
            raise CheckpointError("ReasoningGymTextEnv: call reset() before step()")
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        answer = found[-1] if found else action.strip()
        reward = float(self.ds.score_answer(answer=answer, entry=self.entry))
        return "", reward, True, False, {"answer": answer}

    def example_action(self, rng: np.random.Generator) -> str:
        """The gold answer half of the time, a wrong one otherwise."""
        gold = str((self.entry or {}).get("answer", ""))
        return f"\\boxed{{{gold if rng.random() < 0.5 else gold + '0'}}}"


# ---------------------------------------------------------------------- determinism
def _digest(obs: Any, reward: Any, terminated: Any, truncated: Any) -> str:
    text = repr((str(obs), float(reward), bool(terminated), bool(truncated)))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class _GlobalRngs:
    """The inner env's own copies of the global `random` and `np.random` states."""

    def __init__(self, seed: int):
        saved = random.getstate(), np.random.get_state()
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.state = (random.getstate(), np.random.get_state())
        random.setstate(saved[0])
        np.random.set_state(saved[1])

    @contextmanager
    def active(self) -> Iterator[None]:
        saved = random.getstate(), np.random.get_state()
        random.setstate(self.state[0])
        np.random.set_state(self.state[1])
        try:
            yield
        finally:
            self.state = (random.getstate(), np.random.get_state())
            random.setstate(saved[0])
            np.random.set_state(saved[1])


def _restore_mode(inner: Any, restore: str) -> str:
    """The restore path for `inner` (``restore="auto"``: the fastest it offers)."""
    name = type(inner).__name__
    has_state = all(callable(getattr(inner, m, None)) for m in ("get_state", "set_state"))
    if restore == "state" and not has_state:
        raise ConfigError(f"restore='state': {name} has no get_state/set_state")
    # the checkpointable-environment protocol: checkpoint() -> handle.restore()/.release()
    has_handle = callable(getattr(inner, "checkpoint", None))
    if restore == "handle" and not has_handle:
        raise ConfigError(f"restore='handle': {name} has no checkpoint()")
    if restore != "auto":
        return restore
    if has_state:
        return "state"
    return "handle" if has_handle and getattr(inner, "checkpointable", False) else "replay"


# ---------------------------------------------------------------------- the env
class WrappedEnv(TraceEnv):
    """A Gymnasium-style text env made restorable by seed + action-log replay.

    Without ``env`` it wraps the bundled Countdown test env, so ``gym.make("trace/Wrapped-v0")``
    works on a plain install. Rewards pass through raw; ``success_threshold`` (default
    1.0, exact success) is the success event allocation uses for this env's trees
    (announced in the reset info, see `trace_gym.tree.success_threshold_for`).
    """

    env_id = "trace/Wrapped-v0"

    def __init__(
        self,
        env: Any = "trace_gym.testing:CountdownEnv",
        *,
        env_kwargs: dict[str, Any] | None = None,
        num_tasks: int = 1000,
        seed_offset: int = 0,
        restore: str = "auto",
        success_threshold: float = 1.0,
        max_turns: int = 100,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if restore not in RESTORE_MODES:
            raise ConfigError(f"restore={restore!r}; choose one of {', '.join(RESTORE_MODES)}")
        if num_tasks < 1:
            raise ConfigError(f"num_tasks must be >= 1, got {num_tasks}")
        self.spec_string = env if isinstance(env, str) else None
        self.inner = make_inner(env, **(env_kwargs or {}))
        if not callable(getattr(self.inner, "step", None)) or not callable(
            getattr(self.inner, "reset", None)
        ):
            raise ConfigError(
                f"{type(self.inner).__name__} has no reset()/step(); wrap a gym-style env"
            )
        self.restore_mode = _restore_mode(self.inner, restore)
        if not 0.0 < success_threshold <= 1.0:
            raise ConfigError(f"success_threshold must be in (0, 1], got {success_threshold}")
        self.success_threshold = float(success_threshold)
        self.seed_offset = int(seed_offset)
        self._ids = tuple(str(i) for i in range(int(num_tasks)))
        self._name = (
            self.spec_string or f"{type(self.inner).__module__}.{type(self.inner).__qualname__}"
        )
        self._actions: list[str] = []
        self._digests: list[str] = []
        self._inner_truncated = False
        self._rngs = _GlobalRngs(0)
        self.replayed_steps = 0  # inner steps spent on replays (restore cost)

    # ------------------------------------------------------------- TraceEnv hooks
    @property
    def task_ids(self) -> Sequence[str]:
        return self._ids

    @property
    def task_set(self) -> str:
        return f"wrap:{self._name}:{self.seed_offset}:{len(self._ids)}"

    def _inner_seed(self) -> int:
        assert self._task_index is not None
        return self.seed_offset + self._task_index

    def _reset_inner(self) -> tuple[str, dict[str, Any]]:
        seed = self._inner_seed()
        self._rngs = _GlobalRngs(seed)
        with self._rngs.active():
            obs, info = self.inner.reset(seed=seed)
        return str(obs), dict(info or {})

    def _reset_task(self, task_index: int) -> tuple[str, dict[str, Any]]:
        prompt, info = self._reset_inner()
        self._actions, self._inner_truncated = [], False
        self._digests = [_digest(prompt, 0.0, False, False)]
        info = {"inner_seed": self._inner_seed(), "env_info": info}
        # peer rewards may be graded: the runner's trees count success at this threshold
        return prompt, {**info, "success_threshold": self.success_threshold}

    def _step(self, action: str) -> Transition:
        with self._rngs.active():
            obs, reward, terminated, truncated, info = self.inner.step(action)
        self._actions.append(action)
        self._digests.append(_digest(obs, reward, terminated, truncated))
        self._inner_truncated = bool(truncated) and not terminated
        return Transition(str(obs), float(reward), bool(terminated), {"env_info": dict(info or {})})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if self._inner_truncated and not (terminated or truncated):
            truncated, self._done = True, True
            info.setdefault("truncation", "inner")
        return obs, reward, terminated, truncated, info

    def _get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "seed": self._inner_seed(),
            "actions": tuple(self._actions),
            "digests": tuple(self._digests),
            "inner_truncated": self._inner_truncated,
            "rngs": pickle.dumps(self._rngs.state),  # bytes: comparable, never aliased
        }
        if self.restore_mode == "state":
            state["native"] = pickle.dumps(self.inner.get_state())
        return state

    def _local_handle(self) -> Any:
        if self.restore_mode == "copy":
            return copy.deepcopy(self.inner)
        if self.restore_mode != "handle":
            return None
        try:
            with self._rngs.active():
                return self.inner.checkpoint()
        except CheckpointRefused as e:  # said explicitly: replay from now on
            log.warning("%s: %s; restoring by replay", self._name, e)
            self.restore_mode = "replay"
            return None

    def _restore_local(self, handle: Any, payload: Any) -> bool:
        if self.restore_mode == "copy":
            self.inner = copy.deepcopy(handle)  # the checkpoint's copy stays untouched
        elif getattr(handle, "owner", self.inner) is not self.inner:
            return False  # another env's handle (another session): replay here
        else:
            try:
                with self._rngs.active():
                    handle.restore()
            except CheckpointError:  # let go (a reset, a release): replay instead
                return False
        self._load_log(payload)
        return True

    def release(self, checkpoint: Any) -> None:
        """Free a ``"handle"`` checkpoint's handle (a handle already let go is no error)."""
        handle = getattr(checkpoint, "local", None)
        if self.restore_mode == "handle" and handle is not None:
            try:
                handle.release()
            except CheckpointError:
                pass

    def _set_state(self, payload: dict[str, Any]) -> None:
        if "native" in payload:
            self.inner.set_state(pickle.loads(payload["native"]))
            self._load_log(payload)
            return
        self._replay(payload)

    # ------------------------------------------------------------- replay
    def _load_log(self, payload: dict[str, Any]) -> None:
        self._actions = list(payload["actions"])
        self._digests = list(payload["digests"])
        self._inner_truncated = payload["inner_truncated"]
        self._rngs.state = pickle.loads(payload["rngs"])

    def _replay(self, payload: dict[str, Any]) -> None:
        """Reset the inner env with the checkpoint's seed and re-run its actions."""
        actions, digests = payload["actions"], payload["digests"]
        if payload["seed"] != self._inner_seed():
            raise CheckpointError(f"{self._name}: checkpoint seed {payload['seed']} != task seed")
        prompt, _ = self._reset_inner()
        self._diverged_if(0, _digest(prompt, 0.0, False, False), digests[0], "reset")
        for k, action in enumerate(actions, start=1):
            with self._rngs.active():
                obs, reward, terminated, truncated, _ = self.inner.step(action)
            self.replayed_steps += 1
            self._diverged_if(
                k, _digest(obs, reward, terminated, truncated), digests[k], repr(action[:60])
            )
        self._load_log(payload)

    def _diverged_if(self, step: int, got: str, want: str, what: str) -> None:
        if got != want:
            raise CheckpointError(
                f"{self._name}: replay diverged at step {step} ({what}): the env returned a "
                f"different observation/reward/flags than when the checkpoint was taken, so it is "
                "not deterministic given its seed and actions. Make its randomness come from "
                "reset(seed=...) only, or give it get_state()/set_state() and wrap with "
                "restore='state'"
            )

    # ------------------------------------------------------------- players
    def example_action(self, rng: np.random.Generator) -> str:
        """The inner env's `example_action(rng)` or gem's `sample_random_action()`."""
        if callable(getattr(self.inner, "example_action", None)):
            return str(self.inner.example_action(rng))
        if callable(getattr(self.inner, "sample_random_action", None)):
            # gem samples from the global `random`: seed it from `rng` for this call only,
            # leaving both the caller's and the env's own generator states untouched
            saved = random.getstate()
            random.seed(int(rng.integers(2**31)))
            try:
                return str(self.inner.sample_random_action())
            except NotImplementedError:  # gem's base class declares it for every env
                pass
            finally:
                random.setstate(saved)
        return super().example_action(rng)

    def close(self) -> None:
        if callable(getattr(self.inner, "close", None)):
            self.inner.close()


class WrappedScripted:
    """A scripted policy for ``trace/Wrapped-v0``: replays the conversation, then plays.

    For each conversation it puts its own env copy at the conversation's state (reset
    on the task, then the conversation's actions) and returns the inner env's
    ``example_action`` (reasoning-gym: the gold answer half of the time; gem:
    ``sample_random_action``; a trace-gym env: its own), seeded by the conversation's
    seed. ``skill`` is accepted for the scripted-policy interface and not applied.
    """

    env_id = "trace/Wrapped-v0"

    def __init__(self, env: Any = None, skill: float = 0.8, **kwargs: Any):
        import gymnasium as gym

        self.env = env if env is not None else gym.make(self.env_id, **kwargs)
        self.skill = float(skill)
        self.calls = 0

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        self.calls += 1
        base: Any = self.env.unwrapped  # any env with example_action(rng)
        out = []
        for conv in conversations:
            try:
                base.reset(options={"task": conv.task_id})
                for turn in conv.turns:
                    base.step(turn.action)
                out.append(PolicyOutput(text=base.example_action(np.random.default_rng(conv.seed))))
            except Exception as e:  # a scripted bug must not take the batch down
                out.append(PolicyOutput(text="", error=f"scripted: {e!r}"))
        return out


def wrap(env: Any, **kwargs: Any) -> WrappedEnv:
    """Make `env` (an instance, factory or spec string) a restorable `TraceEnv`.

    Keyword arguments go to `WrappedEnv` (``num_tasks``, ``seed_offset``, ``restore``,
    ``max_turns``, ``env_kwargs``).
    """
    return WrappedEnv(env, **kwargs)


def replay_cost(env: Any) -> int:
    """Inner steps a `WrappedEnv` has spent replaying (0 for any other env)."""
    return int(getattr(getattr(env, "unwrapped", env), "replayed_steps", 0))
