"""OpenEnv clients: a trace-gym server's typed client, and any OpenEnv env as a text env.

- `TraceEnvClient`: an OpenEnv `EnvClient` for ``trace-gym serve-openenv`` (what a
  TRL-style trainer holds), plus `checkpoint(client)` -> `RemoteCheckpoint` with
  ``restore()`` and ``release()``;
- `TraceToolEnvironment`: that client in the shape of TRL ``GRPOTrainer``'s
  ``environment_factory`` (``reset() -> str``, one tool ``act(message)``, ``get_reward()``).
- `OpenEnvTextEnv`: any OpenEnv server as the gym-style text env `trace_gym.wrap`
  wraps (``gym.make("trace/Wrapped-v0", env="openenv:http://127.0.0.1:8000")``):
  reset(seed) / step(str), and ``checkpoint()`` where the server offers the calls
  (a trace-gym server), refused with `CheckpointRefused` where it does not, so the
  wrapper replays with fingerprints instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trace_gym.errors import CheckpointError, CheckpointRefused, ConfigError
from trace_gym.optional import require

require("openenv.core", "openenv", what="OpenEnv (the `openenv` package)")

from openenv.core import EnvClient, GenericEnvClient  # noqa: E402
from openenv.core.client_types import StepResult  # noqa: E402
from trace_gym.envs.openenv.server import (  # noqa: E402
    CHECKPOINT_REFUSED,
    TraceAction,
    TraceObservation,
    TraceState,
)

__all__ = [
    "OpenEnvTextEnv",
    "RemoteCheckpoint",
    "TraceEnvClient",
    "TraceToolEnvironment",
    "checkpoint",
]


class TraceEnvClient(EnvClient[TraceAction, TraceObservation, TraceState]):
    """The typed OpenEnv client of a ``trace-gym serve-openenv`` server.

    ``step`` takes a `TraceAction` or the assistant's text. Use it synchronously
    (``TraceEnvClient(base_url=url).sync()``) for `checkpoint`.
    """

    def _step_payload(self, action: TraceAction | str) -> dict[str, Any]:
        if isinstance(action, str):
            action = TraceAction(message=action)
        return action.model_dump(exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TraceObservation]:
        fields = {**payload.get("observation", {}), "done": payload.get("done", False)}
        obs = TraceObservation(**fields, reward=payload.get("reward"))
        return StepResult(obs, reward=obs.reward, done=obs.done, metadata=obs.metadata)

    def _parse_state(self, payload: dict[str, Any]) -> TraceState:
        return TraceState(**payload)


@dataclass
class RemoteCheckpoint:
    """A checkpoint held by a server session: `restore` goes back to it, `release` frees it.

    Valid in the session (the client) that took it, until released or the next reset.
    """

    #: the sync client whose session holds the checkpoint
    client: Any
    #: the server's opaque id for it
    handle: str
    #: the step result the checkpoint was taken at
    result: Any
    #: who took it (`OpenEnvTextEnv` or the client): a wrapper restores only its own
    owner: Any = None

    def restore(self) -> Any:
        """Put the session back at the checkpoint; the step result there."""
        return _call(self.client, {"trace_call": "restore", "handle": self.handle})

    def release(self) -> None:
        """Free the checkpoint on the server (a second release is refused)."""
        _call(self.client, {"trace_call": "release", "handle": self.handle})


def _call(client: Any, data: dict[str, Any]) -> Any:
    """One checkpoint call; the server's refusal or error as ours."""
    action = TraceAction(**data) if isinstance(_async_of(client), TraceEnvClient) else data
    try:
        return client.step(action)
    except RuntimeError as e:
        if CHECKPOINT_REFUSED in str(e):
            raise CheckpointRefused(str(e)) from e
        raise CheckpointError(f"{data['trace_call']} failed on the server: {e}") from e


def _async_of(client: Any) -> Any:
    """The async `EnvClient` under a `SyncEnvClient` (or `client` itself)."""
    return getattr(client, "async_client", client)


def checkpoint(client: Any, owner: Any = None) -> RemoteCheckpoint:
    """Checkpoint a trace-gym server session through its (sync) OpenEnv client."""
    result = _call(client, {"trace_call": "checkpoint"})
    obs = result.observation
    handle = obs.handle if isinstance(obs, TraceObservation) else obs.get("handle")
    return RemoteCheckpoint(client, str(handle), result, owner if owner is not None else client)


