#!/usr/bin/env python
"""GPU check of one full TRACE training step: runner, allocation, predictor update, optimiser step.

For each mode (LoRA, full) and predictor (empirical features, the LM critic): a
random-init Qwen3-0.6B-shaped model (``--tiny``: a small one) with a tokenizer trained
locally on scripted Sim episodes, wrapped in `HFPolicy` (bf16 on CUDA); one
`trace_gym.trainers.loop.Trainer.train_step` on Sim-v0 (TRACE allocator, root rollouts,
prefix scoring and replays, predictor update, clipped-PG optimiser step, weight sync).
One JSON line per run: generation tokens/s, step time and its parts, trained tokens/s,
peak GPU memory. No downloads: everything is built here.

    scripts/gpu_check.sh                 # CUDA; exits 3 without it
    scripts/gpu_check.sh --tiny --device cpu   # CPU smoke run of the same code
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

#: Qwen3's published shapes (vocab 151936); `qwen3_model(..., layers=n)` cuts the layer count
QWEN3_SHAPES = {
    "0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
}


def qwen3_model(tiny: bool, vocab: int, tokenizer, dtype, shape: str = "0.6b", layers=None):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if tiny:
        cfg = Qwen3Config(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            max_position_embeddings=4096,
        )
        cfg.tie_word_embeddings = True
    else:
        dims = {**QWEN3_SHAPES[shape]}
        if layers:
            dims["num_hidden_layers"] = layers
        cfg = Qwen3Config(
            vocab_size=151936,
            head_dim=128,
            max_position_embeddings=40960,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            **dims,
        )
    cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id = (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        None,
    )
    return Qwen3ForCausalLM(cfg).to(dtype)


def build_policy(args):
    import torch
    from trace_gym.agents.hf import HFPolicy, SamplingConfig
    from trace_gym.agents.sft import collect_episodes, episode_texts
    from trace_gym.agents.tiny import build_tokenizer

    episodes = collect_episodes(("trace/Sim-v0",), 8, skill=0.8, seed=0, env_kwargs={})
    tokenizer = build_tokenizer(episode_texts(episodes), 1024)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = qwen3_model(args.tiny, len(tokenizer), tokenizer, dtype).to(args.device)
    sampling = SamplingConfig(
        temperature=1.0, max_new_tokens=args.new_tokens, max_batch=args.gen_batch
    )
    return HFPolicy(model, tokenizer, sampling)


def check_parser(doc: str) -> argparse.ArgumentParser:
    """The GPU checks' shared options: --device, --tiny."""
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--tiny", action="store_true", help="a tiny model instead of the 0.6B shape (smoke runs)"
    )
    return p


def no_cuda(device: str) -> bool:
    """True (and says so, as JSON) when `device` is CUDA and there is none: exit 3."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        print(
            json.dumps({"skipped": "no CUDA device; run with --tiny --device cpu for a smoke run"})
        )
        return True
    return False


def run_one(args, lora: bool, predictor: str) -> dict:
    """One TRACE training step with LoRA or full fine-tuning and `predictor`: times and memory."""
    import torch
    from trace_gym.trainers.loop import Trainer

    torch.manual_seed(0)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    policy = build_policy(args)
    cfg = train_config(args, lora, predictor)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, policy=policy)
    setup_s = time.perf_counter() - t0
    m = trainer.train_step(0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None
    return {
        "mode": "lora" if lora else "full",
        "predictor": predictor,
        "device": args.device,
        "tiny": args.tiny,
        "setup_s": round(setup_s, 2),
        "step_s": round(m["time_rollout_s"] + m["time_train_s"], 2),
        "rollout_s": round(m["time_rollout_s"], 2),
        "train_s": round(m["time_train_s"], 2),
        "gen_tokens_per_s": round(m["gen_tokens_per_s"], 1),
        "train_tokens_per_s": round(m["train_tokens_per_s"], 1),
        "generated_tokens": m["generated_tokens"],
        "roots": m["roots"],
        "replays": m["replays"],
        "failed_branches": m["failed_branches"],
        "policy_version": policy.version,
        "predictor_update": {
            k[len("predictor_") :]: v for k, v in m.items() if k.startswith("predictor_")
        },
        "peak_gpu_mem_gib": None if peak is None else round(peak, 2),
    }


def train_config(args, lora: bool, predictor: str):
    """The one-step training config: TRACE on the simulator, TreeRPO, a custom policy."""
    from trace_gym.trainers.config import (
        AlgoConfig,
        OptimConfig,
        PolicyConfig,
        RolloutConfig,
        TrainConfig,
    )

    from trace_gym.runner import runner_config

    kwargs = {"device": args.device} if predictor == "critic" else {}
    return TrainConfig(
        steps=1,
        out_dir=tempfile.mkdtemp(prefix="gpu-check-"),
        tensorboard=False,
        progress=False,
        save_every=0,
        policy=PolicyConfig(kind="custom", device=args.device, lora=lora, lora_r=16),
        rollout=RolloutConfig(
            env_id="trace/Sim-v0",
            allocator="trace",
            predictor=predictor,
            predictor_kwargs=kwargs,
            runner=runner_config(args, replays_per_root=1.0, m_max=4),
            candidates_per_step=args.root_budget // 2,
            group_size=2,
        ),
        algo=AlgoConfig(name="treerpo"),
        optim=OptimConfig(lr=1e-5, micro_batch_size=args.micro_batch, max_seq_len=4096),
    )


def main(argv: list[str] | None = None) -> int:
    from trace_gym.runner import add_runner_args

    p = check_parser(__doc__)
    p.add_argument("--modes", default="lora,full")
    p.add_argument("--predictors", default="empirical,critic")
    add_runner_args(p, root_budget=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--gen-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4)
    args = p.parse_args(argv)

    if no_cuda(args.device):
        return 3
    for mode in args.modes.split(","):
        for predictor in args.predictors.split(","):
            print(json.dumps(run_one(args, mode == "lora", predictor)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
