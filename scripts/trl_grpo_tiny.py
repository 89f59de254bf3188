#!/usr/bin/env python
"""TRL's GRPOTrainer on TRACE trees, CPU, tiny model: the example of docs/trl.md.

    python scripts/trl_grpo_tiny.py --steps 3 --out runs/trl_tiny --json runs/trl_tiny/summary.json
    accelerate launch --num_processes 2 --cpu scripts/trl_grpo_tiny.py --steps 3   # 2 processes

Trains the warm-started tiny Qwen3 (built locally, cached) on the simulator's learnable
preset (8 tasks) with TRACE allocation (M roots over the prompts TRL's sampler drew, N
replays per root) and TreeRPO advantages; TRL does the update. Prints one line per step
(loss, grad norm, TRACE group sizes) and a JSON summary. Under ``accelerate launch`` the
global batch (``--candidates`` x ``--group`` rows) is split over the processes, TRACE
allocates M over the whole of it and the ranks share the trees (docs/distributed.md);
rank 0 prints.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    a = parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import gymnasium as gym
    import torch
    from trace_gym.agents.hf import HFPolicy
    from trace_gym.agents.tiny import default_test_config, tiny_model_dir
    from trace_gym.bench.pipeline import pipeline_preset
    from trace_gym.trainers.trl_adapter import TRLRolloutConfig, make_grpo_trainer

    from trace_gym.runner import runner_config

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    policy = HFPolicy.from_pretrained(
        str(tiny_model_dir(default_test_config(env_kwargs={"trace/Sim-v0": {"num_tasks": 8}}))),
        temperature=1.0,
        max_batch=32,
    )
    preset = pipeline_preset()
    cfg = TRLRolloutConfig(runner=runner_config(a, m_max=4), advantage=a.advantage)
    trainer = make_grpo_trainer(
        policy,
        lambda: gym.make("trace/Sim-v0", preset=preset, num_tasks=8, seed=0),
        grpo_config(a),
        cfg,
    )
    t1 = time.perf_counter()
    trainer.train()
    t2 = time.perf_counter()
    if not trainer.accelerator.is_main_process:
        return
    steps = step_rows(trainer, Path(a.out), a.steps)
    for s in steps:
        print(json.dumps(s))
    summary = {"setup_s": round(t1 - t0, 2), "train_s": round(t2 - t1, 2), "steps": steps}
    print(json.dumps({k: v for k, v in summary.items() if k != "steps"}))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(summary, indent=1) + "\n")


def parse_args() -> argparse.Namespace:
    from trace_gym.runner import add_runner_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--steps", type=int, default=3)
    add_runner_args(ap, root_budget=8, replays_per_root=0.5)  # per generation batch
    ap.add_argument(
        "--candidates", type=int, default=4, help="distinct prompts per generation batch"
    )
    ap.add_argument("--group", type=int, default=4, help="TRL num_generations (rows per block)")
    ap.add_argument("--advantage", default="treerpo")
    ap.add_argument("--out", default="runs/trl_tiny")
    ap.add_argument("--json", default="")
    return ap.parse_args()


def grpo_config(a: argparse.Namespace):
    """TRL's trainer settings of the example: CPU, no saving, one log line per step."""
    from trl import GRPOConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))  # accelerate launch: the batch is global
    if (a.candidates * a.group) % world:
        raise SystemExit(f"--candidates x --group must split over {world} processes")
    return GRPOConfig(
        output_dir=a.out,
        per_device_train_batch_size=a.candidates * a.group // world,
        num_generations=a.group,
        max_steps=a.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        scale_rewards="none",
        learning_rate=1e-3,
        seed=0,
        temperature=1.0,
        disable_tqdm=True,
    )


def step_rows(trainer, out: Path, n_steps: int) -> list[dict]:
    """One row per step: TRL's loss and grad norm beside the step's TRACE allocation."""
    from trace_gym.trainers.trl_adapter import ALLOCATION_FILE

    records = [json.loads(line) for line in (out / ALLOCATION_FILE).read_text().splitlines()]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return [
        {
            "step": r["step"],
            "loss": h["loss"],
            "grad_norm": h["grad_norm"],
            "group_sizes": r["group_sizes"],
            "replays": r["replays"],
            "unit_rows": h["trace/unit_rows"],
            "env_reward": h["trace/reward"],
        }
        for r, h in zip(records[-n_steps:], logs, strict=True)
    ]


if __name__ == "__main__":
    main()
