"""The step's shared records: the env pool, `Episode`, `PromptWork`, `StepContext`.

One runner step (docs/runner.md) passes these records down its layers: the runner
builds a `StepContext` and the planner (`trace_gym.plan`) builds the `PromptWork` of each
selected prompt with its root `Episode`s; the scheduler (`trace_gym.scheduling`) runs
the episodes and the records fill in. Who writes what:

- an `Episode` is a frozen `EpisodeSpec` (what the planner decided: kind, anchor, child,
  env seed, prefix) plus its run state, which only its own methods change (`record`,
  `end`, `fail`) and the scheduler drives;
- a `PromptWork` owns its prompt's tree; only its methods write the tree
  (`insert` the finished episodes' turns, `take_replays` the planner's `ReplayPlan`);
- the step's `StepReport` (`trace_gym.budget`) changes only through its named update
  methods (``count_*``, ``note_plan``, ``close``) in the runner, the planner's records
  and the scheduler (the Ray driver's merge of worker reports and the verl adapter,
  which replaces the scheduler, still write fields themselves);
- `EnvPool` holds the env instances and is the one place the step asks an env what it
  is: its id, whether it knows exact values (``has_true_value``), which member env a
  task belongs to and what id the policy sees (a mixture's, `trace_gym.mixture`), its
  rollout-cost priors, and the training step (``set_step``). Those are `TraceEnv`
  methods the simulator and the mixture override, so no layer above names either.

This module decides nothing and runs nothing; it imports nothing from the layers above.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from trace_gym.budget import Budget, StepReport, Stopwatch
from trace_gym.core import Checkpoint, TraceEnv, unwrap
from trace_gym.errors import ConfigError
from trace_gym.policy import Policy
from trace_gym.predict.base import State
from trace_gym.tree import Failure, RolloutTree, Turn

__all__ = [
    "EXPANSIONS",
    "EnvPool",
    "Episode",
    "EpisodeSpec",
    "PromptWork",
    "ReplayPlan",
    "StepContext",
    "StepReport",
    "set_step",
    "tell_step",
]

#: when a prompt's prefixes are expanded: the moment its own roots are done (the paper's
#: schedule), or only after every root of the step (a global barrier; same allocations)
EXPANSIONS = ("per-prompt", "global")


# ---------------------------------------------------------------------- env pool
class EnvPool:
    """Env instances from `factory`; any free instance serves any restore.

    The env protocol the step reads (``env_id``, ``has_true_value``, ``task_env_id``,
    ``policy_task_id``, ``rollout_cost_priors``) is asked of the first instance made, once.
    """

    def __init__(self, factory: Callable[[], gym.Env]):
        self.factory = factory
        self.free: list[gym.Env] = []
        self.made = 0
        self.step: int | None = None
        self._probe: TraceEnv | None = None

    @property
    def probe(self) -> TraceEnv:
        """The `TraceEnv` of the first instance (made on first use), for what the env *is*."""
        if self._probe is None:
            env = self.acquire()
            self._probe = unwrap(env)
            self.give_back(env)
        return self._probe

    @property
    def has_true_value(self) -> bool:
        """Whether the env offers ``true_value()`` (the simulator's exact success probability)."""
        return self.probe.has_true_value

    @property
    def env_id(self) -> str:
        return self.probe.id

    def task_env_id(self, reset_info: Mapping[str, Any]) -> str:
        """The env a task belongs to, from its reset info (a mixture's member, else the env)."""
        return self.probe.task_env_id(reset_info)

    def policy_task_id(self, task_id: str, reset_info: Mapping[str, Any]) -> str:
        """The task id a policy sees (a mixture task's member-local id, else `task_id`)."""
        return self.probe.policy_task_id(task_id, reset_info)

    @property
    def rollout_cost_priors(self) -> Mapping[str, float] | None:
        """Env id -> prior cost of one root rollout (a mixture's ``costs``), or None."""
        return self.probe.rollout_cost_priors

    def set_step(self, step: int) -> None:
        """Tell every instance, and every one made later, the training step."""
        self.step = step
        for env in self.free:
            unwrap(env).set_step(step)

    def acquire(self) -> gym.Env:
        if self.free:
            return self.free.pop()
        self.made += 1
        env = self.factory()
        if self.step is not None:
            unwrap(env).set_step(self.step)
        return env

    def give_back(self, env: gym.Env) -> None:
        self.free.append(env)

    def close(self) -> None:
        for env in self.free:
            env.close()
        self.free.clear()


def set_step(obj: Any, step: int) -> None:
    """Call ``set_step(step)`` on `obj` (or the env under its wrappers) when it has one.

    For policies (a simulated policy's drifting skill); envs declare it (`TraceEnv.set_step`).
    """
    target = obj.unwrapped if isinstance(obj, gym.Env) else obj
    fn = getattr(target, "set_step", None)
    if callable(fn):
        fn(step)


def tell_step(step: int, pool: EnvPool, policy: Any) -> None:
    """Tell step-aware parts (the simulator's drifting skill) the training step."""
    pool.set_step(step)
    set_step(policy, step)


# ---------------------------------------------------------------------- episodes
@dataclass(frozen=True)
class EpisodeSpec:
    """What one branch is, as the planner decided it (never changed once planned)."""

    #: "rollout" (a root rollout) or "replay" (from a prefix)
    kind: str
    #: 0 for roots, the prefix node id for replays
    anchor: int
    #: child index under the anchor
    child: int
    #: the task prompt (for a replay: what its root's reset answered)
    prompt: str
    #: the env's reset info (for a replay: its root's)
    reset_info: dict[str, Any]
    #: the seed of the env reset (roots) or of the env RNG after restoring (replays)
    env_seed: int
    #: the prefix a replay continues (empty for roots)
    prefix_turns: tuple[Turn, ...] = ()


@dataclass
class Episode:
    """One branch in flight: its frozen `spec` and its run state (see the module docstring)."""

    work: PromptWork
    spec: EpisodeSpec
    #: the prompt and reset info the env answered (a root's reset may refine the planned ones)
    prompt: str = field(init=False)
    reset_info: dict[str, Any] = field(init=False)
    turns: list[Turn] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    true_values: list[float | None] = field(default_factory=list)
    #: (checkpoint, env instance that took it) after each turn of a root rollout
    checkpoints: list[tuple[Checkpoint, gym.Env] | None] = field(default_factory=list)
    env: gym.Env | None = None
    done: bool = False
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    error: Failure | None = None
    overflow: bool = False

    def __post_init__(self) -> None:
        self.prompt, self.reset_info = self.spec.prompt, self.spec.reset_info

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def anchor(self) -> int:
        return self.spec.anchor

    @property
    def child(self) -> int:
        return self.spec.child

    @property
    def env_seed(self) -> int:
        return self.spec.env_seed

    @property
    def prefix_turns(self) -> tuple[Turn, ...]:
        return self.spec.prefix_turns

    @property
    def sort_key(self) -> tuple[int, int, int, int]:
        # replays before roots (a started tree finishes first), then prompt order
        return (0 if self.kind == "replay" else 1, self.work.order, self.anchor, self.child)

    def record(
        self,
        turn: Turn,
        seed: int,
        true_value: float | None,
        checkpoint: tuple[Checkpoint, gym.Env] | None = None,
    ) -> None:
        """Buffer one turn (inserted into the tree by `PromptWork.insert`)."""
        self.turns.append(turn)
        self.true_values.append(true_value)
        self.checkpoints.append(checkpoint)
        if len(self.seeds) < len(self.turns):
            self.seeds.append(seed)

    def end(
        self, reward: float, terminated: bool, truncated: bool, *, overflow: bool = False
    ) -> None:
        """The branch is over: its outcome."""
        self.done, self.reward, self.terminated, self.truncated = (
            True,
            float(reward),
            bool(terminated),
            bool(truncated),
        )
        self.overflow = overflow

    def fail(self, error: Failure, turn: Turn, seed: int) -> None:
        """End the branch on a failed leaf that records `error` (its last `turn` buffered)."""
        self.record(turn, seed, None)
        self.done, self.error = True, error


class ReplayPlan(NamedTuple):
    """The planner's answer for one prompt whose roots are done (`trace_gym.plan.plan_replays`)."""

    #: prefix node id -> predicted success probability
    prefix_values: dict[int, float]
    #: the replays to run, in prefix then child order
    replays: list[Episode]
    #: (prefix depth, charge) of each replay, in the same order
    charges: list[tuple[int, float]]


@dataclass
class PromptWork:
    """Bookkeeping of one selected prompt while its tree is open."""

    order: int
    #: the prompt's tree (its ``prompt_id`` is the task id), filled in as episodes finish
    tree: RolloutTree
    roots: list[Episode] = field(default_factory=list)
    replays: list[Episode] = field(default_factory=list)
    replay_budget: int = 0
    #: node id -> (checkpoint, env instance that took it)
    checkpoints: dict[int, tuple[Checkpoint, gym.Env]] = field(default_factory=dict)
    phase: str = "roots"  # roots -> (held, global barrier) -> replays -> closed
    started: bool = False

    def take_replays(self, plan: ReplayPlan, report: StepReport) -> list[Episode]:
        """Record the planner's `plan` (prefix values on the tree, charges); its replays."""
        tree = self.tree
        for n, v in plan.prefix_values.items():
            tree.nodes[n].value = v
        for depth, cost in plan.charges:
            report.count_replay(depth, cost)
        report.leave_unspent(max(0, self.replay_budget - len(plan.replays)))
        tree.info.update(replay_budget=self.replay_budget, replays=len(plan.replays))
        return plan.replays

    def insert(self, episodes: list[Episode], policy_version: int | str | None) -> int:
        """Append the buffered turns of `episodes` to the tree, in order; returns how many failed.

        Checkpoints taken inside root rollouts are kept by node id for the replays.
        """
        tree, failed_branches = self.tree, 0
        for ep in episodes:
            node_id = ep.anchor
            for k, turn in enumerate(ep.turns):
                node = tree.add_child(
                    node_id,
                    turn,
                    origin=ep.kind,
                    seed=ep.seeds[k],
                    true_value=ep.true_values[k],
                    policy_version=policy_version,
                )
                node_id = node.id
                if ep.checkpoints[k] is not None:
                    self.checkpoints[node_id] = ep.checkpoints[k]  # type: ignore[assignment]
            failed = ep.error is not None
            tree.finish(
                node_id,
                reward=None if failed else ep.reward,
                terminated=ep.terminated,
                truncated=ep.truncated or failed,
                error=ep.error,
            )
            if ep.overflow:
                tree.nodes[node_id].info["overflow"] = True
            failed_branches += int(failed)
        return failed_branches


# ---------------------------------------------------------------------- context
@dataclass
class StepContext:
    """Everything one step's planning and execution read, handed down from the runner."""

    step: int
    policy: Policy
    pool: EnvPool
    #: the step's `trace_gym.alloc.Allocator`; only `trace_gym.plan` calls it (the
    #: scheduler sits below the allocators and imports nothing from them)
    allocator: Any
    #: predicted success probabilities of states, in [0, 1] (timed by the caller)
    predict: Callable[[list[State]], np.ndarray]
    budget: Budget
    report: StepReport
    stopwatch: Stopwatch
    #: the run's seed, mixed into every branch seed
    seed: int = 0
    #: most live episodes per policy call (None: all of them)
    max_batch: int | None = None
    #: give each replay a fresh env RNG from its branch seed after restoring
    reseed_replays: bool = True
    #: times a policy call that raised is re-sent before its branches are failed
    policy_retries: int = 0
    #: recorded on every node generated this step
    policy_version: int | str | None = None
    #: "per-prompt" (expand a prompt when its roots are done) or "global" (after all roots)
    expansion: str = "per-prompt"
    #: env ids of the candidates -> each one's root-rollout cost relative to their mean
    #: (None: every rollout costs 1; a multi-env mixture measures them, `trace_gym.mixture`)
    root_costs: Callable[[list[str]], list[float]] | None = None
    #: a + b of each state's Beta belief (None: the predictor gives point values; see
    #: `trace_gym.predict.base.UncertainPredictor`), copied into the allocator's records
    concentration: Callable[[list[State]], np.ndarray] | None = None
    #: the predictor has seen no data yet (`UncertainPredictor.has_data` False): roots go
    #: uniformly, as the fixed-group baseline gives them, instead of ranked on a constant
    cold_start: bool = False

    def __post_init__(self) -> None:
        if self.expansion not in EXPANSIONS:
            raise ConfigError(f"expansion must be one of {EXPANSIONS}, got {self.expansion!r}")
