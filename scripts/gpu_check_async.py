#!/usr/bin/env python
"""GPU check of asynchronous rollouts: staleness 1 against 0 on the HF policy path.

The same random-init Qwen3-0.6B-shaped model as gpu_check_step.py (``--tiny``: a small
one), bf16 `HFPolicy` on CUDA, trained full (no LoRA) by `trace_gym.trainers.loop.Trainer`
for ``--steps`` steps on Sim-v0, once with ``rollout.max_staleness = 0`` (the synchronous
loop) and once with 1 (step t+1's trees generated in a background thread, by a frozen copy
of the policy, while step t trains - on the same GPU). One JSON line per staleness (wall,
steps/s, mean rollout / train / wait seconds per step, peak memory: the frozen copy is
extra), then one with the ratio of steps/s. ``--latency S --latency-sigma X`` adds the
engines' simulated latency to every policy call (default 0: the GPU alone). Generation and
training share one GPU here, so the ratio says how much of the two overlaps on it, not
what a separate engine would give. No downloads. Exits 3 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def train_config(args: argparse.Namespace, staleness: int):
    from trace_gym.trainers.config import TrainConfig

    return TrainConfig.from_dict(
        {
            "steps": args.steps,
            "seed": 0,
            "out_dir": tempfile.mkdtemp(prefix="gpu-check-async-"),
            "tensorboard": False,
            "progress": False,
            "save_every": 0,
            "policy": {"kind": "custom", "device": args.device},
            "rollout": {
                "env_id": "trace/Sim-v0",
                "allocator": "trace",
                "predictor": "empirical",
                "root_budget": args.roots,
                "replays_per_root": 1.0,
                "m_max": 4,
                "candidates_per_step": max(1, args.roots // 2),
                "group_size": 2,
                "max_staleness": staleness,
            },
            "algo": {"name": "treerpo", "skip_zero_advantage": False},
            "optim": {"lr": 1e-5, "micro_batch_size": args.micro_batch, "max_seq_len": 4096},
        }
    )


def run_one(args: argparse.Namespace, staleness: int) -> dict:
    """`args.steps` steps of the trainer at `staleness`: wall, steps/s, parts, memory."""
    import torch
    from gpu_check_step import build_policy
    from trace_gym.trainers.loop import Trainer

    from trace_gym.async_rollouts import policy_snapshot
    from trace_gym.distributed.testing import LatencyPolicy

    cuda = args.device.startswith("cuda")
    torch.manual_seed(0)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    lat, sigma = args.latency, args.latency_sigma

    class LatencyTrainer(Trainer):
        def __init__(self, config, policy):
            super().__init__(config, policy=policy)
            if lat:
                self.runner.policy = LatencyPolicy(self.policy, lat, sigma)

        def _rollout_snapshot(self, policy):
            snap = policy_snapshot(policy)
            return LatencyPolicy(snap, lat, sigma) if lat else snap

    trainer = LatencyTrainer(train_config(args, staleness), build_policy(args))
    try:
        t0 = time.perf_counter()
        hist = trainer.run()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    finally:
        trainer.runner.close()
    n = len(hist)

    def mean(key: str, default: str | None = None) -> float:
        return round(sum(m.get(key, m.get(default or key, 0.0)) for m in hist) / n, 3)

    return {
        "check": "async",
        "staleness": staleness,
        "device": args.device,
        "tiny": args.tiny,
        "steps": n,
        "wall_s": round(wall, 2),
        "steps_per_s": n / wall,
        "rollout_s_mean": mean("time_rollout_s"),
        "train_s_mean": mean("time_train_s"),
        "wait_s_mean": mean("time_rollout_wait_s", "time_rollout_s"),
        "generated_tokens": int(sum(m["generated_tokens"] for m in hist)),
        "staleness_mean": mean("staleness_mean"),
        "latency_s": lat,
        "latency_sigma": sigma,
        "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }


def main(argv: list[str] | None = None) -> int:
    from gpu_check_step import check_parser, no_cuda

    p = check_parser(__doc__)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--roots", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--gen-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--latency", type=float, default=0.0, help="simulated seconds per turn")
    p.add_argument("--latency-sigma", type=float, default=0.0)
    # gpu_check.sh hands every check the same arguments: the other checks' are ignored here
    args, _ = p.parse_known_args(argv)
    import torch

    if no_cuda(args.device):
        return 3
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)  # the producer and the trainer: one core each
    rows = [run_one(args, k) for k in (0, 1)]
    for row in rows:
        print(json.dumps(row), flush=True)
    sync, one = rows
    print(
        json.dumps(
            {
                "check": "async_ratio",
                "steps_per_s_ratio": one["steps_per_s"] / sync["steps_per_s"],
                "staleness": [0, 1],
                "device": args.device,
                "tiny": args.tiny,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
