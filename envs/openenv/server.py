"""Any trace env as an OpenEnv environment server (``trace-gym serve-openenv ENV_ID``).

The app is OpenEnv's own (`openenv.core.create_fastapi_app`): ``/ws`` carries one
session per WebSocket (its own ``gym.make(ENV_ID, **kwargs)``), ``/reset``, ``/step``,
``/state``, ``/schema``, ``/health`` are OpenEnv's routes. Actions are `TraceAction`
(``message``: the assistant's text), observations `TraceObservation` (``text``, reward,
done, truncated, task id, turn, JSON-safe info).

Checkpoint, restore and release ride on the ``step`` message as calls, so any OpenEnv
client reaches them without a change to OpenEnv's wire protocol (its WebSocket loop
answers unknown message types with an error)::

    {"type": "step", "data": {"trace_call": "checkpoint"}}          -> observation.handle
    {"type": "step", "data": {"trace_call": "restore", "handle": h}} -> the observation at h
    {"type": "step", "data": {"trace_call": "release", "handle": h}}

A call does not count as a turn. Handles are opaque ids held by the session: released by
``release``, by ``reset`` (a new episode) and when the session closes. An env that
cannot checkpoint (not a `TraceEnv`, or before the first reset) answers with an error
whose message starts ``checkpoint refused:`` (`CHECKPOINT_REFUSED`); a client raises
`trace_gym.errors.CheckpointRefused` for it. The shape follows the checkpointable
environment proposed for OpenEnv (NeMo Gym issue 3245, ares PR 96): ``checkpoint()``
gives a handle with ``restore()`` and ``release()`` (`trace_gym.envs.openenv.client`).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym

from trace_gym.core import Checkpoint, TraceEnv
from trace_gym.errors import CheckpointError, CheckpointRefused, ConfigError
from trace_gym.optional import require

require("openenv.core", "openenv", what="OpenEnv (the `openenv` package)")

from openenv.core import Action, Environment, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402

__all__ = [
    "CHECKPOINT_REFUSED",
    "TraceAction",
    "TraceObservation",
    "TraceOpenEnv",
    "TraceState",
    "make_app",
]

log = logging.getLogger(__name__)

#: how a refusal's message starts on the wire (the client maps it to `CheckpointRefused`)
CHECKPOINT_REFUSED = "checkpoint refused:"
#: the most handles one session may hold (a client that never releases cannot fill memory)
MAX_HANDLES = 4096


class TraceAction(Action):
    """One assistant message, or a checkpoint call (``trace_call``) that is not a turn."""

    message: str = Field(default="", description="the assistant's message (one turn)")
    trace_call: Literal["checkpoint", "restore", "release"] | None = Field(
        default=None, description="a checkpoint call instead of a turn"
    )
    handle: str | None = Field(default=None, description="the handle restore/release act on")


class TraceObservation(Observation):
    """What the agent sees after reset, a turn or a call (reward/done/metadata: OpenEnv's)."""

    text: str = Field(default="", description="the observation text (the prompt on reset)")
    task_id: str | None = Field(default=None, description="the episode's task id")
    turn: int = Field(default=0, description="turns taken in the episode")
    truncated: bool = Field(default=False, description="ended by a turn limit, not the task")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info (JSON-safe)")
    handle: str | None = Field(default=None, description="checkpoint: the new handle")


class TraceState(State):
    """The session's env, task, turn and the handles it holds."""

    env_id: str = ""
    task_id: str | None = None
    turn: int = 0
    done: bool = True
    handles: list[str] = Field(default_factory=list)


def _json_safe(value: Any) -> Any:
    """`value` as plain JSON data (anything else becomes its str)."""
    return json.loads(json.dumps(value, default=str))


@dataclass(frozen=True)
class _Held:
    """One handle's checkpoint and the observation it was taken at (what restore answers)."""

    checkpoint: Checkpoint
    observation: TraceObservation


class TraceOpenEnv(Environment):
    """A trace env behind OpenEnv's `Environment` API, with checkpoint calls."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session makes its own env

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None):
        super().__init__()
        self.env_id = env_id
        self.env = gym.make(env_id, **(env_kwargs or {}))
        self.base = self.env.unwrapped
        self.handles: dict[str, _Held] = {}
        self.last = TraceObservation(done=True)

    # ------------------------------------------------------------- OpenEnv API
    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task: str | int | None = None,
        **kwargs: Any,
    ) -> TraceObservation:
        """A new episode (``task``: a task id or index, else drawn from ``seed``)."""
        self._release_all()
        options = {"task": task} if task is not None else None
        prompt, info = self.env.reset(seed=seed, options=options)
        extra = {"ignored_reset_args": sorted(kwargs)} if kwargs else {}
        self.last = TraceObservation(
            text=str(prompt),
            task_id=info.get("task_id"),
            info=_json_safe({**info, **extra}),
        )
        return self.last

    def step(
        self, action: TraceAction, timeout_s: float | None = None, **kwargs: Any
    ) -> TraceObservation:
        if action.trace_call is not None:
            return self._call(action)
        obs, reward, terminated, truncated, info = self.env.step(action.message)
        self.last = TraceObservation(
            text=str(obs),
            reward=float(reward),
            done=bool(terminated or truncated),
            truncated=bool(truncated),
            task_id=self.last.task_id,
            turn=int(info.get("turn", self.last.turn + 1)),
            info=_json_safe(info),
        )
        return self.last

    @property
    def state(self) -> TraceState:
        return TraceState(
            env_id=self.env_id,
            task_id=self.last.task_id,
            turn=self.last.turn,
            step_count=self.last.turn,
            done=self.last.done,
            handles=list(self.handles),
        )

    def close(self) -> None:
        self._release_all()
        self.env.close()

    # ------------------------------------------------------------- checkpoint calls
    def _call(self, action: TraceAction) -> TraceObservation:
        if action.trace_call == "checkpoint":
            return self.checkpoint()
        held = self.handles.get(action.handle or "")
        if held is None:
            raise CheckpointError(
                f"unknown checkpoint handle {action.handle!r}: released, or let go by a reset "
                "(handles live until release, the next reset or the end of the session)"
            )
        if action.trace_call == "release":
            self._release(action.handle or "")
            return self.last.model_copy(update={"handle": action.handle})
        assert isinstance(self.base, TraceEnv)  # a handle exists only for a TraceEnv
        self.base.restore(held.checkpoint)
        self.last = held.observation
        return self.last

    def checkpoint(self) -> TraceObservation:
        """Take a checkpoint; the observation carries its handle (or refuse, explicitly)."""
        if not isinstance(self.base, TraceEnv):
            raise CheckpointRefused(
                f"{CHECKPOINT_REFUSED} {type(self.base).__name__} ({self.env_id}) is not a "
                "TraceEnv and cannot be checkpointed; replay its actions instead"
            )
        if len(self.handles) >= MAX_HANDLES:
            raise CheckpointRefused(
                f"{CHECKPOINT_REFUSED} this session holds {MAX_HANDLES} handles; release some"
            )
        try:
            ckpt = self.base.checkpoint()
        except CheckpointError as e:
            raise CheckpointRefused(f"{CHECKPOINT_REFUSED} {e}") from e
        handle = uuid.uuid4().hex
        self.handles[handle] = _Held(ckpt, self.last)
        return self.last.model_copy(update={"handle": handle})

    def _release(self, handle: str) -> None:
        held = self.handles.pop(handle)
        if isinstance(self.base, TraceEnv):
            self.base.release(held.checkpoint)

    def _release_all(self) -> None:
        for handle in list(self.handles):
            self._release(handle)


# ---------------------------------------------------------------------- app and CLI
def make_app(
    env_id: str, env_kwargs: dict[str, Any] | None = None, *, max_sessions: int = 64
) -> Any:
    """OpenEnv's FastAPI app serving `env_id` (each WebSocket session: its own env)."""
    from trace_gym.registration import check_env_id

    check_env_id(env_id)
    try:  # bad kwargs fail here, in one line, not in the first session
        TraceOpenEnv(env_id, env_kwargs).close()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cannot make {env_id} with {env_kwargs or {}}: {e}") from e
    from openenv.core import create_fastapi_app

    def factory() -> TraceOpenEnv:
        return TraceOpenEnv(env_id, env_kwargs)

    factory.__name__ = f"TraceOpenEnv({env_id})"
    return create_fastapi_app(
        factory,
        TraceAction,
        TraceObservation,
        max_concurrent_envs=max_sessions,
        state_cls=TraceState,
    )
