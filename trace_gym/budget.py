"""A step's budget and what the step spent: accounted cost, measured work, wall time, events.

The paper compares methods at equal *accounted* cost: a root rollout costs 1
trajectory-equivalent, a replay from a prefix costs ``replay_cost`` (0.5), so M roots
with N replays each cost M (1 + N/2). `Budget` is the one place that arithmetic lives:
the runner owns one per step, hands its numbers to the allocator and charges every
replay its own cost (the flat ``replay_cost``, or the prefix's remaining-turn share
``cost(depth, rollout_turns)`` for an allocator that declares ``cost_aware``).

That flat half is an average, so a `StepReport` also carries the *measured* work
(turns and tokens actually generated) and the wall time split by who spent it
(policy / env / predictor / allocator / bookkeeping).

In a local step a report changes only through its named updates (``note_plan``, ``count_*``,
``leave_unspent``, ``add_event``, ``close``): the runner records the plan and closes
the report, the planner's decisions are charged by `trace_gym.step.PromptWork.take_replays`,
and the scheduler counts calls, turns, env steps and failures.

`Event`s form a logical clock: ``round`` counts policy calls, so a test (or a reader)
can see that one prompt's expansion started while other prompts were still rolling out.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from trace_gym.errors import ConfigError

__all__ = [
    "DEFAULT_REPLAY_COST",
    "EVENT_KINDS",
    "Budget",
    "Event",
    "StepReport",
    "Stopwatch",
    "TIME_BUCKETS",
    "remaining_turn_cost",
]

#: cost of one replay in trajectory-equivalents when nothing else is said: the paper's
#: flat half (a replay regenerates about half a trajectory; docs/runner.md)
DEFAULT_REPLAY_COST = 0.5

#: where wall time goes; "bookkeeping" is the rest of the step
TIME_BUCKETS = ("policy", "env", "predictor", "allocator", "bookkeeping")

#: roots_started: the prompt's first root rollout entered the batch;
#: roots_done: its last root rollout finished (its prefixes are scored right away);
#: expand: its replays were queued (continuation budget allocated);
#: closed: its tree is complete (replays done, checkpoints released)
EVENT_KINDS = ("roots_started", "roots_done", "expand", "closed")


def remaining_turn_cost(depth: int, rollout_turns: int) -> float:
    """Cost of one replay from `depth` of a `rollout_turns`-turn rollout, in trajectory-equivalents.

    The share of the rollout's turns a replay regenerates: (T - d) / T. An early
    prefix costs nearly a full rollout, a late one little (docs/alloc.md "The budget an allocator is handed").
    """
    return (rollout_turns - depth) / rollout_turns


@dataclass(frozen=True)
class Budget:
    """One step's rollout budget, in rollouts and in trajectory-equivalents."""

    #: M: root rollouts
    roots: int
    #: the continuation budget in replays, round(N * M)
    replays: int = 0
    #: flat cost of one replay in trajectory-equivalents (the paper's half)
    replay_cost: float = DEFAULT_REPLAY_COST
    #: cost of one replay from a prefix, (depth, rollout_turns) -> trajectory-equivalents,
    #: charged instead of `replay_cost` when the allocator declares ``cost_aware``
    cost: Callable[[int, int], float] = remaining_turn_cost

    def __post_init__(self) -> None:
        if self.roots < 0 or self.replays < 0:
            raise ConfigError(
                f"budget counts must be >= 0, got {self.roots} roots, {self.replays} replays"
            )
        if not self.replay_cost >= 0:
            raise ConfigError(f"replay_cost must be >= 0, got {self.replay_cost}")

    @classmethod
    def per_root(
        cls, roots: int, replays_per_root: float, replay_cost: float = DEFAULT_REPLAY_COST
    ) -> Budget:
        """M roots and round(N * M) replays."""
        return cls(int(roots), int(round(replays_per_root * roots)), float(replay_cost))

    def prefix_cost(
        self, cost_aware: bool, rollout_cost: float = 1.0
    ) -> Callable[[int, int], float] | float:
        """What one replay from a prefix is charged: its own cost, or the flat one.

        `rollout_cost`: the prompt's rollout cost relative to the step's mean (a mixture's
        per-env cost; 1 otherwise), which scales either.
        """
        if rollout_cost == 1.0:
            return self.cost if cost_aware else self.replay_cost
        if not cost_aware:
            return rollout_cost * self.replay_cost
        own = self.cost
        return lambda depth, turns: rollout_cost * own(depth, turns)

    def prefix_budget(
        self, replays: int, cost_aware: bool, rollout_cost: float = 1.0
    ) -> int | float:
        """A prompt's continuation budget as its allocator takes it.

        A replay count, or for a ``cost_aware`` allocator the same budget in
        trajectory-equivalents (``replays * replay_cost``, times the prompt's
        `rollout_cost` in a mixture), to spend on prefixes that each carry their own cost.
        """
        return replays * self.replay_cost * rollout_cost if cost_aware else replays

    def accounted(
        self, roots: float | None = None, replay_charges: Iterable[float] | float | None = None
    ) -> float:
        """Trajectory-equivalents: the roots' cost, plus every replay what it was charged.

        With no arguments, the budget itself: M (1 + N * replay_cost). `roots`: the roots'
        cost (their count, or in a mixture the cost-weighted count sum c_i m_i);
        `replay_charges` is either the charge of each replay or their sum.
        """
        if roots is None and replay_charges is None:
            return self.roots + self.replays * self.replay_cost
        if isinstance(replay_charges, (int, float)):
            spent = float(replay_charges)
        else:
            spent = sum(replay_charges or ())
        return (self.roots if roots is None else roots) + spent


