"""verl adapter: trace-gym envs as a verl agent loop, TRACE deciding where verl branches.

Two halves (the contract, field by field, is in docs/verl.md):

- `TraceEnvAgentLoop`, registered with verl as ``"trace_env"``
  (``verl.experimental.agent_loop.agent_loop.register``): a subclass of verl's
  ``AgentLoopBase`` that plays one restorable env (``gym.make("trace/...")``) turn by
  turn. Each assistant turn is one ``await server_manager.generate(request_id,
  prompt_ids=..., sampling_params=...)`` on token ids (verl's ``LLMServerClient`` API);
  the env's observation is tokenised on its own and appended with mask 0 (the token
  contract of `trace_gym.agents.context`); a checkpoint is taken at every turn boundary
  and returned, pickled, in ``extra_fields["trace_gym_result"]``. A sample whose ``trace_gym``
  field carries a ``restore`` request starts from that checkpoint and from exactly the
  prefix's token ids instead of resetting.
- `VerlTraceRunner`: the driver side. A `BranchingRunner` whose execution stage sends
  its episodes to verl's ``generate_sequences`` (``AgentLoopWorker`` or
  ``AgentLoopManager``) as two ``DataProto`` batches - the root rollouts TRACE allocated,
  then the replays TRACE's prefix allocation chose, as restore requests - and grows the
  same `RolloutTree`s the local runner grows. ``last_batch`` is verl's concatenated
  output, ready for verl's advantage and update code (``uid`` groups a prompt's rollouts
  and replays).
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from uuid import uuid4

import gymnasium as gym
import numpy as np
from trace_gym.agents.context import ChatTokens, obs_role
from trace_gym.agents.hf import model_formats

from trace_gym import plan
from trace_gym.core import restore as restore_env
from trace_gym.core import unwrap
from trace_gym.errors import ConfigError, DependencyNotInstalled
from trace_gym.optional import EXTRAS
from trace_gym.policy import Conversation
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.scheduling import EnvPool, Episode, PromptWork, StepContext
from trace_gym.seeding import branch_seed
from trace_gym.tree import Failure, Turn

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
    from verl.protocol import DataProto
except ImportError as e:  # pragma: no cover - exercised only without the verl extra
    raise DependencyNotInstalled("verl (the verl adapter)", EXTRAS["verl"]) from e

__all__ = [
    "AGENT_NAME",
    "TraceEnvAgentLoop",
    "VerlTraceRunner",
    "close_pools",
    "object_array",
    "trace_request",
]

#: the agent loop's name in verl's registry (a sample's ``agent_name``)
AGENT_NAME = "trace_env"


def trace_request(
    env_id: str,
    task: str,
    *,
    env_kwargs: dict | None = None,
    env_seed: int = 0,
    step: int = 0,
    anchor: int = 0,
    child: int = 0,
    seed: int = 0,
    restore: dict | None = None,
    episode: int = 0,
) -> dict[str, Any]:
    """The ``trace_gym`` field of one verl sample: which env and task to play, and from where.

    `step`, `anchor`, `child` and `seed` give each turn its sampling seed
    (`trace_gym.seeding.branch_seed`, as the local runner draws them); `restore` is a
    replay's start (see `VerlTraceRunner`); `episode` is echoed back in the result.
    """
    return {
        "env_id": env_id,
        "task": str(task),
        "env_kwargs": dict(env_kwargs or {}),
        "env_seed": int(env_seed),
        "step": int(step),
        "anchor": int(anchor),
        "child": int(child),
        "seed": int(seed),
        "restore": restore,
        "episode": int(episode),
    }


# ---------------------------------------------------------------------- the agent loop
_POOLS: dict[tuple[str, str], EnvPool] = {}


@atexit.register
def close_pools() -> None:
    """Close the agent loop's pooled envs (sandboxes, retrievers); also run at exit."""
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def _pool(spec: dict[str, Any]) -> EnvPool:
    """A process-wide env pool per (env id, kwargs): envs are reused across samples."""
    key = (spec["env_id"], repr(sorted(spec["env_kwargs"].items())))
    if key not in _POOLS:
        _POOLS[key] = EnvPool(partial(gym.make, spec["env_id"], **spec["env_kwargs"]))
    return _POOLS[key]


