"""Multi-env mixtures: one run, one budget, prompts from several envs at once.

`MixtureEnv` (``trace/Mixture-v0``) serves the tasks of several member envs as one task
pool: a task id is ``"<member env id>::<member task id>"``; `reset` routes to the
member, and checkpoints are the member's own (a replay restores into whichever member
took it). Every reset says which member it is (`MEMBER_KEY` in the reset info), so
each tree carries its member's env id - the policy formats a BFCL prompt as BFCL.

- **Candidate pools**: ``weights`` (member -> weight) split each step's candidates over
  the members (`mixture_candidates`, largest remainder, then a draw without replacement
  inside each member); without weights the draw is uniform over all tasks.
- **One budget, each env its own cost**: with ``RunnerConfig.rollout_cost = "turns"``
  (or ``"tokens"``) the runner keeps `RolloutCosts` - a running mean of turns (tokens)
  per root rollout of each member, seeded with the mixture's ``costs`` priors - and
  gives every candidate its member's cost relative to the step's mean; TRACE's root
  solver then maximises the expected mixed groups under sum cost x rollouts <= M
  (`trace_gym.alloc.solvers.solve_roots_costed`). A 30-turn BFCL rollout costs ten
  3-turn math ones.
- **Per-env figures**: `per_env_metrics(trees)` (effective ratio, success, turns,
  tokens, roots per member); the trainer logs them as ``env/<id>/<metric>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from trace_gym.core import Checkpoint, FreeText, TraceEnv, unwrap
from trace_gym.errors import CheckpointError, ConfigError, TaskNotFound
from trace_gym.tree import RolloutTree, batch_metrics

__all__ = [
    "MEMBER_KEY",
    "SEP",
    "MixtureEnv",
    "env_id_of",
    "RolloutCosts",
    "member_of",
    "member_task_id",
    "mixture_candidates",
    "per_env_metrics",
    "per_member",
    "flat_env_metrics",
]

#: reset-info key naming the member env of a mixture task
MEMBER_KEY = "mixture_member"
SEP = "::"
ROLLOUT_COSTS = ("flat", "turns", "tokens")


def member_task_id(task_id: str, reset_info: Mapping[str, Any]) -> str:
    """The id a policy sees: a mixture task's member-local id, any other task's own."""
    return str(task_id).partition(SEP)[2] if MEMBER_KEY in reset_info else str(task_id)


def env_id_of(described: Any, default: str) -> str:
    """The env a described task belongs to (its ``reset_info``): its member, else `default`.

    The runner asks the env instead (`trace_gym.core.TraceEnv.task_env_id`).
    """
    return str(described.reset_info.get(MEMBER_KEY) or default)


def member_of(task_id: str) -> str:
    """The member env id of a mixture task id ("trace/Math-v0::abc" -> "trace/Math-v0")."""
    member, sep, _ = str(task_id).partition(SEP)
    if not sep:
        raise TaskNotFound(f"{task_id!r} is not a mixture task id (expected 'ENV_ID{SEP}TASK_ID')")
    return member


class MixtureEnv(TraceEnv):
    """Several trace-gym envs behind one task pool (see the module docstring).

    `members`: env id -> its ``gym.make`` kwargs (or a list of ids; default the simulator
    alone); `weights`: env id -> candidate share; `costs`: env id -> prior cost of one
    rollout (e.g. expected turns).
    """

    env_id = "trace/Mixture-v0"

    def __init__(
        self,
        members: Mapping[str, Mapping[str, Any]] | Sequence[str] = ("trace/Sim-v0",),
        weights: Mapping[str, float] | None = None,
        costs: Mapping[str, float] | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=1, render_mode=render_mode)
        spec = (
            {m: {} for m in members}
            if not isinstance(members, Mapping)
            else {k: dict(v) for k, v in members.items()}
        )
        if len(spec) < 1:
            raise ConfigError("a mixture needs at least one member env")
        self.members = spec
        self.weights = _checked("weights", weights, spec)
        self.costs = _checked("costs", costs, spec)
        self._envs: dict[str, gym.Env] = {}
        self._ids: list[str] | None = None
        self._active: str | None = None
        self.observation_space, self.action_space = FreeText(), FreeText()

    def member(self, env_id: str) -> gym.Env:
        if env_id not in self.members:
            raise TaskNotFound(
                f"{env_id!r} is not a member of this mixture ({sorted(self.members)})"
            )
        if env_id not in self._envs:
            self._envs[env_id] = gym.make(env_id, **self.members[env_id])
        return self._envs[env_id]

    @property
    def task_ids(self) -> list[str]:
        if self._ids is None:
            self._ids = [
                f"{m}{SEP}{t}" for m in self.members for t in unwrap(self.member(m)).task_ids
            ]
        return self._ids

    @property
    def task_set(self) -> str:
        return "+".join(f"{m}[{unwrap(self.member(m)).task_set}]" for m in self.members)

    @property
    def active(self) -> TraceEnv:
        if self._active is None:
            raise TaskNotFound("no mixture task is active; call reset(options={'task': ...}) first")
        return unwrap(self.member(self._active))

    # what the checker and the runner read of the episode is the active member's
    @property
    def turn(self) -> int:
        return self.active.turn if self._active is not None else 0

    @property
    def done(self) -> bool:
        return self.active.done if self._active is not None else True

    @property
    def task_id(self) -> str | None:
        return None if self._active is None else f"{self._active}{SEP}{self.active.task_id}"

    def example_action(self, rng: np.random.Generator) -> str:
        return self.active.example_action(rng)

    def render(self) -> Any:
        return self.active.render()

    # the randomness a replay reseeds is the active member's
    @property
    def np_random(self) -> np.random.Generator:
        return self.active.np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        raise AttributeError("MixtureEnv.np_random is its active member's: call reseed(seed)")

    def reseed(self, seed: int) -> None:
        """Reseed the active member's RNG (what a replay does after restoring)."""
        if self._active is not None:
            self.active.reseed(seed)

    # the step protocol (`trace_gym.core.TraceEnv`): every task belongs to a member
    def task_env_id(self, reset_info: Mapping[str, Any]) -> str:
        """The member env a task belongs to (`MEMBER_KEY` in its reset info)."""
        return str(reset_info.get(MEMBER_KEY) or self.id)

    def policy_task_id(self, task_id: str, reset_info: Mapping[str, Any]) -> str:
        """The member's own task id (the part after `SEP`)."""
        return member_task_id(task_id, reset_info)

    @property
    def rollout_cost_priors(self) -> Mapping[str, float]:
        """The mixture's ``costs``: member env id -> prior cost of one rollout."""
        return self.costs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        gym.Env.reset(self, seed=seed)  # the mixture's own rng picks a task when none is given
        options = dict(options or {})
        task = options.get("task")
        if task is None:
            if (
                self._np_random is None
            ):  # reset(seed=None) before any seed: an unseeded draw, as gymnasium does
                self._np_random, _ = gym.utils.seeding.np_random()
            task = self.task_ids[int(self._np_random.integers(len(self.task_ids)))]
        member, _, inner = str(task).partition(SEP)
        self.member(member_of(str(task)))
        self._active = member
        prompt, info = self.member(member).reset(seed=seed, options={**options, "task": inner})
        return prompt, {**info, MEMBER_KEY: member}

    def step(self, action: str):
        self.active  # noqa: B018 - raises when no task is active
        return self.member(self._active).step(action)  # type: ignore[arg-type]

    def checkpoint(self) -> Checkpoint:
        return self.active.checkpoint()

    def restore(self, checkpoint: Checkpoint) -> None:
        """Restore into the member that took `checkpoint` (which validates it)."""
        if not isinstance(checkpoint, Checkpoint) or checkpoint.env_id not in self.members:
            got = getattr(checkpoint, "env_id", type(checkpoint).__name__)
            raise CheckpointError(
                f"{self.id}: restore() takes a Checkpoint of one of its members "
                f"{sorted(self.members)}, got one of {got!r}"
            )
        self.member(checkpoint.env_id)
        self._active = checkpoint.env_id
        self.active.restore(checkpoint)

    def release(self, checkpoint: Checkpoint) -> None:
        if checkpoint.env_id in self._envs:
            unwrap(self._envs[checkpoint.env_id]).release(checkpoint)

    def set_step(self, step: int) -> None:
        """Tell every member made so far the training step."""
        for env in self._envs.values():
            unwrap(env).set_step(step)

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()

    # the TraceEnv hooks are never reached: every public method delegates to a member
    def _reset_task(self, task_index: int):  # pragma: no cover - delegated
        raise NotImplementedError

    def _step(self, action: str):  # pragma: no cover - delegated
        raise NotImplementedError

    def _get_state(self):  # pragma: no cover - delegated
        raise NotImplementedError

    def _set_state(self, payload: Any) -> None:  # pragma: no cover - delegated
        raise NotImplementedError


