"""`check_checkpoint`: verify an env honours the restore contract.

Plays an episode, checkpoints at several turns, then for each checkpoint restores it
(into the same env, and - from a pickled copy - into a fresh instance of the same id)
and replays the recorded actions; observations, rewards, flags and info must be
identical, except the info keys the env declares volatile (``volatile_info_keys``).
It also runs gymnasium's own `check_env`.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from trace_gym.core import Checkpoint, TraceEnv, unwrap
from trace_gym.errors import CheckpointContractError

__all__ = ["CheckpointContractError", "check_checkpoint"]


@dataclass
class _StepRecord:
    obs: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _clean(info: dict[str, Any], volatile: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k not in volatile}


def _compare(where: str, want: _StepRecord, got: _StepRecord, volatile: frozenset[str]) -> None:
    for name in ("obs", "reward", "terminated", "truncated"):
        a, b = getattr(want, name), getattr(got, name)
        if not _equal(a, b):
            raise CheckpointContractError(
                f"{where}: {name} differs after restore:\n  expected {a!r}\n  got      {b!r}"
            )
    a, b = _clean(want.info, volatile), _clean(got.info, volatile)
    if not _equal(a, b):
        keys = sorted(k for k in a.keys() | b.keys() if not _equal(a.get(k), b.get(k)))
        raise CheckpointContractError(
            f"{where}: info differs after restore in keys {keys} "
            "(declare legitimately varying keys in the env's volatile_info_keys)"
        )


def _play(env: TraceEnv, actions: list[str]) -> list[_StepRecord]:
    out = []
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        out.append(_StepRecord(obs, r, term, trunc, info))
        if term or trunc:
            break
    return out


def _replay(
    env: TraceEnv,
    ck: Checkpoint,
    actions: list[str],
    records: list[_StepRecord],
    label: str,
    volatile: frozenset[str],
    *,
    check_length: str | None,
) -> None:
    """Restore `ck` into `env`, replay the recorded actions and compare every step."""
    t = ck.turn
    env.restore(ck)
    got = _play(env, actions[t:])
    for i, (w, g) in enumerate(zip(records[t:], got, strict=False)):
        _compare(f"restore at turn {t} ({label}), replayed step {t + i}", w, g, volatile)
    if check_length is not None and len(got) != len(records[t:]):
        raise CheckpointContractError(check_length)


def _record_episode(
    base: TraceEnv,
    act: Callable[[TraceEnv, np.random.Generator], str],
    rng: np.random.Generator,
    max_steps: int,
) -> tuple[list[str], list[_StepRecord], dict[int, Checkpoint]]:
    """Play one episode from the current reset, checkpointing after every live turn."""
    actions: list[str] = []
    records: list[_StepRecord] = []
    ckpts: dict[int, Checkpoint] = {0: base.checkpoint()}
    while len(actions) < max_steps and not base.done:
        actions.append(act(base, rng))
        records += _play(base, actions[-1:])
        if not base.done:
            ckpts[len(actions)] = base.checkpoint()
    return actions, records, ckpts


def _check_one(
    base: TraceEnv,
    fresh_env: gym.Env | None,
    ck: Any,
    t: int,
    actions: list[str],
    records: list[Any],
    volatile: frozenset[str],
) -> None:
    """Restore `ck` (taken after `t` turns) three ways and replay the rest of the episode."""
    if ck.turn != t:
        raise CheckpointContractError(f"checkpoint taken after {t} turns reports turn={ck.turn}")
    # same instance, fast handle allowed
    length = f"restore at turn {t}: episode length differs after restore"
    _replay(base, ck, actions, records, "same env", volatile, check_length=length)
    # same instance again through a pickled copy (portable payload only)
    copy = pickle.loads(pickle.dumps(ck))
    _replay(base, copy, actions, records, "pickled", volatile, check_length=None)
    if fresh_env is not None:
        length = f"restore at turn {t} (fresh env): episode length differs"
        copy = pickle.loads(pickle.dumps(ck))
        _replay(
            unwrap(fresh_env),
            copy,
            actions,
            records,
            "fresh env, pickled",
            volatile,
            check_length=length,
        )


def check_checkpoint(
    env: gym.Env,
    *,
    make_fresh: Callable[[], gym.Env] | None = None,
    seed: int = 0,
    task: int | str | None = None,
    max_steps: int = 12,
    num_checkpoints: int = 3,
    action_fn: Callable[[TraceEnv, np.random.Generator], str] | None = None,
    run_gym_check_env: bool = True,
) -> dict[str, Any]:
    """Verify the restore contract on `env`; raise `CheckpointContractError` on a violation.

    `make_fresh` builds a new instance of the same env (default: ``gym.make(env.spec.id,
    **env.spec.kwargs)`` when the env was made by gymnasium). `action_fn(env, rng)`
    gives the next action (default: the env's ``example_action``). Returns a small
    report (turns played, checkpoints checked).
    """
    base = unwrap(env)
    volatile = frozenset(base.volatile_info_keys)
    spec = base.spec
    if make_fresh is None and spec is not None:
        make_fresh = lambda: gym.make(spec.id, **(spec.kwargs or {}))  # noqa: E731
    act = action_fn or (lambda e, rng: e.example_action(rng))
    base.reset(seed=seed, options={"task": task} if task is not None else None)
    actions, records, ckpts = _record_episode(base, act, np.random.default_rng(seed), max_steps)
    # pick checkpoints spread over the episode (always the first and a late one)
    turns = sorted(ckpts)
    picked = sorted(
        {
            turns[round(i * (len(turns) - 1) / max(1, num_checkpoints - 1))]
            for i in range(num_checkpoints)
        }
    )

    fresh_env = make_fresh() if make_fresh is not None else None
    try:
        for t in picked:
            _check_one(base, fresh_env, ckpts[t], t, actions, records, volatile)
    finally:
        for ck in ckpts.values():
            base.release(ck)
        if fresh_env is not None:
            fresh_env.close()

    if run_gym_check_env:
        from gymnasium.utils.env_checker import check_env

        check_env(base, skip_render_check=True)
    return {
        "turns": len(actions),
        "checkpoints": picked,
        "terminated": bool(records and records[-1].terminated),
    }