def _spec(kwargs: dict[str, Any]) -> dict[str, Any]:
    spec = kwargs.get("trace_gym")
    if not isinstance(spec, dict) or "env_id" not in spec or "task" not in spec:
        raise ConfigError(
            f"agent loop {AGENT_NAME!r} needs a 'trace_gym' field per sample (a dict from "
            "trace_gym.trainers.verl_adapter.trace_request: env_id, task, ...); got "
            f"{type(spec).__name__}"
        )
    return {**trace_request(spec["env_id"], spec["task"]), **spec}


@dataclass
class _Episode:
    """The state of one agent-loop episode (token lists are verl's response fields)."""

    spec: dict[str, Any]
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[bytes] = field(default_factory=list)
    prefix_turns: int = 0
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    overflow: bool = False
    error: dict[str, str] | None = None
    done: bool = False


@register(AGENT_NAME)
class TraceEnvAgentLoop(AgentLoopBase):
    """verl agent loop over a trace-gym env (module docstring; contract in docs/verl.md)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.pop("tools", None)  # verl passes its tool list to every loop; envs bring their own
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)
        model_path = str(self.config.actor_rollout_ref.model.path)
        self.chat = ChatTokens(self.tokenizer, model_formats(model_path))
        self.max_assistant_turns = self.rollout_config.multi_turn.get("max_assistant_turns")

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        spec = _spec(kwargs)
        pool = _pool(spec)
        env = pool.acquire()
        ep = _Episode(spec)
        try:
            await self._start(env, ep)
            if (
                len(ep.prompt_ids) > self.prompt_length and ep.error is None
            ):  # never truncated: a failed branch
                ep.error = {
                    "where": "context",
                    "kind": "overflow",
                    "message": f"prompt of {len(ep.prompt_ids)} "
                    f"tokens exceeds actor_rollout_ref.rollout.prompt_length={self.prompt_length}",
                }
                ep.done = True
            while not ep.done:
                await self._turn(env, ep, sampling_params)
        finally:
            pool.give_back(env)
        return self._output(ep)

    async def _start(self, env: gym.Env, ep: _Episode) -> None:
        spec, loop = ep.spec, asyncio.get_running_loop()
        req = spec.get("restore")
        try:
            if req is None:
                prompt, info = await loop.run_in_executor(
                    None, partial(env.reset, seed=spec["env_seed"], options={"task": spec["task"]})
                )
                conv = Conversation(spec["env_id"], spec["task"], prompt, (), 0, reset_info=info)
                ep.prompt_ids = self.chat.prompt_ids(conv)
                return
            await loop.run_in_executor(None, restore_env, env, pickle.loads(req["checkpoint"]))
            unwrap(env).reseed(spec["env_seed"])
        except Exception as e:  # noqa: BLE001 - a broken branch is data
            where = "env.reset" if req is None else "env.restore"
            ep.error, ep.done = (
                {"where": where, "kind": "env" if req is None else "infra", "message": repr(e)},
                True,
            )
            if req is None:
                return
        ep.prompt_ids = list(req["prompt_ids"])
        ep.response_ids = list(req["response_ids"])
        ep.response_mask = [int(bool(req.get("train_prefix")))] * len(ep.response_ids)
        ep.response_logprobs = list(req.get("response_logprobs") or [0.0] * len(ep.response_ids))
        ep.prefix_turns = int(req["turns"])

    def _seed(self, ep: _Episode) -> int:
        s = ep.spec
        turn = len(ep.turns) + 1  # the local runner's numbering: turns of this branch
        return branch_seed(
            s["step"], s["task"], s["anchor"], s["child"], turn=turn, base=s["seed"]
        ) % (2**31)

    async def _turn(self, env: gym.Env, ep: _Episode, sampling_params: dict[str, Any]) -> None:
        """One assistant turn, one env step, the observation appended, a checkpoint taken."""
        fmt = self.chat.format(ep.spec["env_id"])
        room = self.response_length - len(ep.response_ids)
        if room <= 0 or (
            self.max_assistant_turns and len(ep.turns) + ep.prefix_turns >= self.max_assistant_turns
        ):
            ep.truncated, ep.overflow, ep.done = True, room <= 0, True
            return
        cap = min(int(sampling_params.get("max_tokens") or fmt.max_new_tokens), fmt.max_new_tokens)
        params = {
            **sampling_params,
            "stop": list(fmt.stop),
            "include_stop_str_in_output": True,
            "max_tokens": min(cap, room),
            "seed": self._seed(ep),
        }
        out = await self.server_manager.generate(
            uuid4().hex, prompt_ids=ep.prompt_ids + ep.response_ids, sampling_params=params
        )
        ids, seed = list(out.token_ids), params["seed"]
        start = len(ep.response_ids)
        ep.response_ids += ids
        ep.response_mask += [1] * len(ids)
        ep.response_logprobs += list(out.log_probs) if out.log_probs else [0.0] * len(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        record = {
            "action": text,
            "observation": "",
            "reward": 0.0,
            "start": start,
            "end": len(ep.response_ids),
            "obs_end": len(ep.response_ids),
            "seed": seed,
            "info": {},
            "logprobs": out.log_probs is not None,
        }
        ep.turns.append(record)
        if len(ids) >= room and room < cap:  # the response budget, not the turn cap, ended it
            record["info"]["overflow"] = True
            ep.truncated, ep.overflow, ep.done = True, True, True
            return
        await self._step(env, ep, record, ids)

    async def _step(
        self, env: gym.Env, ep: _Episode, record: dict[str, Any], ids: list[int]
    ) -> None:
        fmt = self.chat.format(ep.spec["env_id"])
        loop = asyncio.get_running_loop()
        try:
            obs, reward, terminated, truncated, info = await loop.run_in_executor(
                None, env.step, record["action"]
            )
            done = bool(terminated or truncated)
            blob = None if done else await loop.run_in_executor(None, _checkpoint_blob, env)
        except Exception as e:  # noqa: BLE001 - a broken branch is data
            ep.error, ep.done = {"where": "env.step", "kind": "env", "message": repr(e)}, True
            return
        record.update(observation=obs, reward=float(reward), info=dict(info))
        if done:
            ep.reward, ep.terminated, ep.truncated, ep.done = (
                float(reward),
                bool(terminated),
                bool(truncated),
                True,
            )
            return
        obs_ids = self.chat.obs_ids(obs, fmt, ids, obs_role(info))
        if len(ep.response_ids) + len(obs_ids) >= self.response_length:  # no room for the next turn
            record["info"]["overflow"] = True
            ep.truncated, ep.overflow, ep.done = True, True, True
            return
        ep.response_ids += obs_ids
        ep.response_mask += [0] * len(obs_ids)
        ep.response_logprobs += [0.0] * len(obs_ids)
        record["obs_end"] = len(ep.response_ids)
        ep.checkpoints.append(blob)

    def _output(self, ep: _Episode) -> AgentLoopOutput:
        n = self.response_length
        mask = (
            [0] * len(ep.response_mask) if ep.error else ep.response_mask
        )  # a failed branch trains nothing
        result = {
            "episode": ep.spec["episode"],
            "task": ep.spec["task"],
            "env_id": ep.spec["env_id"],
            "turns": ep.turns,
            "checkpoints": ep.checkpoints,
            "prefix_turns": ep.prefix_turns,
            "prompt_ids": ep.prompt_ids,
            "reward": None if ep.error else ep.reward,
            "terminated": ep.terminated,
            "truncated": ep.truncated or bool(ep.error),
            "overflow": ep.overflow,
            "error": ep.error,
        }
        return AgentLoopOutput(
            prompt_ids=self._cap_text_prompt_length(
                ep.prompt_ids
            ),  # verl pads prompts to prompt_length
            response_ids=ep.response_ids[:n],
            response_mask=mask[:n],
            response_logprobs=ep.response_logprobs[:n],
            reward_score=0.0 if ep.error else ep.reward,
            num_turns=1 + 2 * len(ep.turns) + 2 * ep.prefix_turns,
            metrics={},
            extra_fields={
                "trace_gym_result": result,
                "turn_scores": [t["reward"] for t in ep.turns],
                "tool_rewards": [],
            },
        )


def _checkpoint_blob(env: gym.Env) -> bytes:
    """The env's checkpoint, pickled (it travels through Ray and DataProto), then released."""
    base = unwrap(env)
    ckpt = base.checkpoint()
    try:
        return pickle.dumps(ckpt)
    finally:
        base.release(ckpt)


