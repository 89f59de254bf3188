"""BranchingRunner: turn one step's rollout budget into one rollout tree per prompt.

One step (docs/runner.md "What one step does"):

1. score the candidate prompts with the predictor (a `State` at depth 0);
2. allocate the M root rollouts over them (most get 0, a selected prompt >= 2);
3. run every root rollout with *batched* policy calls: each scheduling round makes one
   ``policy.generate`` call over all live episodes (at most ``max_batch``);
4. as soon as one prompt's roots have finished - without waiting for any other prompt
   - score its prefixes (the turn boundaries strictly inside each finished rollout),
   allocate its share of the round(N * M) replays and replay from the checkpoints taken
   at those prefixes (replays join the very next round, ahead of queued roots);
5. when a prompt's replays are done its tree closes: checkpoints are released, bottom-up
   targets computed; after all trees close the predictor takes one update.

Reproducibility: every branch draws its randomness from `branch_seed` (a stable hash of
step, prompt id, node id, child index and turn), env resets are seeded the same way and
allocation rngs come from (step) and (step, prompt id). Node ids do not depend on
scheduling either: an episode's turns are buffered and inserted into its tree in a fixed
order (roots by index when the prompt's roots finish, replays by prefix then index when
it closes). So the same inputs give the same trees for any ``max_batch``.

One step reads top-down, with no call back up: runner -> `trace_gym.plan` (stages 1-2
and 4: what gets budget) -> `trace_gym.alloc` (the allocator) -> `trace_gym.scheduling`
(stage 3: execution, handed a `StepContext`; it calls ``plan.expand`` through its
``on_roots_done`` hook) -> env; the records they pass are `trace_gym.step`'s. The step's
`Budget` is the runner's; every count and cost in the report comes from it.

What the runner owns and changes: its env pool, the visit histories, the prompt cache,
the measured rollout costs and the predictor's update (all kept across steps, in
`state_dict`); per step it builds the `StepContext` and the report, records the plan the
planner returns (the report's plan figures, each prompt's replay share, the skipped
candidates on the first tree for the viewer) and closes the report.

Failures are data: a policy error (an exception, or ``PolicyOutput.error``) or an env
exception ends that branch on a new leaf whose `Failure` record says where and what
kind; siblings go on. When more than half of a step's branches failed the runner warns
(or, with ``raise_on_failures``, raises `BranchFailures`).
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, NamedTuple, cast

import gymnasium as gym
import numpy as np

from trace_gym import plan
from trace_gym.alloc.base import Allocator, VisitHistory
from trace_gym.budget import DEFAULT_REPLAY_COST, Budget, StepReport, Stopwatch
from trace_gym.core import ExactValue, unwrap
from trace_gym.errors import BranchFailures, ConfigError
from trace_gym.mixture import ROLLOUT_COSTS, RolloutCosts
from trace_gym.policy import Policy, policy_version
from trace_gym.predict.base import Predictor
from trace_gym.scheduling import EXPANSIONS, StepScheduler
from trace_gym.seeding import stable_seed
from trace_gym.step import EnvPool, PromptWork, StepContext, tell_step
from trace_gym.tree import RolloutTree

__all__ = [
    "RUNNER_FLAGS",
    "BranchingRunner",
    "RunnerConfig",
    "StepResult",
    "add_runner_args",
    "runner_config",
    "step_context",
]

log = logging.getLogger(__name__)

#: format of `BranchingRunner.state_dict`
RUNNER_STATE_VERSION = 1


@dataclass
class RunnerConfig:
    """Budget and scheduling of a `BranchingRunner`."""

    #: M: root rollouts per step, over all prompts
    root_budget: int
    #: N: replays per root; the step's continuation budget is round(N * M) replays
    replays_per_root: float = 2.0
    #: most root rollouts one prompt can get
    m_max: int = 16
    #: cost of one replay in trajectory-equivalents (the paper's flat half)
    replay_cost: float = DEFAULT_REPLAY_COST
    #: most live episodes per policy call (None: all of them)
    max_batch: int | None = None
    #: the run's seed, mixed into every branch seed
    seed: int = 0
    #: give each replay a fresh env RNG (from its branch seed) after restoring, so sibling
    #: replays are independent draws rather than repeats of the restored env randomness
    reseed_replays: bool = True
    #: times a policy call that raised is re-sent before its branches are failed
    policy_retries: int = 0
    #: update the predictor on the finished trees at the end of the step
    update_predictor: bool = True
    #: share of prefix samples in the predictor's update batch (paper: about 6%)
    prefix_share: float = 0.06
    #: raise `BranchFailures` (instead of warning) when more than half of a step's
    #: branches failed - an env or backend bug, not bad luck
    raise_on_failures: bool = False
    #: "per-prompt": expand each prompt's prefixes the moment its own roots are done (the
    #: paper's schedule); "global": only after every root of the step has finished (a
    #: barrier, for comparison - same allocations, same trees, more waiting)
    expansion: str = "per-prompt"
    #: what one root rollout costs the root solver: "flat" (1 each), or - for a multi-env
    #: mixture - each env's running mean of "turns" or "tokens" per root rollout,
    #: relative to the step's candidates (`trace_gym.mixture.RolloutCosts`)
    rollout_cost: str = "flat"

    def __post_init__(self) -> None:
        """The one set of rules for these settings (the trainer's and TRL's tables embed them)."""
        if self.rollout_cost not in ROLLOUT_COSTS:
            raise ConfigError(
                f"rollout_cost must be one of {ROLLOUT_COSTS}, got {self.rollout_cost!r}"
            )
        if self.expansion not in EXPANSIONS:
            raise ConfigError(f"expansion must be one of {EXPANSIONS}, got {self.expansion!r}")
        if self.root_budget < 2:  # 1 root can never be placed: every allocator keeps pairs
            raise ConfigError(
                f"root_budget must be >= 2 (a kept prompt gets at least 2 rollouts), "
                f"got {self.root_budget}"
            )
        if self.m_max < 2:
            raise ConfigError(
                f"m_max must be >= 2 (a kept prompt gets at least 2 rollouts), got {self.m_max}"
            )
        for name in ("replays_per_root", "replay_cost"):  # 0: no replays / free replays
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
        if self.max_batch is not None and self.max_batch < 1:
            raise ConfigError(f"max_batch must be None or >= 1, got {self.max_batch}")
        if self.policy_retries < 0:
            raise ConfigError(f"policy_retries must be >= 0, got {self.policy_retries}")
        if not 0.0 <= self.prefix_share <= 1.0:
            raise ConfigError(f"prefix_share must be in [0, 1], got {self.prefix_share}")

    @property
    def budget(self) -> Budget:
        """The step's `Budget`: M roots, round(N * M) replays at `replay_cost` each."""
        return Budget.per_root(self.root_budget, self.replays_per_root, self.replay_cost)

    @property
    def replay_budget(self) -> int:
        return self.budget.replays

    @property
    def accounted_budget(self) -> float:
        """M (1 + N * replay_cost): the step's budget in trajectory-equivalents."""
        return self.budget.accounted()


