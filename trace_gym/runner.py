"""BranchingRunner: turn one step's rollout budget into one rollout tree per prompt.

One step (../shared/TRACE.md "One training step"):

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

Stages 3-4 (the rounds, expansion and tree building) live in `trace_gym.scheduling`.

Failures are data: a policy error (an exception, or ``PolicyOutput.error``) or an env
exception ends that branch on a new leaf whose ``error`` says where; siblings go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from trace_gym.alloc.base import Allocator, Candidate, VisitHistory
from trace_gym.budget import StepReport, Stopwatch
from trace_gym.core import unwrap
from trace_gym.errors import ConfigError
from trace_gym.policy import Policy
from trace_gym.predict.base import Predictor, State
from trace_gym.scheduling import (
    EnvPool,
    Episode,
    PromptWork,
    StepScheduler,
    set_step,
)
from trace_gym.seeding import branch_seed, stable_seed
from trace_gym.tree import RolloutTree

__all__ = ["BranchingRunner", "RunnerConfig", "StepResult"]

log = logging.getLogger(__name__)


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
    replay_cost: float = 0.5
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

    def __post_init__(self) -> None:
        if self.root_budget < 1:
            raise ConfigError(f"root_budget must be >= 1, got {self.root_budget}")
        if self.replays_per_root < 0:
            raise ConfigError(f"replays_per_root must be >= 0, got {self.replays_per_root}")
        if self.m_max < 2:
            raise ConfigError(
                f"m_max must be >= 2 (a kept prompt gets at least 2 rollouts), got {self.m_max}"
            )
        if self.replay_cost < 0:
            raise ConfigError(f"replay_cost must be >= 0, got {self.replay_cost}")
        if self.max_batch is not None and self.max_batch < 1:
            raise ConfigError(f"max_batch must be None or >= 1, got {self.max_batch}")
        if self.policy_retries < 0:
            raise ConfigError(f"policy_retries must be >= 0, got {self.policy_retries}")
        if not 0.0 <= self.prefix_share <= 1.0:
            raise ConfigError(f"prefix_share must be in [0, 1], got {self.prefix_share}")

    @property
    def replay_budget(self) -> int:
        return int(round(self.replays_per_root * self.root_budget))

    @property
    def accounted_budget(self) -> float:
        """M (1 + N * replay_cost): the step's budget in trajectory-equivalents."""
        return self.root_budget + self.replay_budget * self.replay_cost


class StepResult(NamedTuple):
    """The trees of one step (one per selected prompt, in candidate order) and its report."""

    trees: list[RolloutTree]
    report: StepReport