# ---------------------------------------------------------------------- the driver
class _VerlRollout:
    """The runner's "policy": verl generates, through ``generate_sequences``, never through this."""

    def __init__(self, generate_sequences: Callable[[Any], Any]):
        self.generate_sequences = generate_sequences

    def generate(self, conversations: Sequence[Conversation]) -> list:
        raise ConfigError(
            "VerlTraceRunner rolls out through verl's generate_sequences, not generate()"
        )


def _resolve(value: Any) -> Any:
    """The result of a sync call, or of an async one (verl's workers are async)."""
    return asyncio.run(value) if inspect.isawaitable(value) else value


class VerlTraceRunner(BranchingRunner):
    """`BranchingRunner` whose episodes run in verl's agent loop (module docstring).

    `generate_sequences` is verl's ``AgentLoopWorker.generate_sequences`` or
    ``AgentLoopManager.generate_sequences`` (sync or async), or anything taking and
    returning a ``DataProto`` the same way. `env_id` / `env_kwargs` name the env the
    agent loop builds in its own process. `train_prefix`: whether a replay's copy of its
    prefix counts in its ``response_mask`` (default no: those tokens are trained once,
    in the root rollout that generated them).
    """

    def __init__(
        self,
        generate_sequences: Callable[[Any], Any],
        env_id: str,
        allocator: Any,
        predictor: Any,
        config: RunnerConfig,
        *,
        env_kwargs: dict | None = None,
        train_prefix: bool = False,
        agent_name: str = AGENT_NAME,
    ):
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        super().__init__(
            _VerlRollout(generate_sequences),
            partial(gym.make, env_id, **self.env_kwargs),
            allocator,
            predictor,
            config,
        )
        self.train_prefix, self.agent_name = bool(train_prefix), agent_name
        #: verl's output of the last step: root rollouts then replays (``DataProto.concat``)
        self.last_batch: Any = None
        #: the ``meta_info["timing"]`` of each of the last step's verl calls ("roots",
        #: "replays"), taken out of the outputs: ``AgentLoopManager`` sets one per call, and
        #: ``DataProto.concat`` refuses two different values under one key
        self.last_timing: dict[str, dict[str, Any]] = {}

    def _run_works(self, ctx: StepContext, works: list[PromptWork]) -> int:
        roots = [ep for w in works for ep in w.roots]
        self.last_timing = {}
        outs = [self._rollout(ctx, roots, "roots")]
        for w in works:
            _insert(ctx, w, w.roots)
            w.replays = plan.expand(ctx, w)
        replays = [ep for w in works for ep in w.replays]
        if replays:
            outs.append(self._rollout(ctx, replays, "replays"))
        for w in works:
            _insert(ctx, w, w.replays)
            for (
                node
            ) in w.tree.nodes:  # checkpoints live for the step only (trees stay serialisable)
                node.info.pop("verl_checkpoint", None)
            w.phase = "closed"
            w.tree.compute_targets()
        self.last_batch = outs[0] if len(outs) == 1 else DataProto.concat(outs)
        return 0

    def _rollout(self, ctx: StepContext, episodes: list[Episode], stage: str) -> Any:
        """One verl batch for `episodes`; each episode gets its result (turns, checkpoints)."""
        batch = self._batch(ctx, episodes)
        with ctx.stopwatch("policy"):
            out = _resolve(self.policy.generate_sequences(batch))
        self.last_timing[stage] = dict(out.meta_info.pop("timing", None) or {})
        ctx.report.policy_calls += 1
        ctx.report.largest_batch = max(ctx.report.largest_batch, len(episodes))
        results = out.non_tensor_batch["trace_gym_result"]
        if len(results) != len(episodes):
            raise ConfigError(f"verl returned {len(results)} outputs for {len(episodes)} samples")
        by_episode = {int(r["episode"]): (i, r) for i, r in enumerate(results)}
        for k, ep in enumerate(episodes):
            i, r = by_episode[k]
            _take_result(ctx, ep, r, _response_row(out, i))
        return out

    def _batch(self, ctx: StepContext, episodes: list[Episode]) -> Any:
        rows = [self._request(ctx, k, ep) for k, ep in enumerate(episodes)]
        uid = [f"{ctx.step}:{ep.work.tree.prompt_id}" for ep in episodes]
        raw = [[{"role": "user", "content": ep.prompt}] for ep in episodes]
        return DataProto.from_dict(
            non_tensors={
                "trace_gym": object_array(rows),
                "uid": object_array(uid),
                "raw_prompt": object_array(raw),
                "agent_name": object_array([self.agent_name] * len(episodes)),
                "index": np.array([ep.work.order for ep in episodes]),
            },
            meta_info={"global_steps": ctx.step},
        )

    def _request(self, ctx: StepContext, k: int, ep: Episode) -> dict[str, Any]:
        tree = ep.work.tree
        restore = None
        if ep.kind == "replay":
            ids, lps, turns = _prefix_tokens(tree, ep.anchor)
            restore = {
                "checkpoint": tree.nodes[ep.anchor].info["verl_checkpoint"],
                "prompt_ids": tree.prompt_token_ids,
                "response_ids": ids,
                "response_logprobs": lps,
                "turns": turns,
                "train_prefix": self.train_prefix,
            }
        return trace_request(
            self.env_id,
            tree.prompt_id,
            env_kwargs=self.env_kwargs,
            env_seed=ep.env_seed,
            step=ctx.step,
            anchor=ep.anchor,
            child=ep.child,
            seed=ctx.seed,
            restore=restore,
            episode=k,
        )