class TraceToolEnvironment:
    """A served trace env as TRL's ``environment_factory`` expects one (one per rollout).

    ``GRPOTrainer(environment_factory=lambda: TraceToolEnvironment(url), ...)``: TRL calls
    `reset` (its text joins the prompt), exposes the public methods as tools (here `act`)
    and scores the rollout with `get_reward`. ``reset`` kwargs (``seed``, ``task``) go to
    the server.
    """

    def __init__(self, base_url: str):
        self.client = TraceEnvClient(base_url=base_url).sync()
        self.reward = 0.0
        self.done = False

    def reset(self, **kwargs: Any) -> str:
        self.reward, self.done = 0.0, False
        return self.client.reset(**kwargs).observation.text

    def act(self, message: str) -> str:
        """Send one message to the environment and read what it answers.

        Args:
            message: the assistant's message (code to run, a tool call or the final answer)
        """
        if self.done:
            return "The episode has ended; no further messages are read."
        result = self.client.step(message)
        self.reward, self.done = float(result.reward or 0.0), bool(result.done)
        return result.observation.text

    def get_reward(self) -> float:
        return self.reward


# ---------------------------------------------------------------------- the wrap side
def _http_url(url: str) -> str:
    url = url.rstrip("/")
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws):
            url = http + url[len(ws) :]
    if url.endswith("/ws"):
        url = url[: -len("/ws")]
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"openenv: {url!r} is not an http(s):// or ws(s):// server address")
    return url


def _text_fields(schema: dict[str, Any]) -> list[str]:
    """The string properties of a JSON schema, besides OpenEnv's own fields."""
    props = schema.get("properties", {})
    skip = {"metadata", "reward", "done", "trace_call", "handle"}
    return [k for k, v in props.items() if k not in skip and v.get("type") == "string"]


class OpenEnvTextEnv:
    """An OpenEnv server as a gym-style text env: ``reset(seed)`` / ``step(text)``.

    ``action_field`` is the action's text field and ``observation_field`` the
    observation's (both read from the server's ``/schema`` when it has exactly one
    string field; the observation is its JSON otherwise). ``timeout_s`` bounds each call.
    """

    def __init__(
        self,
        url: str,
        action_field: str | None = None,
        observation_field: str | None = None,
        timeout_s: float = 60.0,
    ):
        import requests

        self.url = _http_url(url)
        try:
            schema = requests.get(f"{self.url}/schema", timeout=timeout_s).json()
        except (requests.RequestException, ValueError) as e:
            raise ConfigError(f"openenv: no OpenEnv server at {self.url} ({e})") from e
        actions = _text_fields(schema.get("action", {}))
        self.action_field = action_field or (actions[0] if len(actions) == 1 else None)
        if self.action_field is None:
            raise ConfigError(
                f"openenv: {self.url}'s actions have text fields {actions}; say which with "
                "env_kwargs={'action_field': ...}"
            )
        texts = _text_fields(schema.get("observation", {}))
        self.observation_field = observation_field or ("text" if "text" in texts else None)
        if self.observation_field is None and len(texts) == 1:
            self.observation_field = texts[0]
        props = schema.get("action", {}).get("properties", {})
        self.checkpointable = "trace_call" in props  # a trace-gym server's calls
        self.client = GenericEnvClient(base_url=self.url, message_timeout_s=timeout_s).sync()

    def _text(self, result: Any) -> str:
        obs = dict(result.observation or {})
        if self.observation_field is not None:
            return str(obs.get(self.observation_field, ""))
        obs.pop("metadata", None)
        return json.dumps(obs, sort_keys=True, default=str)

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[str, dict[str, Any]]:
        result = self.client.reset(**({} if seed is None else {"seed": int(seed)}))
        return self._text(result), {"metadata": result.metadata or {}}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        result = self.client.step({self.action_field: action})
        truncated = bool((result.observation or {}).get("truncated", False))
        done = bool(result.done)
        reward = float(result.reward or 0.0)
        return self._text(result), reward, done and not truncated, truncated, {}

    def checkpoint(self) -> RemoteCheckpoint:
        """The server's checkpoint, or `CheckpointRefused` where it offers none."""
        if not self.checkpointable:
            raise CheckpointRefused(
                f"{CHECKPOINT_REFUSED} the OpenEnv server at {self.url} offers no checkpoint "
                "calls (only `trace-gym serve-openenv` does); restore replays instead"
            )
        return checkpoint(self.client, owner=self)

    def close(self) -> None:
        self.client.close()