class BranchingRunner:
    """Grows one rollout tree per selected prompt under a root + replay budget.

    `env_factory()` makes one env (e.g. ``lambda: gym.make("trace/Sim-v0")``); the runner
    keeps a pool and restores checkpoints into any free instance. `predictor` may be
    None (every value 0.5, no updates). Visit histories of prompts are kept in
    `self.history` across steps.
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
        self._true_value_known: bool | None = None
        self._env_id_cache = ""

    def close(self) -> None:
        self.pool.close()

    # ------------------------------------------------------------------ step
    def run_step(
        self,
        step: int,
        candidates: Sequence[str],
        *,
        history: Mapping[str, VisitHistory] | None = None,
    ) -> StepResult:
        """Score, allocate, roll out, expand and close every tree of one step."""
        ids = [str(c) for c in candidates]
        if len(set(ids)) != len(ids):
            raise ConfigError("candidate task ids must be unique within a step")
        if not ids:
            raise ConfigError("run_step needs at least one candidate task id")
        cfg = self.config
        sw = Stopwatch()
        report = self._new_report(step, len(ids))
        history = self.history if history is None else history
        self._tell_step(step)
        self._sw, self._step = sw, step

        works = self._allocate_roots(ids, history)
        report.selected = len(works)
        report.roots = sum(len(w.roots) for w in works)
        branching = bool(getattr(self.allocator, "branching", True))
        report.replay_budget = cfg.replay_budget if branching and works else 0
        if works and report.replay_budget:
            with sw("allocator"):
                shares = _split_budget([len(w.roots) for w in works], report.replay_budget)
            for w, b in zip(works, shares, strict=True):
                w.replay_budget = int(b)

        extra_envs = self._run_works(step, works, report, sw) if works else 0

        trees = [w.tree for w in works]
        for t in trees:
            t.compute_targets()
        self._update_history(works)
        if self.predictor is not None and cfg.update_predictor and trees:
            report.predictor_update = self._update_predictor(trees, step)
        report.accounted_cost = report.roots + report.replays * cfg.replay_cost
        report.env_instances = self.pool.made + extra_envs
        report.wall_s, report.time_s = sw.finish()
        return StepResult(trees, report)

    def _new_report(self, step: int, candidates: int) -> StepReport:
        """The step's report (subclasses return a richer one)."""
        return StepReport(step=step, candidates=candidates, replay_cost=self.config.replay_cost)

    def _run_works(self, step: int, works: list, report: StepReport, sw: Stopwatch) -> int:
        """Roll out and expand every prompt (fills ``w.tree``); returns env instances made elsewhere.

        The one stage a distributed runner replaces (`trace_gym.distributed.RayRunner`).
        """
        StepScheduler(self, step, report, sw).run(works)
        return 0

    def _tell_step(self, step: int) -> None:
        """Tell step-aware parts (the simulator's drifting skill) the training step."""
        self.pool.step = step
        for env in self.pool.free:
            set_step(env, step)
        set_step(self.policy, step)

    # ------------------------------------------------------------------ stage 1-2
    def _describe(self, task_id: str) -> tuple[str, dict[str, Any], float | None]:
        """The task's prompt and reset info (cached) and its exact value when the env has one.

        Envs with ``true_value()`` (the simulator) are reset every step, since the exact
        value moves with the policy; others are reset once per task.
        """
        cached = self._prompts.get(task_id)
        if cached is not None and not self.has_true_value:
            return cached[0], cached[1], None
        env = self.pool.acquire()
        try:
            with self._sw("env"):
                prompt, info = env.reset(
                    seed=stable_seed("describe", task_id), options={"task": task_id}
                )
                tv = float(unwrap(env).true_value()) if self.has_true_value else None
        finally:
            self.pool.give_back(env)
        self._prompts[task_id] = (prompt, info)
        return prompt, info, tv

    @property
    def has_true_value(self) -> bool:
        """Whether the env offers ``true_value()`` (decided once, on the first instance)."""
        if self._true_value_known is None:
            env = self.pool.acquire()
            base = unwrap(env)
            self._true_value_known = callable(getattr(base, "true_value", None))
            self._env_id_cache = base.id
            self.pool.give_back(env)
        return self._true_value_known

    def _allocate_roots(
        self, ids: list[str], history: Mapping[str, VisitHistory]
    ) -> list[PromptWork]:
        cfg, sw = self.config, self._sw
        described = [self._describe(t) for t in ids]
        states = [
            State(t, p, (), self._env_id()) for t, (p, _, _) in zip(ids, described, strict=True)
        ]
        values = self.predict(states)
        cands = [
            Candidate(id=t, value=float(v), history=history.get(t, VisitHistory()), true_value=tv)
            for t, v, (_, _, tv) in zip(ids, values, described, strict=True)
        ]
        rng = np.random.default_rng(stable_seed("roots", cfg.seed, self._step))
        with sw("allocator"):
            counts = np.asarray(
                self.allocator.allocate_roots(cands, cfg.root_budget, rng), dtype=int
            )
        if counts.shape != (len(cands),) or (counts < 0).any():
            raise ConfigError(
                f"allocator {getattr(self.allocator, 'name', self.allocator)!r} returned root counts of shape "
                f"{counts.shape} (need {len(cands)} non-negative ints)"
            )
        if counts.sum() != cfg.root_budget:
            log.warning("allocator placed %d of %d root rollouts", counts.sum(), cfg.root_budget)
        works = []
        for cand, (prompt, info, _), m in zip(cands, described, counts, strict=True):
            if m <= 0:
                continue
            tree = RolloutTree(cand.id, prompt, env_id=self._env_id(), step=self._step)
            tree.root.value = cand.value
            tree.root.true_value = cand.true_value
            tree.info.update(root_count=int(m), candidate_value=cand.value)
            w = PromptWork(order=len(works), candidate=cand, tree=tree)
            w.roots = [
                Episode(
                    work=w,
                    kind="rollout",
                    anchor=0,
                    child=i,
                    prompt=prompt,
                    reset_info=info,
                    env_seed=branch_seed(self._step, cand.id, 0, i, turn=0, base=cfg.seed),
                )
                for i in range(int(m))
            ]
            works.append(w)
        return works

    def _env_id(self) -> str:
        self.has_true_value  # noqa: B018 - makes the first env and caches its id
        return self._env_id_cache

    def predict(self, states: list[State]) -> np.ndarray:
        if self.predictor is None or not states:
            return np.full(len(states), 0.5)
        with self._sw("predictor"):
            v = np.asarray(self.predictor.predict(states), dtype=float)
        return np.clip(v, 0.0, 1.0)

    # ------------------------------------------------------------------ stage 3-4

    # ------------------------------------------------------------------ stage 5
    def _update_history(self, works: list[PromptWork]) -> None:
        """Record each visited prompt's root-rollout rewards (unbiased by replays)."""
        for w in works:
            tree = w.tree
            rewards = []
            for leaf in tree.leaves(include_failed=False):
                if tree.nodes[leaf.id].origin == "rollout":
                    rewards.append(float(leaf.reward))  # type: ignore[arg-type]
            if not rewards:
                continue
            old = self.history.get(tree.prompt_id, VisitHistory())
            succ = [r >= tree.success_threshold for r in rewards]
            self.history[tree.prompt_id] = VisitHistory(
                rewards=old.rewards + (tuple(rewards),),
                all_success_streak=old.all_success_streak + 1 if all(succ) else 0,
                all_failure_streak=old.all_failure_streak + 1 if not any(succ) else 0,
            )

    def _update_predictor(self, trees: list[RolloutTree], step: int) -> dict[str, float]:
        from trace_gym.predict import training_batch

        rng = np.random.default_rng(stable_seed("predictor", self.config.seed, step))
        with self._sw("predictor"):
            states, targets, weights = training_batch(
                trees, prefix_share=self.config.prefix_share, rng=rng
            )
            if len(states) == 0:
                return {}
            metrics = self.predictor.update(states, targets, weights)  # type: ignore[union-attr]
        return {k: float(v) for k, v in (metrics or {}).items()}


def _split_budget(weights: Sequence[float], total: int) -> np.ndarray:
    """`trace_gym.alloc.split_budget` (largest remainder, sums exactly to `total`)."""
    from trace_gym.alloc import split_budget

    return np.asarray(split_budget(list(weights), total), dtype=int)
