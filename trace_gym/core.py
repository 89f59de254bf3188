"""The restorable text-environment contract: `TraceEnv` and `Checkpoint`.

A `TraceEnv` is a gymnasium env whose observations and actions are strings and whose
state at every turn boundary can be captured with `checkpoint()` and put back with
`restore()`. The contract, checked for every registered env by
`trace_gym.checker.check_checkpoint`:

    after ``env.restore(c)``, any action sequence yields exactly the observations,
    rewards, flags and info it would have yielded when ``c`` was taken.

Subclasses implement five small hooks (see `TraceEnv`); the base class owns the turn
counter, the turn limit (truncation), the env's own RNG (replaced only by `restore` and
`reseed`) and the checkpoint envelope - a versioned `Checkpoint` whose payload is an
`EnvSnapshot`, refused by `restore` with a `CheckpointError` when it is foreign (another
env id, class or task set) or stale (another `CHECKPOINT_VERSION`) - so no state lives
in wrappers.

A few methods with plain defaults are what the runner's env pool asks an env
(``set_step``, ``has_true_value``, ``task_env_id``, ``policy_task_id``,
``rollout_cost_priors``); the simulator and the mixture override them (docs/runner.md).
"""

from __future__ import annotations

import copy
import pickle
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from trace_gym.errors import (
    CheckpointError,
    ConfigError,
    InvalidAction,
    NotATraceEnv,
    ResetNeeded,
    TaskNotFound,
)

__all__ = [
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "EnvSnapshot",
    "FreeText",
    "TraceEnv",
    "Transition",
    "checkpoint",
    "restore",
    "unwrap",
]


class FreeText(gym.spaces.Space[str]):
    """A space of arbitrary strings (any characters, any length up to `max_length`).

    gymnasium's `Text` space only admits a fixed charset (no spaces or punctuation by
    default), which rejects ordinary assistant messages.
    """

    _SAMPLE_CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None):
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
        idx = self.np_random.integers(0, len(self._SAMPLE_CHARS), size=n)
        return "".join(self._SAMPLE_CHARS[i] for i in idx)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FreeText) and other.max_length == self.max_length

    def to_jsonable(self, sample_n: Iterable[str]) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: Sequence[str]) -> list[str]:
        return list(sample_n)


#: the checkpoint format `TraceEnv.restore` reads; one from another version is stale
CHECKPOINT_VERSION = 2


@dataclass(frozen=True)
class EnvSnapshot:
    """What the base class captures besides the turn and the task: the typed payload.

    `state` is the subclass's own (``_get_state``); the rest is the base class's.
    Reading it like the version-1 dict (``payload["state"]``) still works.
    """

    #: the env RNG's bit-generator state (``np_random.bit_generator.state``)
    rng: dict[str, Any]
    done: bool
    max_turns: int
    transcript: tuple[str, ...]
    #: the subclass's state: plain, picklable data (``_get_state()``)
    state: Any

    def __getitem__(self, key: str) -> Any:
        if key not in _SNAPSHOT_KEYS:
            raise KeyError(key)
        return getattr(self, key)


_SNAPSHOT_KEYS = frozenset(("rng", "done", "max_turns", "transcript", "state"))


@dataclass(frozen=True)
class Checkpoint:
    """An immutable, picklable snapshot of a `TraceEnv` at a turn boundary (versioned).

    `payload` is the env's state (an `EnvSnapshot` for the base class: plain data, never
    aliased with live objects). `env_class` names the class that took it and `version`
    the format (`CHECKPOINT_VERSION`); `restore` refuses a checkpoint of another env id,
    env class, task set or version with a `CheckpointError`. `local` is an optional
    process-local fast handle (e.g. a forked interpreter); it is dropped when the
    checkpoint is pickled, so a checkpoint that crossed a process boundary restores
    through the portable payload.
    """

    env_id: str
    task_set: str
    task_id: str
    turn: int
    payload: Any
    local: Any = field(default=None, compare=False, repr=False)
    #: ``module.qualname`` of the env class that took it
    env_class: str = ""
    #: checkpoint format version (`CHECKPOINT_VERSION` when taken by this release)
    version: int = CHECKPOINT_VERSION

    def __reduce__(self):
        return (_rebuild, self._portable())

    def _portable(self) -> tuple[Any, ...]:
        return (self.env_id, self.task_set, self.task_id, self.turn, self.payload) + (
            self.env_class,
            self.version,
        )

    def without_local(self) -> Checkpoint:
        """The portable part only (what a pickled copy carries)."""
        return _rebuild(*self._portable())