#: a runner setting's command-line flag, type and help; every CLI that builds a runner
#: adds the ones it exposes with `add_runner_args` and reads them back with `runner_config`
RUNNER_FLAGS: dict[str, tuple[str, type, str]] = {
    "root_budget": ("--roots", int, "M: root rollouts per step"),
    "replays_per_root": ("--replays", float, "N: replays per root"),
    "m_max": ("--m-max", int, "most root rollouts per prompt"),
    "replay_cost": ("--replay-cost", float, "cost of one replay in trajectory-equivalents"),
    "max_batch": ("--max-batch", int, "most live episodes per policy call"),
    "seed": ("--seed", int, "the run's seed"),
    "prefix_share": ("--prefix-share", float, "prefix share of predictor batches"),
    "policy_retries": ("--policy-retries", int, "times a failed policy call is re-sent"),
    "expansion": ("--expansion", str, "when prefixes are expanded: per-prompt or global"),
    "rollout_cost": ("--rollout-cost", str, "root-rollout cost: flat, turns or tokens"),
}


def add_runner_args(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """Add the flag of each runner setting named in `defaults` (a `RUNNER_FLAGS` key), with
    that default; the parsed value lands under the setting's own name (``args.root_budget``
    for ``--roots``), where `runner_config` finds it."""
    for name, default in defaults.items():
        flag, kind, text = RUNNER_FLAGS[name]
        shown = "" if default is None else f" (default {default})"
        metavar = flag[2:].upper().replace("-", "_")  # --roots: ROOTS, as before the dest
        parser.add_argument(
            flag, dest=name, type=kind, default=default, metavar=metavar, help=text + shown
        )


def runner_config(args: argparse.Namespace | Any, **over: Any) -> RunnerConfig:
    """The `RunnerConfig` of parsed command-line `args` (every setting they carry under its
    own name), with `over` on top; a bad value is a `ConfigError` naming its flag."""
    names = {f.name for f in fields(RunnerConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    try:
        return RunnerConfig(**{**values, **over})
    except ConfigError as e:
        name, _, rest = str(e).partition(" ")
        if name not in RUNNER_FLAGS or name in over:
            raise
        raise ConfigError(f"{RUNNER_FLAGS[name][0]} {rest}") from None


class StepResult(NamedTuple):
    """The trees of one step (one per selected prompt, in candidate order) and its report."""

    trees: list[RolloutTree]
    report: StepReport


class BranchingRunner:
    """Grows one rollout tree per selected prompt under a root + replay budget.

    `env_factory()` makes one env (e.g. ``lambda: gym.make("trace/Sim-v0")``); the runner
    keeps a pool and restores checkpoints into any free instance. `predictor` may be
    None (every value 0.5, no updates). Visit histories of prompts are kept in
    `self.history` across steps (or in the mapping passed to `run_step`).
    """

    def __init__(
        self,
        policy: Policy,
        env_factory: Callable[[], gym.Env],
        allocator: Allocator,
        predictor: Predictor | None,
        config: RunnerConfig,
    ):
        if not hasattr(policy, "generate"):
            raise ConfigError(
                f"policy {type(policy).__name__} has no generate(conversations) method"
            )
        self.policy = policy
        self.allocator = allocator
        self.predictor = predictor
        self.config = config
        self.pool = EnvPool(env_factory)
        self.history: dict[str, VisitHistory] = {}
        self._prompts: dict[str, tuple[str, dict[str, Any]]] = {}
        #: per-env cost of a root rollout (None with ``rollout_cost = "flat"``)
        self.costs: RolloutCosts | None = None
        if config.rollout_cost != "flat":
            self.costs = RolloutCosts(config.rollout_cost, self.pool.rollout_cost_priors)
        #: the step after the last one run (what a resumed run continues from)
        self.next_step = 0

    def close(self) -> None:
        self.pool.close()

    @property
    def has_true_value(self) -> bool:
        """Whether the env offers ``true_value()`` (decided once, on the first instance)."""
        return self.pool.has_true_value

    # ------------------------------------------------------------------ step
    def run_step(
        self,
        step: int,
        candidates: Sequence[str],
        *,
        history: dict[str, VisitHistory] | None = None,
    ) -> StepResult:
        """Score, allocate, roll out, expand and close every tree of one step.

        `history` (default `self.history`) is read for the candidates' past visits and
        updated with this step's, so a caller can keep its own.
        """
        ids = [str(c) for c in candidates]
        if len(set(ids)) != len(ids):
            raise ConfigError("candidate task ids must be unique within a step")
        if not ids:
            raise ConfigError("run_step needs at least one candidate task id")
        history = self.history if history is None else history
        ctx = self.context(step, self._new_report(step, len(ids)), Stopwatch())
        tell_step(step, self.pool, self.policy)
        described = [self._describe(t, ctx.stopwatch) for t in ids]
        works = self._plan(ctx, described, history)
        extra_envs = self._run_works(ctx, works) if works else 0
        report = ctx.report
        _check_failures(report, self.config.raise_on_failures)
        trees = [w.tree for w in works]
        _update_history(history, trees)
        if self.costs is not None:
            self.costs.update(trees)
        if self.predictor is not None and self.config.update_predictor and trees:
            report.note_predictor_update(self._update_predictor(trees, step, ctx.stopwatch))
        self.next_step = step + 1
        report.close(
            ctx.stopwatch,
            accounted_cost=ctx.budget.accounted(report.root_charge, report.replay_charge),
            env_instances=self.pool.made + extra_envs,
        )
        return StepResult(trees, report)

    def _plan(
        self, ctx: StepContext, described: list[plan.Described], history: dict[str, VisitHistory]
    ) -> list[PromptWork]:
        """Stages 1-2: allocate the roots, build the works, share out the replays; report them."""
        allocation = plan.allocate_roots(ctx, described, history)
        works = plan.root_works(ctx, described, allocation)
        if (
            works
        ):  # once per step, on its first tree: the pool's skipped candidates (trace-gym view)
            works[0].tree.info["skipped_candidates"] = allocation.skipped
        total, shares = plan.replay_shares(ctx, works)
        for w, b in zip(works, shares, strict=True):
            w.replay_budget = b
        ctx.report.note_plan(
            len(works),
            sum(len(w.roots) for w in works),
            total,
            sum(len(w.roots) * plan.root_cost(w) for w in works),
        )
        return works

    # ------------------------------------------------------------------ resuming
    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs from the runner: the next step, the visit histories,
        the predictor's and (adaptive) allocator's state, the measured rollout costs.

        Plain, picklable data; `load_state_dict` on a runner built the same way continues
        exactly where this one stopped (the same next step).
        """
        return {
            "version": RUNNER_STATE_VERSION,
            "next_step": self.next_step,
            "history": dict(self.history),
            "predictor": _state_of(self.predictor),
            "allocator": _state_of(self.allocator),
            "rollout_costs": None if self.costs is None else self.costs.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict` (of a runner with the same config, policy and env)."""
        if state.get("version") != RUNNER_STATE_VERSION:
            raise ConfigError(
                f"runner state of version {state.get('version')!r}; this trace-gym reads "
                f"version {RUNNER_STATE_VERSION}"
            )
        if (state["rollout_costs"] is None) != (self.costs is None):
            raise ConfigError(
                "runner state and this runner disagree on rollout_cost (flat vs measured); "
                "build the runner with the config the state was saved under"
            )
        self.next_step = int(state["next_step"])
        self.history.clear()
        self.history.update(state["history"])
        _load_state(self.predictor, state["predictor"], "predictor")
        _load_state(self.allocator, state["allocator"], "allocator")
        if self.costs is not None:
            self.costs.load_state_dict(state["rollout_costs"])

    def context(self, step: int, report: StepReport, stopwatch: Stopwatch) -> StepContext:
        """What one step's planning and execution read (`trace_gym.step.StepContext`)."""
        ctx = step_context(
            self.config,
            step,
            self.policy,
            self.pool,
            self.allocator,
            self.predictor,
            report,
            stopwatch,
        )
        if self.costs is not None:
            ctx.root_costs = self.costs.relative
        return ctx

    def _new_report(self, step: int, candidates: int) -> StepReport:
        """The step's report (subclasses return a richer one)."""
        return StepReport(step=step, candidates=candidates, replay_cost=self.config.replay_cost)

    def _run_works(self, ctx: StepContext, works: list[PromptWork]) -> int:
        """Roll out and expand every prompt (fills ``w.tree``); returns env instances made elsewhere.

        The one stage a distributed runner replaces (`trace_gym.distributed.RayRunner`).
        """
        StepScheduler(ctx, partial(plan.expand, ctx), partial(plan.expand_all, ctx)).run(works)
        return 0

    def _describe(self, task_id: str, sw: Stopwatch) -> plan.Described:
        """The task's prompt and reset info (cached) and its exact value when the env has one.

        Envs with ``true_value()`` (the simulator) are reset every step, since the exact
        value moves with the policy; others are reset once per task.
        """
        exact = self.pool.has_true_value
        cached = self._prompts.get(task_id)
        if cached is not None and not exact:
            return plan.Described(task_id, cached[0], cached[1], None)
        env = self.pool.acquire()
        try:
            with sw("env"):
                prompt, info = env.reset(
                    seed=stable_seed("describe", task_id), options={"task": task_id}
                )
                tv = float(cast(ExactValue, unwrap(env)).true_value()) if exact else None
        finally:
            self.pool.give_back(env)
        self._prompts[task_id] = (prompt, info)
        return plan.Described(task_id, prompt, info, tv)

    def _update_predictor(
        self, trees: list[RolloutTree], step: int, sw: Stopwatch
    ) -> dict[str, float]:
        from trace_gym.predict import every_label, training_batch

        rng = np.random.default_rng(stable_seed("predictor", self.config.seed, step))
        with sw("predictor"):
            if getattr(self.predictor, "label_all", False):  # it refits on every label
                states, targets, weights = every_label(trees)
            else:
                states, targets, weights = training_batch(
                    trees, prefix_share=self.config.prefix_share, rng=rng
                )
            if len(states) == 0:
                return {}
            predictor = self.predictor  # run_step calls this only when there is one
            metrics = {} if predictor is None else predictor.update(states, targets, weights)
        return {k: float(v) for k, v in (metrics or {}).items()}


def step_context(
    config: RunnerConfig,
    step: int,
    policy: Policy,
    pool: EnvPool,
    allocator: Allocator,
    predictor: Predictor | None,
    report: StepReport,
    stopwatch: Stopwatch,
) -> StepContext:
    """The `StepContext` of one step under `config` (the local runner's, or a Ray worker's)."""
    return StepContext(
        step=step,
        policy=policy,
        pool=pool,
        allocator=allocator,
        predict=plan.predictor_fn(predictor, stopwatch),
        concentration=plan.concentration_fn(predictor, stopwatch),
        budget=config.budget,
        report=report,
        stopwatch=stopwatch,
        seed=config.seed,
        max_batch=config.max_batch,
        reseed_replays=config.reseed_replays,
        policy_retries=config.policy_retries,
        policy_version=policy_version(policy),
        expansion=config.expansion,
        cold_start=predictor is not None and not getattr(predictor, "has_data", True),
    )


def _state_of(obj: Any) -> Any:
    """`obj`'s ``state_dict()``, or a copy of its attributes (an adaptive allocator's)."""
    if obj is None:
        return None
    if callable(getattr(obj, "state_dict", None)):
        return obj.state_dict()
    return copy.deepcopy(vars(obj))


def _load_state(obj: Any, state: Any, what: str) -> None:
    if (obj is None) != (state is None):
        raise ConfigError(
            f"runner state has {'no' if state is None else 'a'} {what} but this runner "
            f"{'has one' if state is None else 'has none'}"
        )
    if obj is None:
        return
    if callable(getattr(obj, "load_state_dict", None)):
        obj.load_state_dict(state)
    else:
        vars(obj).update(copy.deepcopy(state))


def env_factory_probe(pool: EnvPool) -> gym.Env:
    """One pooled env instance, given back at once (for reading its attributes)."""
    env = pool.acquire()
    pool.give_back(env)
    return env


def _update_history(history: dict[str, VisitHistory], trees: list[RolloutTree]) -> None:
    """Record each visited prompt's root-rollout rewards (unbiased by replays)."""
    for tree in trees:
        rewards = [
            float(leaf.reward)
            for leaf in tree.leaves(include_failed=False)
            if leaf.origin == "rollout" and leaf.reward is not None
        ]
        if not rewards:
            continue
        old = history.get(tree.prompt_id, VisitHistory())
        succ = [r >= tree.success_threshold for r in rewards]
        history[tree.prompt_id] = VisitHistory(
            rewards=old.rewards + (tuple(rewards),),
            all_success_streak=old.all_success_streak + 1 if all(succ) else 0,
            all_failure_streak=old.all_failure_streak + 1 if not any(succ) else 0,
        )


def _check_failures(report: StepReport, raise_on_failures: bool) -> None:
    """Warn (or raise) when more than half of the step's branches failed."""
    branches = report.roots + report.replays
    if not branches or 2 * report.failed_branches <= branches:
        return
    msg = (
        f"step {report.step}: {report.failed_branches} of {branches} branches failed "
        f"({report.policy_errors} policy, {report.env_errors} env errors); the trees' "
        "failed leaves say where (node.failure) - an env or backend bug fails every branch"
    )
    if raise_on_failures:
        raise BranchFailures(msg)
    log.warning(msg)
