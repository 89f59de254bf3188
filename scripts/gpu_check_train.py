#!/usr/bin/env python
"""GPU check of the trainer: bf16 RL steps (LoRA and full) on a random-init Qwen3-0.6B-sized model.

For each mode it samples a batch with HF ``generate`` (timed), turns the generated tokens
into trainer samples (random advantages; the prompt masked out), recomputes old
logprobs, runs one clipped-PG optimiser step through `trace_gym.trainers.losses`
with gradient accumulation, and reports generation tokens/s, step time, trained
tokens/s and peak GPU memory as JSON lines.

    python scripts/gpu_check_train.py                  # needs CUDA; exits 3 without it
    python scripts/gpu_check_train.py --device cpu --tiny   # a smoke run of the same code on CPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def qwen3_config(tiny: bool):
    from transformers import Qwen3Config

    if tiny:
        return Qwen3Config(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
        )
    # Qwen3-0.6B's published shape
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )


def run_mode(args, mode: str) -> dict:
    """One generation and one optimiser step of `mode` ("lora" or "full"): speed and memory."""
    import torch

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cfg = qwen3_config(args.tiny)
    model = build_model(cfg, mode, dev, dtype, args.grad_ckpt)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out, gen_s = generate(model, cfg, args, dev, sync)
    gen_tokens = int((out.shape[1] - args.prompt_len) * args.batch)
    samples = random_samples(out.cpu().tolist(), args.prompt_len)
    tokens = float(sum(s.num_trained for s in samples))
    step_s, stats = train_step(model, samples, tokens, args.micro_batch, dev, sync)
    report = {
        "mode": mode,
        "device": str(dev)
        + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""),
        "dtype": str(dtype).replace("torch.", ""),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable": trainable,
        "batch": args.batch,
        "seq_len": int(out.shape[1]),
        "gen_s": round(gen_s, 3),
        "gen_tokens_per_s": round(gen_tokens / gen_s, 1),
        "step_s": round(step_s, 3),
        "train_tokens_per_s": round(tokens / step_s, 1),
        **{k: round(v, 4) for k, v in stats.items()},
    }
    if dev.type == "cuda":
        report["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return report


def build_model(cfg, mode: str, dev, dtype, grad_ckpt: bool):
    """A random-init Qwen3 of `cfg` on `dev`, with LoRA adapters for mode "lora"."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM(cfg).to(dtype=dtype, device=dev)
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=16,
                lora_alpha=32,
                task_type="CAUSAL_LM",
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            ),
        )
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if mode == "lora":
            model.enable_input_require_grads()
    return model


def generate(model, cfg, args, dev, sync):
    """HF sampling of exactly `args.new_tokens` after random prompts: (ids, seconds)."""
    import torch

    model.eval()
    prompts = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), device=dev)
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            pad_token_id=0,
        )
    sync()
    return out, time.perf_counter() - t0


def random_samples(rows: list[list[int]], prompt_len: int) -> list:
    """Training samples: generated tokens trained, prompt masked, random advantages."""
    import torch
    from trace_gym.trainers.data import Sample

    g = torch.Generator().manual_seed(0)
    samples = []
    for row in rows:
        mask = [0] * prompt_len + [1] * (len(row) - prompt_len)
        adv = float(torch.randn(1, generator=g))
        samples.append(Sample(row, mask, adv, 1.0, [0.0] * len(row)))
    return samples


def train_step(model, samples: list, tokens: float, micro: int, dev, sync) -> tuple[float, dict]:
    """Old logprobs, then one AdamW step over micro-batches: (seconds, last clip stats)."""
    import torch
    from trace_gym.trainers.data import collate
    from trace_gym.trainers.losses import policy_loss, token_logprobs

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    sync()
    t1 = time.perf_counter()
    batches = [collate(samples[i : i + micro]) for i in range(0, len(samples), micro)]
    model.eval()
    with torch.no_grad():  # old logprobs recomputed by the trainer
        old = [token_logprobs(_logits(model, b, dev), b.input_ids.to(dev)).float() for b in batches]
    model.train()
    opt.zero_grad(set_to_none=True)
    stats = {}
    for b, old_b in zip(batches, old, strict=True):
        logp = token_logprobs(_logits(model, b, dev), b.input_ids.to(dev))
        res = policy_loss(
            logp,
            old_b,
            b.advantages.to(dev),
            b.loss_mask.to(dev),
            b.weights.to(dev),
            dual_clip=3.0,
            tokens=tokens,
        )
        res.loss.backward()
        stats = {"clip_frac": res.clip_frac, "ratio_mean": res.ratio_mean}
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    sync()
    return time.perf_counter() - t1, stats


def _logits(model, b, dev):
    return model(input_ids=b.input_ids.to(dev), attention_mask=b.attention_mask.to(dev)).logits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--tiny", action="store_true", help="a tiny config instead of the 0.6B shape (smoke runs)"
    )
    p.add_argument("--modes", default="lora,full")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(
            "gpu_check_train: torch is not installed (pip install 'trace-gym[train]')",
            file=sys.stderr,
        )
        return 3
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "gpu_check_train: no CUDA device available - nothing to check here "
            "(run on a GPU machine, or use --device cpu --tiny for a smoke run)",
            file=sys.stderr,
        )
        return 3
    for mode in args.modes.split(","):
        print(json.dumps(run_mode(args, mode.strip())), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