def _rebuild(
    env_id: str,
    task_set: str,
    task_id: str,
    turn: int,
    payload: Any,
    env_class: str = "",
    version: int = 1,
) -> Checkpoint:
    """Unpickle a `Checkpoint` (one pickled without a version is format 1: stale)."""
    return Checkpoint(
        env_id, task_set, task_id, turn, payload, env_class=env_class, version=version
    )


def class_name(obj: Any) -> str:
    """``module.qualname`` of `obj`'s class: what `Checkpoint.env_class` records."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


class Transition(NamedTuple):
    """What a subclass's `_step` returns; the base class adds turn-limit truncation."""

    observation: str
    reward: float
    terminated: bool
    info: dict[str, Any]


@runtime_checkable
class ExactValue(Protocol):
    """An env that knows the exact success probability of its current state (`trace/Sim-v0`)."""

    def true_value(self) -> float: ...


class TraceEnv(gym.Env[str, str]):
    """Base class of every trace-gym environment.

    Subclasses define:

    - ``task_ids`` (property): the ids of the tasks this instance serves, in order;
    - ``task_set`` (property): a short fingerprint of the task set (dataset + split),
      stored in checkpoints so a checkpoint cannot be restored into another task set;
    - ``_reset_task(task_index) -> (prompt, info)``: start an episode on one task;
    - ``_step(action) -> Transition``: run one assistant turn;
    - ``_get_state() -> payload`` / ``_set_state(payload)``: everything besides turn,
      task and RNG that determines the future (plain, picklable data).

    Optional: ``_local_handle()`` / ``_restore_local(handle, payload)`` for a fast,
    process-local snapshot; ``release(checkpoint)`` to free it; ``example_action(rng)``
    for a plausible action (used by the checker and the demo).

    The env's randomness comes only from ``self.np_random`` (seeded by ``reset(seed=)``),
    whose state is part of every checkpoint.
    """

    #: "ansi" renders the transcript; a text env has no frame rate, but gymnasium's checker
    #: warns on every env that declares render modes without one, so declare one frame per turn
    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}
    #: longest assistant message `step` passes to `_step` (characters); a longer one is
    #: answered by `_reject_action` as an observation. Set per instance (an env's
    #: ``max_action_chars=`` argument, or ``env.unwrapped.max_action_chars = n``).
    max_action_chars: int = 100_000
    #: the longest one step may take by configuration (a tool or interpreter timeout), in
    #: seconds; None when nothing in a step waits on a timeout (`trace-gym bench fuzz`)
    step_time_limit_s: float | None = None
    #: default registered id; `gym.make` overrides it through `self.spec`
    env_id: ClassVar[str] = "trace/Unknown-v0"
    #: info keys whose values may legitimately differ between replays (timings)
    volatile_info_keys: ClassVar[frozenset[str]] = frozenset({"elapsed_s", "timings"})

    def __init__(self, max_turns: int = 10, render_mode: str | None = None):
        if max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = int(max_turns)
        self.render_mode = render_mode
        self.observation_space = FreeText()
        self.action_space = FreeText()
        self._task_index: int | None = None
        self._turn = 0
        self._done = True
        self._transcript: list[str] = []

    # ----------------------------------------------------------------- subclass API
    @property
    def task_ids(self) -> Sequence[str]:
        raise NotImplementedError

    @property
    def task_set(self) -> str:
        return type(self).__name__

    def _reset_task(self, task_index: int) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def _step(self, action: str) -> Transition:
        raise NotImplementedError

    def _get_state(self) -> Any:
        raise NotImplementedError

    def _set_state(self, payload: Any) -> None:
        raise NotImplementedError

    def _local_handle(self) -> Any:
        return None

    def _restore_local(self, handle: Any, payload: Any) -> bool:
        """Restore from a fast local handle; return False to fall back to the payload."""
        return False

    def release(self, checkpoint: Checkpoint) -> None:
        """Free resources held by `checkpoint`'s local handle (no-op by default)."""

    def example_action(self, rng: np.random.Generator) -> str:
        """A plausible action for the current state (random text by default)."""
        return self.action_space.sample()

    def _reject_action(self, action: str, reason: str) -> Transition:
        """The turn for an action `step` refuses to parse (over `max_action_chars`).

        By default the env answers an empty message (which every env treats as one
        it cannot act on, so its own turn bookkeeping stays right) and the reason is
        put in front of the observation. Envs where an empty message means something
        (BFCL: "end the user turn") override this.
        """
        obs, reward, terminated, info = self._step("")
        head = f"Error: {reason}"
        return Transition(f"{head}\n{obs}" if obs else head, reward, terminated, info)

    # ----------------------------------------------------------------- public API
    @property
    def id(self) -> str:
        spec = getattr(self, "spec", None)
        return spec.id if spec is not None else self.env_id

    @property
    def turn(self) -> int:
        """Completed turns in the current episode."""
        return self._turn

    @property
    def task_id(self) -> str | None:
        return None if self._task_index is None else self.task_ids[self._task_index]

    @property
    def done(self) -> bool:
        return self._done

    def resolve_task(self, task: int | str | np.integer) -> int:
        """Map a task id or index to an index into `task_ids`."""
        ids = self.task_ids
        if isinstance(task, (int, np.integer)) and not isinstance(task, bool):
            if not -len(ids) <= int(task) < len(ids):
                raise TaskNotFound(
                    f"task index {task} is out of range for {self.id} ({len(ids)} tasks); "
                    f"pass an index in [0, {len(ids)}) or a task id"
                )
            return int(task) % len(ids)
        index = self._task_index_map().get(str(task))
        if index is None:
            raise TaskNotFound(
                f"unknown task id {task!r} for {self.id}; ids look like {list(ids[:3])!r} "
                f"(see env.unwrapped.task_ids)"
            )
        return index

    def _task_index_map(self) -> dict[str, int]:
        cache = self.__dict__.get("_task_index_cache")
        if cache is None or cache[0] is not self.task_ids:
            cache = (self.task_ids, {t: i for i, t in enumerate(self.task_ids)})
            self.__dict__["_task_index_cache"] = cache
        return cache[1]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        if "task" in options and options["task"] is not None:
            index = self.resolve_task(options["task"])
        else:
            index = int(self.np_random.integers(len(self.task_ids)))
        self._task_index = index
        self._turn = 0
        self._done = False
        prompt, info = self._reset_task(index)
        info = {"task_id": self.task_ids[index], "turn": 0, "max_turns": self.max_turns, **info}
        self._transcript = [f"[task {self.task_ids[index]}]\n{prompt}"]
        return prompt, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task_index is None:
            raise ResetNeeded(
                f"{self.id}: call env.reset() (or restore a checkpoint) before step()"
            )
        if self._done:
            raise ResetNeeded(
                f"{self.id}: the episode has ended (terminated or truncated); call env.reset() "
                "or restore a checkpoint to continue"
            )
        if not isinstance(action, str):
            raise InvalidAction(
                f"{self.id}: actions are strings (the assistant's message), got {type(action).__name__}"
            )
        if len(action) > self.max_action_chars:
            reason = (
                f"your message is {len(action)} characters long; the limit is "
                f"{self.max_action_chars}. Send a shorter message."
            )
            obs, reward, terminated, info = self._reject_action(action, reason)
            info = {**info, "error": "action_too_long", "action_chars": len(action)}
            action = f"{action[: self.max_action_chars]}... [{len(action)} characters, cut]"
        else:
            obs, reward, terminated, info = self._step(action)
        self._turn += 1
        truncated = (not terminated) and self._turn >= self.max_turns
        self._done = bool(terminated or truncated)
        info = {"turn": self._turn, **info}
        if truncated:
            info.setdefault("truncation", "turn_limit")
        self._transcript += [f"[assistant]\n{action}", f"[env]\n{obs}"]
        return obs, float(reward), bool(terminated), bool(truncated), info

    def checkpoint(self) -> Checkpoint:
        """Capture everything that determines the future of this episode."""
        if self._task_index is None:
            raise CheckpointError(f"{self.id}: nothing to checkpoint; call env.reset() first")
        snapshot = EnvSnapshot(
            rng=copy.deepcopy(dict(self.np_random.bit_generator.state)),
            done=self._done,
            max_turns=self.max_turns,
            transcript=tuple(self._transcript),
            state=self._get_state(),
        )
        return Checkpoint(
            env_id=self.id,
            task_set=self.task_set,
            task_id=self.task_ids[self._task_index],
            turn=self._turn,
            payload=snapshot,
            local=self._local_handle(),
            env_class=class_name(self),
        )

    def restore(self, checkpoint: Checkpoint) -> None:
        """Put the env back exactly where `checkpoint` was taken (works on a fresh instance).

        Raises `CheckpointError` for a checkpoint this env cannot take: not a `Checkpoint`,
        foreign (another env id, env class or task set, a task it does not have) or
        stale (another `CHECKPOINT_VERSION`).
        """
        index = self._check_restorable(checkpoint)
        snapshot: EnvSnapshot = checkpoint.payload
        self._task_index = index
        self._turn = checkpoint.turn
        self._done = snapshot.done
        self.max_turns = snapshot.max_turns
        self._transcript = list(snapshot.transcript)
        self._load_rng(snapshot.rng)
        if checkpoint.local is None or not self._restore_local(checkpoint.local, snapshot.state):
            self._set_state(snapshot.state)

    def _check_restorable(self, checkpoint: Any) -> int:
        """The index of `checkpoint`'s task, or the `CheckpointError` saying why not."""
        if not isinstance(checkpoint, Checkpoint):
            raise CheckpointError(
                f"{self.id}: restore() takes a Checkpoint from env.checkpoint(), got "
                f"{type(checkpoint).__name__}"
            )
        if checkpoint.env_id != self.id:
            raise CheckpointError(
                f"checkpoint was taken from {checkpoint.env_id!r} and cannot be restored into "
                f"{self.id!r}; restore it into an env made with gym.make({checkpoint.env_id!r})"
            )
        if checkpoint.version != CHECKPOINT_VERSION or not isinstance(
            checkpoint.payload, EnvSnapshot
        ):
            raise CheckpointError(
                f"stale checkpoint: format version {checkpoint.version} (payload "
                f"{type(checkpoint.payload).__name__}), but this trace-gym restores version "
                f"{CHECKPOINT_VERSION}; take a new checkpoint with this release"
            )
        if checkpoint.env_class != class_name(self):
            raise CheckpointError(
                f"checkpoint was taken by env class {checkpoint.env_class or '(unknown)'!r} and "
                f"cannot be restored into a {class_name(self)!r}; restore it into the same class"
            )
        if checkpoint.task_set != self.task_set:
            raise CheckpointError(
                f"checkpoint belongs to task set {checkpoint.task_set!r} but this {self.id} env "
                f"serves {self.task_set!r}; make the env with the same dataset/split arguments"
            )
        try:
            return self.resolve_task(checkpoint.task_id)
        except TaskNotFound as e:
            raise CheckpointError(
                f"checkpoint task {checkpoint.task_id!r} is not in this env"
            ) from e

    def reseed(self, seed: int) -> None:
        """Give the env a fresh RNG (PCG64) from `seed`, keeping everything else.

        What a replay does after restoring, so sibling replays from one prefix are
        independent draws rather than repeats of the restored randomness.
        """
        self.np_random = np.random.Generator(np.random.PCG64(int(seed)))

    def _load_rng(self, state: dict[str, Any]) -> None:
        """Put the RNG back to a saved bit-generator state (a checkpoint's)."""
        # gymnasium creates np_random lazily; make sure one exists before loading state
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = copy.deepcopy(state)
        self._np_random = rng

    # ----------------------------------------------------------------- step protocol
    # what the runner's env pool asks an env (`trace_gym.step.EnvPool`); the simulator
    # and the mixture override these, so no layer of the step names them
    def set_step(self, step: int) -> None:
        """Hear the training step (no-op; the simulator's skill drifts with it)."""

    @property
    def has_true_value(self) -> bool:
        """Whether the env offers ``true_value()``, its exact success probability (simulator)."""
        return callable(getattr(self, "true_value", None))

    def task_env_id(self, reset_info: Mapping[str, Any]) -> str:
        """The env a task belongs to, from its reset info: this env (a mixture: its member)."""
        return self.id

    def policy_task_id(self, task_id: str, reset_info: Mapping[str, Any]) -> str:
        """The task id a policy is shown for `task_id` (a mixture: the member's own id)."""
        return str(task_id)

    @property
    def rollout_cost_priors(self) -> Mapping[str, float] | None:
        """Env id -> prior cost of one root rollout, for ``rollout_cost`` (a mixture's)."""
        return None

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return "\n".join(self._transcript)
        return None


def unwrap(env: gym.Env) -> TraceEnv:
    """The `TraceEnv` under whatever wrappers `gym.make` (or the user) added."""
    base = env.unwrapped
    if not isinstance(base, TraceEnv):
        raise NotATraceEnv(
            f"{type(base).__name__} is not a TraceEnv and cannot be checkpointed; subclass "
            "trace_gym.core.TraceEnv (its five hooks give checkpoint/restore)"
        )
    return base


def checkpoint(env: gym.Env) -> Checkpoint:
    """`env.checkpoint()` through any wrappers (gymnasium 1.x wrappers do not forward it)."""
    return unwrap(env).checkpoint()


def restore(env: gym.Env, ckpt: Checkpoint) -> None:
    """`env.restore(ckpt)` through any wrappers."""
    unwrap(env).restore(ckpt)


def roundtrip(ckpt: Checkpoint) -> Checkpoint:
    """Pickle and unpickle a checkpoint, as if it crossed a process boundary."""
    return pickle.loads(pickle.dumps(ckpt))
