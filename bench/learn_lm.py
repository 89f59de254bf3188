"""The tiny-LM arms of ``trace-gym bench learn``: the real LLM trainer on the simulator.

Each (arm, seed) trains the tiny local Qwen3 (`trace_gym.agents.tiny`, the pipeline
check's warm start) with `trace_gym.trainers.loop.Trainer` on ``trace/Sim-v0`` through its
text interface: the same rollouts, advantages, losses, AdamW updates and weight sync as
any LLM run. Only two things differ from a plain `Trainer` run:

- each step offers the protocol's fresh task list (`learn.task_stream`: never a
  task twice, the same list for every arm of a seed), not a draw from a fixed pool;
- held-out success is *sampled*: ``eval_samples`` episodes of each of the
  ``heldout_tasks`` held-out tasks (pool seed ``heldout_pool_base + seed``) by the shared
  evaluator, whose episode seeds depend on (seed, task, sample, turn) only, so every arm
  of a seed meets the same random numbers. Each record carries the episode count and the
  binomial standard error sqrt(p (1 - p) / n).

The protocol is configs/learn_protocol/tiny_lm_v1.toml (see docs/learning.md).
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trace_gym.bench.learn import LearnConfig, task_stream
from trace_gym.trainers.loop import Trainer

__all__ = ["StreamTrainer", "heldout_success", "lm_train_config", "run_lm_arm", "warm_start"]


class StreamTrainer(Trainer):
    """A `Trainer` whose step s offers ``stream[s]`` (the protocol's fresh, paired task list)."""

    def __init__(self, config: Any, stream: list[list[str]]):
        super().__init__(config)
        self.stream = stream

    def candidates(self, step: int) -> list[str]:
        return list(self.stream[step])


def warm_start(cfg: LearnConfig) -> Any:
    """The tiny model's `TinyConfig`: `default_test_config` with the protocol's SFT settings."""
    from trace_gym.agents.tiny import default_test_config

    n = int(cfg.lm.get("sft_episodes", 32))
    return default_test_config(
        env_kwargs={"trace/Sim-v0": {"num_tasks": n}},
        sft_steps=int(cfg.lm.get("sft_steps", 400)),
        episodes_per_env=n,
    )


def lm_train_config(cfg: LearnConfig, arm: str, seed: int, out_dir: str) -> Any:
    """The `TrainConfig` of one (arm, seed): equal accounted cost per step for every arm."""
    from trace_gym.trainers.config import TrainConfig

    allocator, algo, branching = cfg.arms[arm]
    lm = cfg.lm
    return TrainConfig.from_dict(
        {
            "steps": cfg.steps,
            "seed": seed,
            "out_dir": out_dir,
            "resume": False,
            "overwrite": True,  # each (arm, seed) starts fresh, also when the bench is rerun
            "save_every": 0,
            "eval_every": 0,
            "tensorboard": False,
            "progress": False,
            "policy": {
                "kind": "tiny",
                "tiny": asdict(warm_start(cfg)),
                "gen_batch": 32,
                "temperature": float(lm.get("temperature", 1.0)),
            },
            "rollout": {
                "env_id": "trace/Sim-v0",
                "env_kwargs": {
                    "preset": cfg.preset,
                    "num_tasks": cfg.steps * cfg.candidates,
                    "seed": cfg.train_pool_base + seed,
                },
                "allocator": allocator,
                "predictor": cfg.predictor,
                "root_budget": cfg.root_budget if branching else cfg.flat_roots,
                "replays_per_root": cfg.replays_per_root if branching else 0.0,
                "replay_cost": cfg.replay_cost,
                "candidates_per_step": cfg.candidates,
                "group_size": cfg.group_size,
                "m_max": cfg.m_max,
            },
            "algo": {
                "name": algo,
                "clip_low": cfg.clip_low,
                "clip_high": cfg.clip_high,
                "aggregation": cfg.aggregation,
            },
            "optim": {
                "lr": cfg.lr,
                "micro_batch_size": int(lm.get("micro_batch_size", 16)),
                "mini_batch_size": int(lm.get("mini_batch_size", 8)),
                "epochs": int(lm.get("epochs", 2)),
            },
        }
    )


def heldout_success(policy: Any, cfg: LearnConfig, seed: int) -> dict[str, float]:
    """Sampled success on the seed's held-out tasks: mean, episode count, binomial SE."""
    import gymnasium as gym
    from trace_gym.agents.evaluate import evaluate

    from trace_gym.core import unwrap

    def factory() -> Any:
        return gym.make(
            "trace/Sim-v0",
            preset=cfg.preset,
            num_tasks=cfg.heldout_tasks,
            seed=cfg.heldout_pool_base + seed,
        )

    probe = factory()
    ids = list(unwrap(probe).task_ids)
    probe.close()
    k = cfg.eval_samples
    p = float(evaluate(policy, factory, ids, k=k, seed=seed).summary[f"mean@{k}"])
    n = len(ids) * k
    return {"success": p, "eval_episodes": n, "success_se": math.sqrt(max(p * (1.0 - p), 0.0) / n)}


def _record(arm: str, seed: int, step: int, cands: list[str], m: dict[str, Any]) -> dict[str, Any]:
    return {
        "arm": arm,
        "seed": seed,
        "step": step,
        "tasks": hashlib.sha256(" ".join(cands).encode()).hexdigest()[:16],
        "accounted_cost": float(m["accounted_cost"]),
        "measured_turns": int(m["measured_turns"]),
        "generated_tokens": int(m["generated_tokens"]),
        "roots": int(m["roots"]),
        "replays": int(m["replays"]),
        "reward": float(m["reward"]),
        "effective_ratio": float(m["effective_ratio"]),
        **{
            k: float(m[k])
            for k in ("loss", "grad_norm", "trained_tokens", "samples", "clip_frac")
            if k in m
        },
        "success": None,
    }


def run_lm_arm(
    cfg: LearnConfig, arm: str, seed: int, tick: Callable[[], Any] | None = None
) -> list[dict[str, Any]]:
    """Per-step records of one (arm, seed) of the tiny LM (the same keys as `learn.run_arm`'s)."""
    stream = task_stream(cfg, seed)
    with tempfile.TemporaryDirectory(prefix=f"learn-lm-{arm}-{seed}-") as tmp:
        out = Path(cfg.work_dir) / f"{arm}-s{seed}" if cfg.work_dir else Path(tmp)
        tr = StreamTrainer(lm_train_config(cfg, arm, seed, str(out)), stream)
        records = [
            {
                "arm": arm,
                "seed": seed,
                "step": -1,
                "accounted_cost": 0.0,
                "measured_turns": 0,
                "generated_tokens": 0,
                **heldout_success(tr.policy, cfg, seed),
            }
        ]
        try:
            for step, cands in enumerate(stream):
                records.append(_record(arm, seed, step, cands, tr.train_step(step)))
                if step == cfg.steps - 1 or (step + 1) % cfg.eval_every == 0:
                    records[-1].update(heldout_success(tr.policy, cfg, seed))
                if tick is not None:
                    tick()
        finally:
            tr.runner.close()
    return records
