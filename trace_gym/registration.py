"""The built-in env ids, registered with gymnasium's own registry on `import trace_gym`.

Entry points are "module:Class" strings, so nothing heavy is imported until `gym.make`.
Every id is registered with ``order_enforce=False`` and ``disable_env_checker=True``:
`gym.make` then returns the env itself (no `OrderEnforcing`, whose reset flag would
refuse `restore` into a fresh env, and no `PassiveEnvChecker`), so
``gym.make(id).checkpoint()`` works. Turn limits are the env's own, so no
``max_episode_steps`` is set either. `trace_gym.checkpoint(env)` /
`trace_gym.restore(env, ckpt)` reach the env through any wrappers a user adds.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

import gymnasium as gym


class EnvEntry(NamedTuple):
    id: str
    entry_point: str
    summary: str


#: each id is added by the issue that builds its env; nothing is listed that does not work
BUILTIN_ENVS: tuple[EnvEntry, ...] = (
    EnvEntry(
        "trace/Sim-v0",
        "trace_gym.sim.env:SimEnv",
        "tree-branching simulator: synthetic tasks with an exact success martingale (presets math/hotpotqa/bfcl)",
    ),
    EnvEntry(
        "trace/Math-v0",
        "trace_gym.envs.math.env:MathEnv",
        "tool-integrated math: a persistent sandboxed Python interpreter, \\boxed{} answers, math-verify reward",
    ),
    EnvEntry(
        "trace/HotpotQA-v0",
        "trace_gym.envs.hotpotqa.env:HotpotQAEnv",
        "multi-hop QA: <search> over a local Wikipedia index (BM25 default), <answer> scored by exact match",
    ),
    EnvEntry(
        "trace/BFCL-v0",
        "trace_gym.envs.bfcl.env:BFCLEnv",
        "BFCL v4 multi-turn function calling on the eight bfcl-eval backends, BFCL state/response checks",
    ),
    EnvEntry(
        "trace/Mixture-v0",
        "trace_gym.mixture:MixtureEnv",
        "several trace-gym envs as one task pool ('ENV_ID::TASK_ID'), per-env candidate weights and rollout costs",
    ),
    EnvEntry(
        "trace/Wrapped-v0",
        "trace_gym.wrap:WrappedEnv",
        "any gym-style text env made restorable (env='gem:<id>' | 'reasoning_gym:<dataset>' | "
        "'gym:<id>' | 'module:Factory'); seed + action-log replay",
    ),
)


def register_envs() -> None:
    """Register every built-in id (idempotent)."""
    for entry in BUILTIN_ENVS:
        if entry.id in gym.registry:
            continue
        gym.register(
            id=entry.id,
            entry_point=entry.entry_point,
            order_enforce=False,
            disable_env_checker=True,
        )


def env_ids() -> list[str]:
    return [e.id for e in BUILTIN_ENVS]


def check_env_kwargs(env_id: str, kwargs: Mapping[str, Any], where: str = "env_kwargs") -> None:
    """Raise a one-line `ConfigError` if `kwargs` holds an option the env's constructor (or
    ``gym.make``) does not take; imports the env's module, builds nothing."""
    from gymnasium.envs.registration import load_env_creator

    from trace_gym.plugins import check_kwargs

    check_env_id(env_id)
    spec = gym.spec(str(env_id).rpartition(":")[2])
    entry = spec.entry_point
    creator = load_env_creator(entry) if isinstance(entry, str) else entry
    if creator is None:  # a spec without an entry point: gym.make will say so
        return
    make_keys = set(inspect.signature(gym.make).parameters) - {"id", "kwargs"}
    check_kwargs(where, creator, kwargs, also=make_keys | set(spec.kwargs))


def check_env_id(env_id: str) -> None:
    """Raise `ConfigError` now if gymnasium cannot make `env_id` ("module:Id-vN" imports its module)."""
    import importlib

    from trace_gym.errors import ConfigError, did_you_mean

    register_envs()
    module, _, name = str(env_id).rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        gym.spec(name)
    except (ImportError, gym.error.Error) as e:
        raise ConfigError(
            f"unknown env id {env_id!r} ({e}){did_you_mean(env_id, env_ids())}; "
            f"built-in ids: {', '.join(env_ids())}"
        ) from e
