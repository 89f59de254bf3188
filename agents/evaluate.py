"""Evaluate a policy on an env's tasks: mean@k, pass@k, average turns and tokens.

`evaluate(policy, env_factory, task_ids, k=...)` plays k independent episodes per
task with batched policy calls over all live episodes (at most ``max_batch``), with
the runner's token bookkeeping (the templated prompt and each observation's tokens are
recorded from ``PolicyOutput.context_token_ids``), and returns per-task results plus a
summary:

- ``mean@k``: the success rate averaged over the k samples and the tasks;
- ``pass@k``: the share of tasks with at least one success among their k samples;
- ``avg_turns`` / ``avg_tokens``: per episode (generated tokens; 0 for text backends);
- ``errors`` / ``overflows``: episodes ended by a policy error / the context window.

Each episode's seeds are stable hashes of (seed, task id, sample index, turn), so
results do not depend on batching. ``trace-gym eval`` is the CLI; the trainers call the
same function on a held-out split.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_gym.cli import Parser, parse_env_kwargs
from trace_gym.errors import ConfigError
from trace_gym.policy import Conversation
from trace_gym.tree import Turn

__all__ = ["EvalResult", "evaluate", "main"]

logger = logging.getLogger(__name__)


@dataclass
class _Ep:
    task_id: str
    sample: int
    env: Any = None
    prompt: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    prompt_ids: tuple[int, ...] | None = None
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    error: str | None = None
    overflow: bool = False


@dataclass
class EvalResult:
    """Per-task results and the summary of one evaluation."""

    summary: dict[str, float]
    tasks: list[dict[str, Any]]


def _seed(*parts: Any) -> int:
    from trace_gym.seeding import stable_seed

    return stable_seed("eval", *parts)


def _conversation(ep: _Ep, seed: int) -> Conversation:
    """The conversation of a live episode, seeded by its task, sample and turn."""
    return Conversation(
        ep.env.unwrapped.id if hasattr(ep.env.unwrapped, "id") else "",
        ep.task_id,
        ep.prompt,
        tuple(ep.turns),
        seed=_seed(seed, ep.task_id, ep.sample, len(ep.turns) + 1),
        reset_info=ep.info,
        prompt_token_ids=ep.prompt_ids,
    )


def evaluate(
    policy: Any,
    env_factory: Callable[[], Any],
    task_ids: Sequence[str],
    *,
    k: int = 1,
    max_batch: int = 64,
    seed: int = 0,
    success_threshold: float = 0.5,
    progress: bool = False,
) -> EvalResult:
    """Play `k` episodes of each task with `policy`; see the module docstring."""
    if k < 1 or max_batch < 1:
        raise ConfigError(f"k and max_batch must be >= 1, got {k}, {max_batch}")
    pending = [_Ep(str(t), i) for t in task_ids for i in range(k)]
    pending.reverse()
    finished: list[_Ep] = []
    free_envs: list[Any] = []
    bar = _bar(len(pending), progress)
    live: list[_Ep] = []
    while pending or live:
        while pending and len(live) < max_batch:
            ep = pending.pop()
            ep.env = free_envs.pop() if free_envs else env_factory()
            try:
                ep.prompt, ep.info = ep.env.reset(
                    seed=_seed(seed, ep.task_id, ep.sample, 0), options={"task": ep.task_id}
                )
                live.append(ep)
            except Exception as e:  # a task that cannot start is a failed episode
                ep.error, ep.done = f"env.reset: {e!r}", True
                finished.append(ep)
                free_envs.append(ep.env)
                bar.update(1)
        convs = [_conversation(ep, seed) for ep in live]
        try:
            outs = list(policy.generate(convs))
            if len(outs) != len(convs):
                raise RuntimeError(f"returned {len(outs)} outputs for {len(convs)} conversations")
        except Exception as e:
            outs = [None] * len(live)
            err = f"policy.generate: {e!r}"
        for ep, out in zip(live, outs, strict=True):
            if out is None:
                ep.error, ep.done = err, True
                continue
            _take(ep, out)
        for ep in [e for e in live if e.done]:
            live.remove(ep)
            finished.append(ep)
            free_envs.append(ep.env)
            bar.update(1)
    bar.close()
    for env in free_envs:
        env.close()
    return _summarise(finished, task_ids, k, success_threshold)


def _take(ep: _Ep, out: Any) -> None:
    if out.context_token_ids is not None:
        if not ep.turns and ep.prompt_ids is None:
            ep.prompt_ids = tuple(out.context_token_ids)
        elif ep.turns and ep.turns[-1].obs_token_ids is None:
            ep.turns[-1].obs_token_ids = list(out.context_token_ids)
    if out.error is not None:
        ep.error, ep.done = f"policy: {out.error}", True
        return
    turn = Turn(out.text, "", token_ids=out.token_ids, logprobs=out.logprobs)
    ep.turns.append(turn)
    if out.finish_reason == "overflow":
        ep.overflow, ep.done, ep.reward = True, True, 0.0
        return
    try:
        obs, reward, terminated, truncated, info = ep.env.step(out.text)
    except Exception as e:
        ep.error, ep.done = f"env.step: {e!r}", True
        return
    turn.observation, turn.reward, turn.info = obs, float(reward), dict(info)
    if terminated or truncated:
        ep.done, ep.reward = True, float(reward)


def _summarise(eps: list[_Ep], task_ids: Sequence[str], k: int, thr: float) -> EvalResult:
    by_task: dict[str, list[_Ep]] = {str(t): [] for t in task_ids}
    for ep in eps:
        by_task[ep.task_id].append(ep)
    tasks = []
    for tid, group in by_task.items():
        group.sort(key=lambda e: e.sample)
        wins = [e.error is None and e.reward >= thr for e in group]
        tasks.append(
            {
                "task_id": tid,
                "rewards": [e.reward for e in group],
                "successes": int(sum(wins)),
                "k": len(group),
                "mean": sum(wins) / max(1, len(group)),
                "pass": any(wins),
                "turns": [len(e.turns) for e in group],
                "tokens": [sum(t.num_tokens for t in e.turns) for e in group],
                "errors": [e.error for e in group if e.error],
                "overflows": sum(e.overflow for e in group),
                "final_actions": [e.turns[-1].action[-200:] if e.turns else "" for e in group],
            }
        )
    n_eps = max(1, len(eps))
    summary = {
        "tasks": len(tasks),
        "k": k,
        f"mean@{k}": sum(t["mean"] for t in tasks) / max(1, len(tasks)),
        f"pass@{k}": sum(t["pass"] for t in tasks) / max(1, len(tasks)),
        "avg_turns": sum(len(e.turns) for e in eps) / n_eps,
        "avg_tokens": sum(sum(t.num_tokens for t in e.turns) for e in eps) / n_eps,
        "errors": sum(e.error is not None for e in eps),
        "overflows": sum(e.overflow for e in eps),
    }
    return EvalResult(summary, tasks)


def _bar(total: int, enabled: bool) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a core dependency
        enabled = False
    if not enabled:

        class _Null:
            def update(self, n: int) -> None: ...
            def close(self) -> None: ...

        return _Null()
    return tqdm(total=total, desc="episodes", file=sys.stderr, leave=False)


# ---------------------------------------------------------------------- CLI
def add_common_args(p: argparse.ArgumentParser) -> None:
    """Env and policy options shared by `trace-gym eval` and `trace-gym rollout`."""
    p.add_argument("--env", required=True, help="env id, e.g. trace/HotpotQA-v0")
    p.add_argument(
        "--policy",
        default="scripted",
        help="scripted[:SKILL] | sim | tiny | hf:PATH | vllm:PATH | openai:URL[#MODEL]",
    )
    p.add_argument("--dataset", help="dataset path passed to the env as dataset=PATH")
    p.add_argument("--split", help="split passed to the env as split=NAME")
    p.add_argument("--env-kwargs", default="{}", help="JSON dict of extra env constructor kwargs")
    p.add_argument("--limit", type=int, help="first N tasks only")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", dest="top_p", type=float)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    p.add_argument("--device", help="cpu, cuda, ... (hf backend)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-batch", dest="max_batch", type=int, default=64)
    p.add_argument("--no-progress", action="store_true")


def env_factory_from(args: argparse.Namespace) -> Callable[[], Any]:
    from trace_gym.agents.scripted import make_env

    kwargs = parse_env_kwargs(args.env_kwargs)
    if args.dataset:
        kwargs["dataset"] = args.dataset
    if args.split:
        kwargs["split"] = args.split
    return lambda: make_env(args.env, **kwargs)


def policy_from(args: argparse.Namespace, env: Any) -> Any:
    from trace_gym.agents.policies import make_policy

    return make_policy(
        args.policy,
        args.env,
        env,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        max_batch=None,
    )


def main(argv: list[str]) -> int:
    """`trace-gym eval`: evaluate a policy, print the summary, write per-task JSONL."""
    p = Parser(prog="trace-gym eval", description=main.__doc__)
    add_common_args(p)
    p.add_argument("--n", type=int, default=1, help="samples per task (k of mean@k / pass@k)")
    p.add_argument("--json", help="write per-task results as JSONL here (summary on the last line)")
    args = p.parse_args(argv)
    factory = env_factory_from(args)
    env = factory()
    ids = list(env.unwrapped.task_ids)[: args.limit] if args.limit else list(env.unwrapped.task_ids)
    policy = policy_from(args, env)
    res = evaluate(
        policy,
        factory,
        ids,
        k=args.n,
        max_batch=args.max_batch,
        seed=args.seed,
        progress=not args.no_progress,
    )
    env.close()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            for t in res.tasks:
                f.write(json.dumps(t) + "\n")
            f.write(json.dumps({"summary": res.summary}) + "\n")
    width = max(len(k) for k in res.summary)
    print(f"{args.env}  policy={args.policy}")
    for key, val in res.summary.items():
        print(
            f"  {key:<{width}}  {val:.4f}" if isinstance(val, float) else f"  {key:<{width}}  {val}"
        )
    return 0
