"""Stage 3 of a runner step: execute episodes in batched rounds and build the trees.

`StepScheduler` runs one step's episodes in rounds. Each round admits queued episodes
(replays of already-expanded prompts first, then roots, in a fixed order) up to
``max_batch`` live ones, makes *one* ``policy.generate`` call over every live episode
and steps each env once. When the last root of a prompt finishes, its turns go into the
tree and the ``on_roots_done(work)`` hook (`trace_gym.plan.expand`) returns the replays to
queue; when its last replay finishes, its tree closes and its checkpoints are released.
No prompt waits for another.

The scheduler decides nothing about the budget and knows no runner: everything it reads
comes in one `StepContext` (`trace_gym.step`). What it changes: the run state of the
episodes it is handed (through `Episode` methods), their prompts' trees (through
`PromptWork.insert`), the step's report (through `StepReport`'s ``count_*`` methods),
and the envs of the pool (reset, step, restore, reseed, release). It asks the env what it
is only through the pool (`trace_gym.step.EnvPool`), never by name.

Every policy call goes through one path (``_send``): a synchronous ``generate`` and an
asynchronous ``submit`` both answer with one future per conversation, and every answer
is settled the same way (``_settle``): taken as the turn, re-sent (at most
``policy_retries`` times, the re-sends of one settle batched into one call), or recorded
as the branch's failure.

Episodes buffer their turns and are inserted into their tree in a fixed order (roots
by index, replays by prefix then index), so node ids - and with them every branch
seed - do not depend on how the work was batched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from typing import Any, cast

from trace_gym.core import ExactValue, unwrap
from trace_gym.errors import EngineUnavailable, PolicyError
from trace_gym.policy import Conversation, PolicyOutput
from trace_gym.seeding import branch_seed
from trace_gym.step import (
    EXPANSIONS,
    EnvPool,
    Episode,
    PromptWork,
    StepContext,
    set_step,
    tell_step,
)
from trace_gym.tree import Failure, Turn

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

#: one conversation in flight: its episode, the conversation, the attempt (0 = first)
_Request = tuple[Episode, Conversation, int]


def _exc(where: str, kind: str, e: BaseException) -> Failure:
    return Failure(where, kind, f"{type(e).__name__}: {e}")


def _answered(result: Any = None, error: BaseException | None = None) -> Future:
    """A future that is already done (a synchronous answer, in the shape `submit` gives)."""
    fut: Future = Future()
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
    return fut


class StepScheduler:
    """Runs the episodes of one step (see the module docstring).

    `on_roots_done(work)` is called once per prompt, after its root rollouts are in its
    tree, and returns the replays to run from that tree's prefixes (or none). Under the
    global expansion (every prompt's roots first), `on_all_roots_done(works)`, when given,
    is called once with every prompt instead and returns each one's replays, in order.
    """

    def __init__(
        self,
        ctx: StepContext,
        on_roots_done: Callable[[PromptWork], list[Episode]],
        on_all_roots_done: Callable[[list[PromptWork]], list[list[Episode]]] | None = None,
    ):
        self.ctx = ctx
        self.on_roots_done = on_roots_done
        self.on_all_roots_done = on_all_roots_done
        self.policy, self.pool = ctx.policy, ctx.pool
        self._step, self._report, self._sw = ctx.step, ctx.report, ctx.stopwatch
        self._round = 0
        self._true_value_known = ctx.pool.has_true_value
        self._streaming = callable(getattr(self.policy, "submit", None))

    def run(self, works: list[PromptWork]) -> None:
        """Run until every tree is closed: batched rounds, or streaming with an async policy.

        A policy with ``submit(conversations) -> futures`` (an engine pool) is streamed:
        each episode's next turn is requested the moment its previous one came back, so
        no episode waits for a round; any other policy runs in synchronous rounds.
        """
        self._roots_open = len(works)
        self._held: list[PromptWork] = []
        if self._streaming:
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

    def _play_round(self, live: list[Episode]) -> None:
        """One batched policy call over the live episodes (re-sent while it raises), one env step each."""
        batch: list[_Request] = [(ep, self._conversation(ep), 0) for ep in live]
        while batch:
            batch = self._settle(list(zip(batch, self._send(batch), strict=True)))

    def _run_streaming(self, works: list[PromptWork]) -> None:
        pending: list[Episode] = [e for w in works for e in w.roots]
        live: list[Episode] = []
        inflight: dict[Future, _Request] = {}
        while pending or live:
            self._admit(pending, live)
            busy = {id(e) for e, _, _ in inflight.values()}
            idle = sorted((e for e in live if id(e) not in busy), key=lambda e: e.sort_key)
            if idle:
                self._queue([(ep, self._conversation(ep), 0) for ep in idle], inflight)
            if not inflight:
                live = [e for e in live if not e.done]
                continue
            with self._sw("policy"):
                ready, _ = wait_futures(list(inflight), return_when=FIRST_COMPLETED)
            answered = sorted(((inflight.pop(f), f) for f in ready), key=lambda x: x[0][0].sort_key)
            retries = self._settle(answered)
            if retries:
                self._queue(retries, inflight)
            for ep in [e for e in live if e.done]:
                self._after_episode(ep, pending)
            live = [e for e in live if not e.done]

    def _queue(self, batch: list[_Request], inflight: dict[Future, _Request]) -> None:
        for fut, item in zip(self._send(batch), batch, strict=True):
            inflight[fut] = item

    # ------------------------------------------------------------------ the policy-call path
    def _send(self, batch: list[_Request]) -> list[Future]:
        """The one policy call: `batch`'s conversations in, one future per conversation out.

        ``submit`` (an async policy) returns futures; ``generate`` is answered at once.
        A call that raises (or answers the wrong number) fails each of its conversations.
        """
        convs = [conv for _, conv, _ in batch]
        self._round += 1
        self._report.count_call(len(convs))
        try:
            with self._sw("policy"):
                if self._streaming:
                    futures = list(self.policy.submit(convs))  # type: ignore[attr-defined]
                else:
                    futures = [_answered(out) for out in self.policy.generate(convs)]
            if len(futures) != len(convs):
                what = "futures" if self._streaming else "outputs"
                raise PolicyError(
                    f"returned {len(futures)} {what} for {len(convs)} conversations; a "
                    "policy answers each conversation once, in order"
                )
        except EngineUnavailable:
            raise  # infrastructure, not data: the caller re-runs the prompt elsewhere
        except Exception as e:  # noqa: BLE001 - recorded on every branch of the call
            return [_answered(error=e) for _ in convs]
        return futures

    def _settle(self, answered: list[tuple[_Request, Future]]) -> list[_Request]:
        """Take each answer as its turn or record the failure; returns the requests to re-send."""
        retries: list[_Request] = []
        logged: set[tuple[str, int]] = set()
        for (ep, conv, attempt), fut in answered:
            err = fut.exception()
            if isinstance(err, EngineUnavailable):
                raise err  # infrastructure, not data: the caller re-runs the prompt elsewhere
            if err is None:
                out = fut.result()
                self._report.count_turn(out)
                self._take_turn(ep, out, conv)
                continue
            failure = _exc("policy.generate", "policy", err)
            if (str(failure), attempt) not in logged:  # once per distinct error and attempt
                logged.add((str(failure), attempt))
                log.warning(
                    "%s (attempt %d of %d)", failure, attempt + 1, self.ctx.policy_retries + 1
                )
            if attempt < self.ctx.policy_retries:
                self._report.count_retry()
                retries.append((ep, conv, attempt + 1))
            else:
                self._report.count_turn()
                self._fail(ep, failure, policy_error=True, seed=conv.seed)
        return retries

    # ------------------------------------------------------------------ one branch
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
                        base.reseed(ep.env_seed)
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
            task_id=self.pool.policy_task_id(tree.prompt_id, ep.reset_info),
            prompt=ep.prompt,
            turns=ep.prefix_turns + tuple(ep.turns),
            seed=seed,
            reset_info=ep.reset_info,
            prompt_token_ids=None
            if tree.prompt_token_ids is None
            else tuple(tree.prompt_token_ids),
        )

    def _take_turn(self, ep: Episode, out: PolicyOutput, conv: Conversation) -> None:
        tree = ep.work.tree
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
            self._report.count_overflow()
            turn.info["overflow"] = True
            ep.record(turn, conv.seed, None)
            ep.end(ep.reward, False, True, overflow=True)
            return
        self._step_env(ep, turn, out, conv)

    def _step_env(self, ep: Episode, turn: Turn, out: PolicyOutput, conv: Conversation) -> None:
        """Step `ep`'s env with the turn's action; record the turn (and a checkpoint mid-rollout)."""
        env = ep.env
        assert env is not None, "a live episode holds an env (_start gave it one)"
        base = unwrap(env)
        try:
            with self._sw("env"):
                obs, reward, terminated, truncated, info = env.step(out.text)
                self._report.count_env_step()
                tv = float(cast(ExactValue, base).true_value()) if self._true_value_known else None
                done = bool(terminated or truncated)
                ckpt = (base.checkpoint(), env) if ep.kind == "rollout" and not done else None
        except Exception as e:  # noqa: BLE001 - a broken branch is data
            self._fail(ep, _exc("env.step", "env", e), env_error=True, seed=conv.seed, out=out)
            return
        turn.observation, turn.reward, turn.info = obs, float(reward), dict(info)
        ep.record(turn, conv.seed, tv, ckpt)
        if done:
            ep.end(float(reward), bool(terminated), bool(truncated))

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
        self._report.count_error(policy=policy_error, env=env_error)
        turn = Turn(
            action="" if out is None else out.text,
            observation="",
            token_ids=None if out is None else _list(out.token_ids),
            logprobs=None if out is None else _list(out.logprobs),
        )
        ep.fail(error, turn, ep.env_seed if seed is None else seed)

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
                held = sorted(self._held, key=lambda h: h.order)
                self._held = []
                if self.on_all_roots_done is None:
                    for h in held:
                        self._expand(h, pending)
                    return
                for h, replays in zip(held, self.on_all_roots_done(held), strict=True):
                    self._expand(h, pending, replays)
        elif w.phase == "replays" and all(e.done for e in w.replays):
            self._close(w)

    def _expand(
        self, w: PromptWork, pending: list[Episode], replays: list[Episode] | None = None
    ) -> None:
        """Queue `w`'s replays (`replays`, else the ``on_roots_done`` hook's), or close it."""
        w.replays = list(self.on_roots_done(w) if replays is None else replays)
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
        self._report.count_failed(w.insert(episodes, self.ctx.policy_version))

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
        self._report.add_event(self._round, kind, w.tree.prompt_id)


def _list(x: Any) -> list[Any] | None:
    return None if x is None else list(x)
