"""Stage 3 of a runner step: execute episodes in batched rounds and build the trees.

`StepScheduler` runs one step's episodes in rounds. Each round admits queued episodes
(replays of already-expanded prompts first, then roots, in a fixed order) up to
``max_batch`` live ones, makes *one* ``policy.generate`` call over every live episode
and steps each env once. When the last root of a prompt finishes, its turns go into the
tree and the ``on_roots_done(work)`` hook (`trace_gym.plan.expand`) returns the replays to
queue; when its last replay finishes, its tree closes and its checkpoints are released.
No prompt waits for another.

The scheduler decides nothing about the budget and knows no runner: everything it reads
comes in one `StepContext`.

Episodes buffer their turns and are inserted into their tree in a fixed order (roots
by index, replays by prefix then index), so node ids - and with them every branch
seed - do not depend on how the work was batched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from trace_gym.budget import Budget, Event, StepReport, Stopwatch
from trace_gym.core import Checkpoint, ExactValue, unwrap
from trace_gym.errors import ConfigError, EngineUnavailable, PolicyError
from trace_gym.mixture import member_task_id
from trace_gym.policy import Conversation, Policy, PolicyOutput
from trace_gym.predict.base import State
from trace_gym.seeding import branch_seed
from trace_gym.tree import Failure, RolloutTree, Turn

__all__ = [
    "EXPANSIONS",
    "EnvPool",
    "Episode",
    "PromptWork",
    "StepContext",
    "StepScheduler",
    "set_step",
    "tell_step",
]

log = logging.getLogger(__name__)

#: when a prompt's prefixes are expanded: the moment its own roots are done (the paper's
#: schedule), or only after every root of the step (a global barrier; same allocations)
EXPANSIONS = ("per-prompt", "global")


@dataclass
class Episode:
    """One branch in flight: a root rollout or a replay from a prefix."""

    work: PromptWork
    kind: str  # "rollout" | "replay"
    anchor: int  # 0 for roots, the prefix node id for replays
    child: int  # child index under the anchor
    prompt: str
    reset_info: dict[str, Any]
    env_seed: int
    prefix_turns: tuple[Turn, ...] = ()
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

    @property
    def sort_key(self) -> tuple[int, int, int, int]:
        # replays before roots (a started tree finishes first), then prompt order
        return (0 if self.kind == "replay" else 1, self.work.order, self.anchor, self.child)


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


class EnvPool:
    """Env instances from `env_factory`; any free instance serves any restore."""

    def __init__(self, factory: Callable[[], gym.Env]):
        self.factory = factory
        self.free: list[gym.Env] = []
        self.made = 0
        self.step: int | None = None
        self._probe: tuple[bool, str] | None = None

    def _probed(self) -> tuple[bool, str]:
        if self._probe is None:  # decided once, on the first instance
            env = self.acquire()
            base = unwrap(env)
            self._probe = (callable(getattr(base, "true_value", None)), base.id)
            self.give_back(env)
        return self._probe

    @property
    def has_true_value(self) -> bool:
        """Whether the env offers ``true_value()`` (the simulator's exact success probability)."""
        return self._probed()[0]

    @property
    def env_id(self) -> str:
        return self._probed()[1]

    def acquire(self) -> gym.Env:
        if self.free:
            return self.free.pop()
        self.made += 1
        env = self.factory()
        if self.step is not None:
            set_step(env, self.step)
        return env

    def give_back(self, env: gym.Env) -> None:
        self.free.append(env)

    def close(self) -> None:
        for env in self.free:
            env.close()
        self.free.clear()


def set_step(obj: Any, step: int) -> None:
    """Call ``set_step(step)`` on `obj` (or the env under its wrappers) when it has one."""
    target = obj.unwrapped if isinstance(obj, gym.Env) else obj
    fn = getattr(target, "set_step", None)
    if callable(fn):
        fn(step)


def tell_step(step: int, pool: EnvPool, policy: Any) -> None:
    """Tell step-aware parts (the simulator's drifting skill) the training step."""
    pool.step = step
    for env in pool.free:
        set_step(env, step)
    set_step(policy, step)


def _exc(where: str, kind: str, e: BaseException) -> Failure:
    return Failure(where, kind, f"{type(e).__name__}: {e}")


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

    def __post_init__(self) -> None:
        if self.expansion not in EXPANSIONS:
            raise ConfigError(f"expansion must be one of {EXPANSIONS}, got {self.expansion!r}")


class StepScheduler:
    """Runs the episodes of one step (see the module docstring).

    `on_roots_done(work)` is called once per prompt, after its root rollouts are in its
    tree, and returns the replays to run from that tree's prefixes (or none).
    """

    def __init__(self, ctx: StepContext, on_roots_done: Callable[[PromptWork], list[Episode]]):
        self.ctx = ctx
        self.on_roots_done = on_roots_done
        self.policy, self.pool = ctx.policy, ctx.pool
        self._step, self._report, self._sw = ctx.step, ctx.report, ctx.stopwatch
        self._round = 0
        self._true_value_known = ctx.pool.has_true_value

    def run(self, works: list[PromptWork]) -> None:
        """Run until every tree is closed: batched rounds, or streaming with an async policy.

        A policy with ``submit(conversations) -> futures`` (an engine pool) is streamed:
        each episode's next turn is requested the moment its previous one came back, so
        no episode waits for a round; any other policy runs in synchronous rounds.
        """
        self._roots_open = len(works)
        self._held: list[PromptWork] = []
        if callable(getattr(self.policy, "submit", None)):
            self._run_streaming(works)
        else:
            self._run_rounds(works)

    def _admit(self, pending: list[Episode], live: list[Episode]) -> None:
        """Start queued episodes (replays first, fixed order) up to ``max_batch`` live ones."""
        cap = self.ctx.max_batch
        pending.sort(key=lambda e: e.sort_key)
        room = len(pending) if cap is None else max(0, cap - len(live))
        admitted, pending[:room] = pending[:room], []
        for ep in admitted:
            self._start(ep)
            if ep.done:  # reset/restore failed: the branch ends before its first turn
                self._after_episode(ep, pending)
            else:
                live.append(ep)

    def _run_rounds(self, works: list[PromptWork]) -> None:
        pending: list[Episode] = [e for w in works for e in w.roots]
        live: list[Episode] = []
        while pending or live:
            self._admit(pending, live)
            if not live:
                continue
            live.sort(key=lambda e: e.sort_key)
            self._play_round(live)
            finished = [e for e in live if e.done]
            live = [e for e in live if not e.done]
            for ep in finished:
                self._after_episode(ep, pending)

    def _run_streaming(self, works: list[PromptWork]) -> None:
        pending: list[Episode] = [e for w in works for e in w.roots]
        live: list[Episode] = []
        inflight: dict[Future, tuple[Episode, Conversation, int]] = {}
        while pending or live:
            self._admit(pending, live)
            busy = {id(e) for e, _, _ in inflight.values()}
            idle = sorted((e for e in live if id(e) not in busy), key=lambda e: e.sort_key)
            if idle:
                self._submit([(ep, self._conversation(ep), 0) for ep in idle], inflight)
            if not inflight:
                live = [e for e in live if not e.done]
                continue
            with self._sw("policy"):
                ready, _ = wait_futures(list(inflight), return_when=FIRST_COMPLETED)
            answered = sorted((inflight.pop(f) + (f,) for f in ready), key=lambda x: x[0].sort_key)
            for ep, conv, attempt, fut in answered:
                self._settle(ep, conv, attempt, fut, inflight)
            for ep in [e for e in live if e.done]:
                self._after_episode(ep, pending)
            live = [e for e in live if not e.done]

    def _submit(self, batch: list[tuple[Episode, Conversation, int]], inflight: dict) -> None:
        """Send one request per conversation (the policy may route them to several engines)."""
        rep = self._report
        rep.policy_calls += 1
        rep.largest_batch = max(rep.largest_batch, len(batch))
        self._round += 1
        with self._sw("policy"):
            futures = list(self.policy.submit([conv for _, conv, _ in batch]))  # type: ignore[attr-defined]
        if len(futures) != len(batch):
            raise PolicyError(
                f"submit returned {len(futures)} futures for {len(batch)} conversations"
            )
        for fut, item in zip(futures, batch, strict=True):
            inflight[fut] = item

    def _settle(
        self, ep: Episode, conv: Conversation, attempt: int, fut: Future, inflight: dict
    ) -> None:
        """Take the turn a request answered, re-send it, or fail the branch."""
        err = fut.exception()
        if isinstance(err, EngineUnavailable):
            raise err  # infrastructure, not data: the caller re-runs the prompt elsewhere
        if err is None:
            out = fut.result()
            self._report.measured_turns += 1
            self._take_turn(ep, out, conv)
            return
        failure = _exc("policy.generate", "policy", err)
        log.warning("%s (attempt %d of %d)", failure, attempt + 1, self.ctx.policy_retries + 1)
        if attempt < self.ctx.policy_retries:
            self._report.retried_turns += 1
            self._submit([(ep, conv, attempt + 1)], inflight)
        else:
            self._report.measured_turns += 1
            self._fail(ep, failure, policy_error=True, seed=conv.seed)

    def _start(self, ep: Episode) -> None:
        """Give `ep` an env: reset for a root, restore the prefix checkpoint for a replay."""
        w, sw = ep.work, self._sw
        if not w.started:
            w.started = True
            self._event("roots_started", w)
        ep.env = self.pool.acquire()
        base = unwrap(ep.env)
        try:
            with sw("env"):
                if ep.kind == "rollout":
                    ep.prompt, ep.reset_info = ep.env.reset(
                        seed=ep.env_seed, options={"task": w.tree.prompt_id}
                    )
                else:
                    base.restore(w.checkpoints[ep.anchor][0])
                    if self.ctx.reseed_replays:
                        base.np_random = np.random.Generator(np.random.PCG64(ep.env_seed))
        except Exception as e:  # noqa: BLE001 - a broken branch is data
            where, kind = ("env.reset", "env") if ep.kind == "rollout" else ("env.restore", "infra")
            self._fail(ep, _exc(where, kind, e), env_error=True)

    def _conversation(self, ep: Episode) -> Conversation:
        tree = ep.work.tree
        seed = branch_seed(
            self._step,
            tree.prompt_id,
            ep.anchor,
            ep.child,
            turn=len(ep.turns) + 1,
            base=self.ctx.seed,
        )
        ep.seeds.append(seed)
        return Conversation(
            env_id=tree.env_id,
            task_id=member_task_id(tree.prompt_id, ep.reset_info),
            prompt=ep.prompt,
            turns=ep.prefix_turns + tuple(ep.turns),
            seed=seed,
            reset_info=ep.reset_info,
            prompt_token_ids=None
            if tree.prompt_token_ids is None
            else tuple(tree.prompt_token_ids),
        )

    def _generate(self, convs: list[Conversation]) -> list[PolicyOutput] | Failure:
        """One policy call (with retries); the failure if it kept failing."""
        rep, attempts = self._report, self.ctx.policy_retries + 1
        for attempt in range(attempts):
            self._round += 1
            rep.policy_calls += 1
            rep.largest_batch = max(rep.largest_batch, len(convs))
            try:
                with self._sw("policy"):
                    outs = list(self.policy.generate(convs))
                if len(outs) != len(convs):
                    raise PolicyError(
                        f"returned {len(outs)} outputs for {len(convs)} conversations; a "
                        "policy returns one PolicyOutput per conversation, in order"
                    )
                return outs
            except Exception as e:  # noqa: BLE001 - recorded on every branch of the call
                err = _exc("policy.generate", "policy", e)
                log.warning("%s (attempt %d of %d)", err, attempt + 1, attempts)
                if attempt + 1 < attempts:
                    rep.retried_turns += len(convs)
        return err

    def _play_round(self, live: list[Episode]) -> None:
        """One batched policy call over the live episodes, then one env step each."""
        convs = [self._conversation(ep) for ep in live]
        outs = self._generate(convs)
        rep = self._report
        rep.measured_turns += len(live)
        for i, (ep, conv) in enumerate(zip(live, convs, strict=True)):
            if isinstance(outs, Failure):
                self._fail(ep, outs, policy_error=True, seed=conv.seed)
            else:
                self._take_turn(ep, outs[i], conv)

    def _take_turn(self, ep: Episode, out: PolicyOutput, conv: Conversation) -> None:
        rep, tree = self._report, ep.work.tree
        rep.generated_tokens += len(out.token_ids or ())
        rep.context_tokens += len(out.context_token_ids or ())
        if out.context_token_ids is not None:
            previous = conv.turns[-1] if conv.turns else None
            if previous is None and tree.prompt_token_ids is None:
                tree.prompt_token_ids = list(out.context_token_ids)
            elif previous is not None and previous.obs_token_ids is None:
                previous.obs_token_ids = list(out.context_token_ids)
        if out.error is not None:
            kind = "overflow" if out.finish_reason == "overflow" else "policy"
            self._fail(
                ep, Failure("policy", kind, out.error), policy_error=True, seed=conv.seed, out=out
            )
            return
        turn = Turn(
            action=out.text,
            observation="",
            token_ids=_list(out.token_ids),
            logprobs=_list(out.logprobs),
        )
        if out.finish_reason == "overflow":
            rep.overflows += 1
            turn.info["overflow"] = True
            self._record(ep, turn, conv.seed, None)
            ep.done, ep.truncated, ep.overflow = True, True, True
            return
        env = ep.env
        assert env is not None, "a live episode holds an env (_start gave it one)"
        base = unwrap(env)
        exact = base if self._true_value_known and isinstance(base, ExactValue) else None
        try:
            with self._sw("env"):
                obs, reward, terminated, truncated, info = env.step(out.text)
                rep.env_steps += 1
                tv = None if exact is None else float(exact.true_value())
                done = bool(terminated or truncated)
                ckpt = (base.checkpoint(), env) if ep.kind == "rollout" and not done else None
        except Exception as e:  # noqa: BLE001 - a broken branch is data
            self._fail(ep, _exc("env.step", "env", e), env_error=True, seed=conv.seed, out=out)
            return
        turn.observation, turn.reward, turn.info = obs, float(reward), dict(info)
        self._record(ep, turn, conv.seed, tv, ckpt)
        if done:
            ep.done, ep.reward, ep.terminated, ep.truncated = (
                True,
                float(reward),
                bool(terminated),
                bool(truncated),
            )

    def _record(
        self,
        ep: Episode,
        turn: Turn,
        seed: int,
        tv: float | None,
        ckpt: tuple[Checkpoint, gym.Env] | None = None,
    ) -> None:
        ep.turns.append(turn)
        ep.true_values.append(tv)
        ep.checkpoints.append(ckpt)
        if len(ep.seeds) < len(ep.turns):
            ep.seeds.append(seed)

    def _fail(
        self,
        ep: Episode,
        error: Failure,
        *,
        env_error: bool = False,
        policy_error: bool = False,
        seed: int | None = None,
        out: PolicyOutput | None = None,
    ) -> None:
        """End `ep` on a failed leaf that records `error` (and what the policy said, if anything)."""
        rep = self._report
        rep.env_errors += int(env_error)
        rep.policy_errors += int(policy_error)
        turn = Turn(
            action="" if out is None else out.text,
            observation="",
            token_ids=None if out is None else _list(out.token_ids),
            logprobs=None if out is None else _list(out.logprobs),
        )
        if seed is None:
            seed = ep.env_seed
        self._record(ep, turn, seed, None)
        ep.done, ep.error = True, error

    # ------------------------------------------------------------------ per-prompt phases
    def _after_episode(self, ep: Episode, pending: list[Episode]) -> None:
        """Free the episode's env; advance its prompt's phase when it was the last one."""
        if ep.env is not None:
            self.pool.give_back(ep.env)
            ep.env = None
        w = ep.work
        if w.phase == "roots" and all(e.done for e in w.roots):
            self._event("roots_done", w)
            self._insert(w, w.roots)
            self._roots_open -= 1
            if self.ctx.expansion == "per-prompt":
                self._expand(w, pending)
                return
            w.phase = "held"  # global barrier: expand once every root of the step is done
            self._held.append(w)
            if self._roots_open == 0:
                for h in sorted(self._held, key=lambda h: h.order):
                    self._expand(h, pending)
                self._held = []
        elif w.phase == "replays" and all(e.done for e in w.replays):
            self._close(w)

    def _expand(self, w: PromptWork, pending: list[Episode]) -> None:
        """Allocate `w`'s replays (the ``on_roots_done`` hook) and queue them, or close it."""
        w.replays = list(self.on_roots_done(w))
        # checkpoints no replay will restore are released now, the rest when the tree closes
        used = {e.anchor for e in w.replays}
        for n in [n for n in w.checkpoints if n not in used]:
            self._release(w, n)
        if w.replays:
            w.phase = "replays"
            self._event("expand", w)
            pending.extend(w.replays)
        else:
            self._close(w)

    def _insert(self, w: PromptWork, episodes: list[Episode]) -> None:
        """Append the buffered turns of `episodes` to the tree, in their fixed order."""
        tree, version = w.tree, self.ctx.policy_version
        for ep in episodes:
            node_id = ep.anchor
            for k, turn in enumerate(ep.turns):
                node = tree.add_child(
                    node_id,
                    turn,
                    origin=ep.kind,
                    seed=ep.seeds[k],
                    true_value=ep.true_values[k],
                    policy_version=version,
                )
                node_id = node.id
                taken = ep.checkpoints[k]
                if taken is not None:
                    w.checkpoints[node_id] = taken
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
            if failed:
                self._report.failed_branches += 1

    def _close(self, w: PromptWork) -> None:
        self._insert(w, w.replays)
        for n in list(w.checkpoints):
            self._release(w, n)
        w.phase = "closed"
        w.tree.compute_targets()
        self._event("closed", w)

    def _release(self, w: PromptWork, node_id: int) -> None:
        ckpt, env = w.checkpoints.pop(node_id)
        try:
            with self._sw("env"):
                unwrap(env).release(ckpt)
        except Exception as e:  # noqa: BLE001 - a leaked handle must not end the step
            log.warning("releasing checkpoint of node %d failed: %s", node_id, e)

    def _event(self, kind: str, w: PromptWork) -> None:
        self._report.events.append(Event(self._round, kind, w.tree.prompt_id))


def _list(x: Any) -> list[Any] | None:
    return None if x is None else list(x)
