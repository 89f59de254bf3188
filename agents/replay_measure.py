"""Measured cost of a replay from each depth, relative to a full rollout (`trace-gym bench replay-cost`).

For each task: one full rollout with the policy, checkpointing the env at every turn
boundary; then, from each depth d (d turns kept), a replay that restores the checkpoint,
resumes from the prefix's exact token ids (the token contract) with a fresh seed and
runs to the end. Per turn the policy reports its context length (``info
["context_tokens"]``) and, for vLLM, how many of those tokens the prefix cache already
held (``info["cached_tokens"]``, vLLM's ``RequestOutput.num_cached_tokens``). So, per
episode:

- ``prefill``: context tokens the engine was handed (what prefill costs with no cache);
- ``prefill_computed``: those minus the cached ones (what it actually computed);
- ``decode``: tokens generated;
- ``seconds``: wall time of the policy calls.

A replay's ratio at depth d is its figure over the full rollout's figure (averaged over
tasks); ``prefill_saved_share`` is the share of prefill tokens the cache served.
HF has no cross-call cache, so there ``prefill_computed == prefill``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from trace_gym.core import checkpoint, restore
from trace_gym.policy import Conversation
from trace_gym.tree import Turn

__all__ = ["EpisodeCost", "measure_replay_cost"]

COST_KEYS = ("prefill", "prefill_computed", "decode", "seconds")


@dataclass
class EpisodeCost:
    """What one episode (a rollout or a replay's remainder) cost."""

    prefill: int = 0
    prefill_computed: int = 0
    decode: int = 0
    seconds: float = 0.0
    turns: int = 0

    def add(self, out: Any, seconds: float) -> None:
        ctx = int(out.info.get("context_tokens", 0))
        self.prefill += ctx
        self.prefill_computed += ctx - int(out.info.get("cached_tokens") or 0)
        self.decode += len(out.token_ids or ())
        self.seconds += seconds
        self.turns += 1


def _play(policy: Any, env: gym.Env, conv: Conversation, max_turns: int, keep_ckpts: bool):
    """Run `conv` to the end on `env`; (cost, turns, checkpoints before each turn)."""
    cost, turns, ckpts = EpisodeCost(), list(conv.turns), []
    for _ in range(max_turns):
        if keep_ckpts:
            ckpts.append(checkpoint(env))
        c = Conversation(
            conv.env_id,
            conv.task_id,
            conv.prompt,
            tuple(turns),
            conv.seed + len(turns),
            conv.reset_info,
            conv.prompt_token_ids,
        )
        t0 = time.perf_counter()
        out = policy.generate([c])[0]
        cost.add(out, time.perf_counter() - t0)
        if turns and out.context_token_ids is not None and turns[-1].obs_token_ids is None:
            turns[-1].obs_token_ids = list(out.context_token_ids)
        if c.prompt_token_ids is None and not turns and out.context_token_ids is not None:
            conv = Conversation(
                conv.env_id,
                conv.task_id,
                conv.prompt,
                (),
                conv.seed,
                conv.reset_info,
                tuple(out.context_token_ids),
            )
        if out.error is not None or out.finish_reason == "overflow":
            break
        obs, reward, terminated, truncated, _ = env.step(out.text)
        turns.append(Turn(out.text, obs, float(reward), list(out.token_ids or []), out.logprobs))
        if terminated or truncated:
            break
    return cost, turns, ckpts, conv


def _task_costs(policy: Any, env_id: str, task: Any, seed: int, max_turns: int, replays: int):
    """(full rollout cost, {depth: [replay costs]}) of one task."""
    env = gym.make(env_id)
    try:
        prompt, info = env.reset(seed=seed, options={"task": task})
        root = Conversation(env_id, str(task), prompt, (), seed, dict(info))
        full, turns, ckpts, root = _play(policy, env, root, max_turns, keep_ckpts=True)
        by_depth: dict[int, list[EpisodeCost]] = defaultdict(list)
        for depth in range(1, len(turns)):
            for r in range(replays):
                restore(env, ckpts[depth])
                prefix = Conversation(
                    env_id,
                    root.task_id,
                    prompt,
                    tuple(turns[:depth]),
                    seed + 7919 * (depth * replays + r + 1),
                    root.reset_info,
                    root.prompt_token_ids,
                )
                cost, *_ = _play(policy, env, prefix, max_turns - depth, keep_ckpts=False)
                by_depth[depth].append(cost)
        return full, by_depth
    finally:
        env.close()


def _ratio(part: EpisodeCost, whole: EpisodeCost, key: str) -> float | None:
    den = getattr(whole, key)
    return getattr(part, key) / den if den else None


def measure_replay_cost(
    policy: Any,
    env_id: str,
    tasks: list[Any],
    *,
    seed: int = 0,
    max_turns: int = 8,
    replays: int = 1,
) -> dict[str, Any]:
    """Replay/full-rollout ratios by depth and the prefill share the cache served, on `env_id`."""
    ratios: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    prefill = prefill_computed = 0
    turn_counts = []
    for k, task in enumerate(tasks):
        full, by_depth = _task_costs(policy, env_id, task, seed + k, max_turns, replays)
        turn_counts.append(full.turns)
        prefill += full.prefill
        prefill_computed += full.prefill_computed
        for depth, costs in by_depth.items():
            for c in costs:
                prefill += c.prefill
                prefill_computed += c.prefill_computed
                for key in COST_KEYS:
                    r = _ratio(c, full, key)
                    if r is not None:
                        ratios[depth][key].append(r)
    table = {
        str(d): {k: sum(v) / len(v) for k, v in sorted(row.items())}
        | {"replays": len(row["decode"])}
        for d, row in sorted(ratios.items())
    }
    return {
        "replay_cost_by_depth": table,
        "prefill_saved_share": 1 - prefill_computed / prefill if prefill else 0.0,
        "prefill_tokens": prefill,
        "prefill_computed_tokens": prefill_computed,
        "mean_rollout_turns": sum(turn_counts) / len(turn_counts) if turn_counts else 0.0,
    }