def _checked(
    what: str, table: Mapping[str, float] | None, members: Mapping[str, Any]
) -> dict[str, float]:
    out = {str(k): float(v) for k, v in (table or {}).items()}
    unknown = sorted(set(out) - set(members))
    if unknown:
        raise ConfigError(
            f"mixture {what} name envs that are not members: {unknown} (members: {sorted(members)})"
        )
    bad = {
        k: v for k, v in out.items() if not np.isfinite(v) or v < 0 or (what == "costs" and v == 0)
    }
    if bad:
        raise ConfigError(
            f"mixture {what} must be finite and {'> 0' if what == 'costs' else '>= 0'}, got {bad}"
        )
    if what == "weights" and out and sum(out.values()) <= 0:
        raise ConfigError("mixture weights must not all be 0")
    return out


def mixture_candidates(
    task_ids: Sequence[str], weights: Mapping[str, float], k: int, rng: np.random.Generator
) -> list[str]:
    """`k` candidates split over the members by `weights` (largest remainder), sorted by task order."""
    by: dict[str, list[int]] = {}
    for i, t in enumerate(task_ids):
        by.setdefault(member_of(t), []).append(i)
    members = [m for m in by if weights.get(m, 0.0) > 0]
    if not members:
        raise ConfigError(f"no mixture member with weight > 0 has tasks ({sorted(by)})")
    w = np.array([weights[m] for m in members], dtype=float)
    want = k * w / w.sum()
    counts = np.floor(want).astype(int)
    for j in np.argsort(-(want - counts), kind="stable")[: k - counts.sum()]:
        counts[j] += 1
    picked: list[int] = []
    for m, n in zip(members, counts, strict=True):
        pool = by[m]
        picked += [
            pool[i] for i in rng.choice(len(pool), size=min(int(n), len(pool)), replace=False)
        ]
    return [task_ids[i] for i in sorted(picked)]