def object_array(values: list) -> np.ndarray:
    """`values` as a 1-D object array (what a DataProto's non-tensor fields hold)."""
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _response_row(out: Any, i: int) -> tuple[list[int], list[float] | None]:
    """Row `i`'s response ids (padding cut) and its rollout logprobs, from verl's batch."""
    batch = out.batch
    width = batch["prompts"].shape[1]
    n = int(batch["attention_mask"][i, width:].sum())
    ids = batch["responses"][i, :n].tolist()
    lps = (
        batch["rollout_log_probs"][i, :n].tolist() if "rollout_log_probs" in batch.keys() else None
    )
    return ids, lps


def _prefix_tokens(tree: Any, node_id: int) -> tuple[list[int], list[float], int]:
    """The response ids (turns and observations) from the prompt to `node_id`, exactly as generated."""
    ids: list[int] = []
    lps: list[float] = []
    turns = tree.turns(node_id)
    for t in turns:
        gen, obs = list(t.token_ids or []), list(t.obs_token_ids or [])
        ids += gen + obs
        lps += list(t.logprobs or [0.0] * len(gen)) + [0.0] * len(obs)
    return ids, lps, len(turns)


def _take_result(ctx: StepContext, ep: Episode, r: dict[str, Any], row: tuple) -> None:
    """Fill `ep` (turns, seeds, checkpoints, outcome) from one agent-loop result."""
    ids, lps = row
    tree = ep.work.tree
    if tree.prompt_token_ids is None:
        tree.prompt_token_ids = list(r["prompt_ids"])
    for k, t in enumerate(r["turns"]):
        turn = Turn(
            action=t["action"],
            observation=t["observation"],
            reward=float(t["reward"]),
            token_ids=ids[t["start"] : t["end"]],
            obs_token_ids=ids[t["end"] : t["obs_end"]],
            logprobs=lps[t["start"] : t["end"]] if lps is not None and t["logprobs"] else None,
            info=dict(t["info"]),
        )
        ep.turns.append(turn)
        ep.seeds.append(int(t["seed"]))
        ep.true_values.append(None)
        blob = r["checkpoints"][k] if k < len(r["checkpoints"]) and ep.kind == "rollout" else None
        ep.checkpoints.append(blob)  # type: ignore[arg-type]
        ctx.report.generated_tokens += t["end"] - t["start"]
        ctx.report.env_steps += 0 if t["info"].get("overflow") else 1
    ctx.report.measured_turns += len(r["turns"])
    ep.reward = 0.0 if r["reward"] is None else float(r["reward"])
    ep.terminated, ep.truncated, ep.overflow, ep.done = (
        bool(r["terminated"]),
        bool(r["truncated"]),
        bool(r["overflow"]),
        True,
    )
    ctx.report.overflows += int(ep.overflow)
    if r["error"]:
        e = r["error"]
        ep.error = Failure(e["where"], e["kind"], e["message"])
        ctx.report.env_errors += int(e["kind"] == "env")


def _insert(ctx: StepContext, w: PromptWork, episodes: list[Episode]) -> None:
    """Append `episodes`' turns to the tree in their fixed order (as the local scheduler does)."""
    tree = w.tree
    for ep in episodes:
        node_id = ep.anchor
        for k, turn in enumerate(ep.turns):
            node = tree.add_child(
                node_id, turn, origin=ep.kind, seed=ep.seeds[k], policy_version=ctx.policy_version
            )
            node_id = node.id
            if ep.checkpoints[k] is not None:
                node.info["verl_checkpoint"] = ep.checkpoints[k]
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
        ctx.report.failed_branches += int(failed)
