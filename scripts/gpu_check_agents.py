#!/usr/bin/env python
"""GPU check of the agents stack: HF bf16 generation and the LM critic at Qwen3-0.6B size.

Builds a random-init Qwen3 with Qwen3-0.6B's shape (28 layers, hidden 1024, 16 heads,
8 KV heads, head_dim 128, vocab 151,936) and a locally trained BPE tokenizer (no weights
or tokenizers can be downloaded), then measures:

- `HFPolicy` batched sampling in bf16: generated tokens/s and peak memory, and the
  largest |logprob - recomputed logprob| over the sampled tokens;
- `CriticPredictor` on the same backbone: states/s for predict and for update, peak memory.

Prints one JSON object (and writes it to ``$OUT/gpu_check_agents.json`` when ``$OUT`` is
set). Without CUDA it says so and exits with status 0, having checked nothing.

    python scripts/gpu_check_agents.py [--batch 32] [--new-tokens 128] [--layers 28]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--critic-states", type=int, default=256)
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run the same code on CPU in float32 (tiny sizes advised)",
    )
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(
            "gpu_check_agents: torch is not installed (pip install 'trace-gym[train]'); nothing checked"
        )
        return 0
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(
            "gpu_check_agents: SKIPPED - no CUDA device (torch.cuda.is_available() is False); nothing checked"
        )
        return 0
    dev = _Device(torch, "cpu" if args.cpu_smoke else "cuda")
    report: dict = {
        "device": torch.cuda.get_device_name(0) if dev.cuda else "cpu (smoke run)",
        "torch": torch.__version__,
    }
    texts = [
        f"Question {i}: what is {i} plus {i * 7}? Think step by step, then answer."
        for i in range(2000)
    ]
    model, tok = _qwen3_model(torch, dev, texts, args.layers)
    report["parameters_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
    report["generation"] = _check_generation(torch, dev, model, tok, texts, args)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        tok.save_pretrained(d)
        del model  # the critic loads its own copy: free the generator's memory first
        if dev.cuda:
            torch.cuda.empty_cache()
        report["critic"] = _check_critic(dev, d, texts, args.critic_states)
    text = json.dumps(report, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check_agents.json").write_text(text)
    return 0


class _Device:
    """Where the check runs, and its CUDA-only calls (no-ops on the CPU smoke run)."""

    def __init__(self, torch, name: str):
        self.torch, self.name, self.cuda = torch, name, name == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float:
        if not self.cuda:
            return float("nan")
        return round(self.torch.cuda.max_memory_allocated() / 2**30, 2)


def _qwen3_model(torch, dev: _Device, texts: list[str], layers: int):
    """A random-init Qwen3 of Qwen3-0.6B's shape (`layers` deep) and a BPE tokenizer of `texts`."""
    from trace_gym.agents.tiny import build_tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer(texts, vocab_size=1024)
    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if dev.cuda else torch.float32
    return Qwen3ForCausalLM(cfg).to(dtype).to(dev.name), tok


def _check_generation(torch, dev: _Device, model, tok, texts: list[str], args) -> dict:
    """`HFPolicy` batched sampling: tokens/s, peak memory, logprobs against a recomputation."""
    from trace_gym.agents.formats import ReActFormat
    from trace_gym.agents.hf import HFPolicy, SamplingConfig

    from trace_gym.policy import Conversation

    env_id = "gpu-check"
    fmt = ReActFormat(
        "gpu", "You are a helpful assistant.", stop=(), max_new_tokens=args.new_tokens
    )
    pol = HFPolicy(
        model,
        tok,
        SamplingConfig(temperature=1.0, top_p=0.95, max_batch=args.batch),
        formats={env_id: fmt},
    )
    pol.chat.eos_ids = set()  # a random model would stop at random; measure full-length turns
    convs = [Conversation(env_id, f"t{i}", texts[i], (), seed=i) for i in range(args.batch)]
    pol.generate(convs[:2])  # warm-up (kernels, allocator)
    dev.sync()
    dev.reset_peak()
    t = time.perf_counter()
    outs = pol.generate(convs)
    dev.sync()
    dt = time.perf_counter() - t
    n_tok = sum(len(o.token_ids or []) for o in outs)
    out = {
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "generated_tokens": n_tok,
        "tokens_per_s": round(n_tok / dt, 1),
        "seconds": round(dt, 2),
        "peak_memory_gib": dev.peak_gib(),
        "errors": sum(o.error is not None for o in outs),
    }
    # logprobs vs one unpadded recomputation of the first conversation (bf16: loose agreement)
    ctx = pol.context(convs[0]).ids
    ids = torch.tensor([ctx + outs[0].token_ids], device=dev.name)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    rec = [float(logp[len(ctx) + j - 1, tid]) for j, tid in enumerate(outs[0].token_ids)]
    out["max_abs_logprob_diff_bf16"] = round(
        max(abs(a - b) for a, b in zip(rec, outs[0].logprobs, strict=True)), 4
    )
    return out


def _check_critic(dev: _Device, backbone: str, texts: list[str], n_states: int) -> dict:
    """`CriticPredictor` on the saved `backbone`: states/s for predict and update, peak memory."""
    from trace_gym.agents.critic import CriticPredictor

    from trace_gym.predict.base import State

    dev.reset_peak()
    critic = CriticPredictor(backbone, device=dev.name, max_tokens=512, batch_size=32)
    states = [
        State(f"p{i}", texts[i], tuple((f"step {k}", f"obs {k} " * 20) for k in range(i % 6)))
        for i in range(n_states)
    ]
    critic.predict(states[:32])
    dev.sync()
    t = time.perf_counter()
    pred = critic.predict(states)
    dev.sync()
    t_pred = time.perf_counter() - t
    n_upd = min(128, len(states))
    t = time.perf_counter()
    m = critic.update(states[:n_upd], [float(i % 2) for i in range(n_upd)])
    dev.sync()
    t_upd = time.perf_counter() - t
    return {
        "predict_states_per_s": round(len(states) / t_pred, 1),
        "update_states_per_s": round(n_upd / t_upd, 1),
        "loss": round(m["loss"], 4),
        "pred_range": [round(float(pred.min()), 4), round(float(pred.max()), 4)],
        "peak_memory_gib": dev.peak_gib(),
    }


if __name__ == "__main__":
    sys.exit(main())