class RolloutCosts:
    """Running cost of one root rollout per env (turns or generated tokens), for the root solver."""

    def __init__(
        self, kind: str = "turns", priors: Mapping[str, float] | None = None, momentum: float = 0.5
    ):
        if kind not in ROLLOUT_COSTS[1:]:
            raise ConfigError(f"rollout cost must be one of {ROLLOUT_COSTS}, got {kind!r}")
        self.kind, self.momentum = kind, float(momentum)
        self.mean: dict[str, float] = dict(priors or {})

    def relative(self, env_ids: Sequence[str]) -> list[float]:
        """Each candidate's cost over the candidates' mean (unmeasured envs cost the mean)."""
        known = [self.mean[e] for e in env_ids if e in self.mean]
        fill = float(np.mean(known)) if known else 1.0
        raw = np.array([self.mean.get(e, fill) for e in env_ids], dtype=float)
        return list(raw / raw.mean()) if raw.size else []

    def update(self, trees: Sequence[RolloutTree]) -> None:
        """Fold this step's root rollouts into each env's running mean."""
        per: dict[str, list[float]] = {}
        for tree in trees:
            for first in tree.root.children:
                path = _chain(tree, first)
                if self.kind == "turns":
                    value = float(len(path))
                else:
                    turns = [t for n in path if (t := tree.nodes[n].turn) is not None]
                    value = float(sum(len(t.token_ids or ()) for t in turns))
                per.setdefault(tree.env_id, []).append(value)
        for env, values in per.items():
            m = float(np.mean(values))
            old = self.mean.get(env)
            self.mean[env] = m if old is None else self.momentum * old + (1 - self.momentum) * m

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "mean": dict(self.mean)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a `state_dict` of the same kind of cost."""
        if state["kind"] != self.kind:
            raise ConfigError(f"rollout costs of kind {state['kind']!r}, not {self.kind!r}")
        self.mean = {str(k): float(v) for k, v in state["mean"].items()}


def _chain(tree: RolloutTree, node_id: int) -> list[int]:
    out = [node_id]
    while tree.nodes[out[-1]].children:
        out.append(tree.nodes[out[-1]].children[0])
    return out


def per_env_metrics(trees: Sequence[RolloutTree]) -> dict[str, dict[str, float]]:
    """Effective ratio, success, turns, tokens, prompts and roots of each env's trees."""
    groups: dict[str, list[RolloutTree]] = {}
    for t in trees:
        groups.setdefault(t.env_id, []).append(t)
    out = {}
    for env, ts in sorted(groups.items()):
        bm = batch_metrics(ts)
        out[env] = {
            "prompts": bm["prompts"],
            "roots": float(sum(t.info.get("root_count", 0) for t in ts)),
            "effective_ratio": bm["effective_ratio"],
            "success": bm["success_rate"],
            "turns": bm["turns"],
            "tokens": bm["tokens"],
        }
    return out


def per_member(task_ids: Sequence[str], n: int | None) -> list[str]:
    """The first `n` task ids of each mixture member (of the list, for a plain env)."""
    if n is None:
        return list(task_ids)
    if not task_ids or SEP not in str(task_ids[0]):
        return list(task_ids[:n])
    seen: dict[str, int] = {}
    out = []
    for t in task_ids:
        m = member_of(t)
        if seen.get(m, 0) < n:
            seen[m] = seen.get(m, 0) + 1
            out.append(t)
    return out


def flat_env_metrics(trees: Sequence[RolloutTree]) -> dict[str, float]:
    """`per_env_metrics` as flat ``env/<id>/<metric>`` keys; empty for a single env."""
    table = per_env_metrics(trees)
    if len(table) < 2:
        return {}
    return {f"env/{env}/{k}": v for env, row in table.items() for k, v in row.items()}