class Event(NamedTuple):
    """One scheduling event; `round` is the number of policy calls made so far."""

    round: int
    kind: str
    prompt_id: str


class Stopwatch:
    """Accumulates wall time per bucket; ``with sw("env"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(TIME_BUCKETS, 0.0)
        self._start = time.perf_counter()

    @contextmanager
    def __call__(self, bucket: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[bucket] += time.perf_counter() - t0

    def finish(self) -> tuple[float, dict[str, float]]:
        """Total wall time and the split, with bookkeeping = total - the named buckets."""
        total = time.perf_counter() - self._start
        named = sum(v for k, v in self.seconds.items() if k != "bookkeeping")
        split = dict(self.seconds)
        split["bookkeeping"] = max(0.0, total - named)
        return total, split


@dataclass
class StepReport:
    """Budget, measured work, failures, timing and events of one `BranchingRunner` step."""

    step: int
    #: candidate prompts scored
    candidates: int = 0
    #: prompts that got at least one root rollout (one tree each)
    selected: int = 0
    #: root rollouts run (sum of the root allocation)
    roots: int = 0
    #: continuation budget in replays: round(N * M), split over prompts by root count
    #: (in a mixture: its cost, by cost-weighted roots, `trace_gym.plan.replay_shares`)
    replay_budget: int = 0
    #: replays run
    replays: int = 0
    #: budget that could not be placed (a prompt with no replayable prefix)
    replays_unspent: int = 0
    #: flat cost of one replay in trajectory-equivalents (`Budget.replay_cost`)
    replay_cost: float = DEFAULT_REPLAY_COST
    #: what the replays run were charged, each its own cost (`Budget.prefix_cost`)
    replay_charge: float = 0.0
    #: what the roots cost: their count, or in a mixture sum rollout_cost x root count
    root_charge: float = 0.0
    #: root_charge + replay_charge (`Budget.accounted`)
    accounted_cost: float = 0.0
    #: assistant turns generated (every policy output, failures included)
    measured_turns: int = 0
    #: env steps that ran
    env_steps: int = 0
    #: generated token ids (0 for text-only policies)
    generated_tokens: int = 0
    #: context tokens the policy reported appending (templated prompt + observations)
    context_tokens: int = 0
    #: branches that ended in an error, by where it happened
    failed_branches: int = 0
    policy_errors: int = 0
    env_errors: int = 0
    overflows: int = 0
    #: conversations re-sent after a policy call raised (config.policy_retries)
    retried_turns: int = 0
    policy_calls: int = 0
    largest_batch: int = 0
    env_instances: int = 0
    #: replays run per prefix depth (turns completed at the prefix)
    replays_by_depth: dict[int, int] = field(default_factory=dict)
    wall_s: float = 0.0
    time_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_BUCKETS, 0.0))
    predictor_update: dict[str, float] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    @property
    def time_share(self) -> dict[str, float]:
        """Each bucket's share of the step's wall time."""
        return {k: (v / self.wall_s if self.wall_s > 0 else 0.0) for k, v in self.time_s.items()}

    # the named updates: every write to a report during a step goes through one of these
    def note_plan(
        self, selected: int, roots: int, replay_budget: int, root_charge: float | None = None
    ) -> None:
        """The step's plan: prompts selected, root rollouts placed, the replay budget, and
        the roots' cost (`root_charge`; their count unless a mixture's costs weight them)."""
        self.selected, self.roots, self.replay_budget = selected, roots, replay_budget
        self.root_charge = float(roots if root_charge is None else root_charge)

    def count_replay(self, depth: int, cost: float) -> None:
        """One replay planned from a prefix at `depth`, charged `cost`."""
        self.replays += 1
        self.replay_charge += cost
        self.replays_by_depth[depth] = self.replays_by_depth.get(depth, 0) + 1

    def leave_unspent(self, replays: int) -> None:
        """Continuation budget a prompt could not place (no replayable prefix)."""
        self.replays_unspent += replays

    def count_call(self, batch: int) -> None:
        """One policy call (or engine submission) over `batch` conversations."""
        self.policy_calls += 1
        self.largest_batch = max(self.largest_batch, batch)

    def count_retry(self, conversations: int = 1) -> None:
        """Conversations re-sent after their policy call raised."""
        self.retried_turns += conversations

    def count_turn(self, output: Any | None = None) -> None:
        """One assistant turn settled (a `PolicyOutput`'s tokens, or None for a failed call)."""
        self.measured_turns += 1
        if output is not None:
            self.generated_tokens += len(output.token_ids or ())
            self.context_tokens += len(output.context_token_ids or ())

    def count_env_step(self) -> None:
        self.env_steps += 1

    def count_overflow(self) -> None:
        """A turn that would have overflowed the policy's context."""
        self.overflows += 1

    def count_error(self, *, policy: bool = False, env: bool = False) -> None:
        """A branch ended by a policy or an env error."""
        self.policy_errors += int(policy)
        self.env_errors += int(env)

    def count_failed(self, branches: int) -> None:
        """Branches inserted into their tree on a failed leaf."""
        self.failed_branches += branches

    def add_event(self, round: int, kind: str, prompt_id: str) -> None:
        """One scheduling `Event` (`EVENT_KINDS`) at logical time `round`."""
        self.events.append(Event(round, kind, prompt_id))

    def note_predictor_update(self, metrics: dict[str, float]) -> None:
        self.predictor_update = dict(metrics)

    def close(
        self,
        stopwatch: Stopwatch,
        *,
        accounted_cost: float | None = None,
        env_instances: int | None = None,
    ) -> None:
        """End of the step (or a worker's shard): wall time and its split, and the totals."""
        if accounted_cost is not None:
            self.accounted_cost = accounted_cost
        if env_instances is not None:
            self.env_instances = env_instances
        self.wall_s, self.time_s = stopwatch.finish()

    def event_rounds(self, kind: str) -> dict[str, int]:
        """prompt id -> round of its `kind` event."""
        return {e.prompt_id: e.round for e in self.events if e.kind == kind}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["events"] = [list(e) for e in self.events]
        d["replays_by_depth"] = {str(k): v for k, v in sorted(self.replays_by_depth.items())}
        d["time_share"] = self.time_share
        return d


def merge_depth_counts(reports: list[StepReport]) -> dict[int, int]:
    """Replays by prefix depth, summed over steps."""
    total: Counter[int] = Counter()
    for r in reports:
        total.update(r.replays_by_depth)
    return dict(sorted(total.items()))
