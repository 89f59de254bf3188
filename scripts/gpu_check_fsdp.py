#!/usr/bin/env python
"""GPU check of FSDP2 sharded training and of the memory formula, at Qwen3-0.6B's shape or 8B's.

Builds a random-init Qwen3-0.6B-shaped model (``--tiny``: a small one) with a tokenizer
trained locally on scripted Sim episodes, saves it, and runs ``trace-gym bench train``'s
code (`trace_gym.bench.train.run_bench`): the single-process trainer, then the
`ShardedTrainer` under torchrun on ``--world-size`` GPUs (default: all visible), full
fine-tune with fp32 master weights, bf16 compute, fp32 gradient reduction, gradient
checkpointing and a bf16 generator copy on rank 0. Prints JSON lines: the bench report
(step time, peak memory per rank, diffs to one process - bf16 compute does not match the
fp32 reference to fp32 tolerance, so the diffs are informative only), then per rank the
measured peak (``torch.cuda.max_memory_allocated``) against
`trace_gym.bench.train.memory_estimate` at the run's longest sample, and the
ratio. ``--shape 8b`` first prints the formula alone at Qwen3-8B's full shape for 1, 2, 4
and 8 ranks (labelled ``formula_only``, with whether rank 0 fits this GPU: at one rank it
does not), then measures an 8B-wide model (hidden 4096, intermediate 12288, untied
embeddings) cut to ``--layers`` decoder layers, which fits one H200, against the formula
at that cut shape. No downloads. Exits 3 without CUDA (``--tiny --device cpu``: a CPU
smoke run; with --tiny the measured model is the tiny one).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_model_dir(tiny: bool, out: Path, shape: str = "0.6b", layers: int | None = None):
    """A saved random-init model (fp32) and its locally trained tokenizer; (dir, its shape)."""
    import torch
    from gpu_check_step import qwen3_model
    from trace_gym.agents.sft import collect_episodes, episode_texts
    from trace_gym.agents.tiny import build_tokenizer

    episodes = collect_episodes(("trace/Sim-v0",), 8, skill=0.8, seed=0, env_kwargs={})
    tokenizer = build_tokenizer(episode_texts(episodes), 1024)
    model = qwen3_model(tiny, len(tokenizer), tokenizer, torch.float32, shape, layers)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, shape_of(model)


def shape_of(model):
    """The `ModelShape` of a built model (what the memory formula reads)."""
    from trace_gym.bench.train import ModelShape

    c = model.config
    return ModelShape(
        float(sum(p.numel() for p in model.parameters())),
        c.hidden_size,
        c.intermediate_size,
        c.num_hidden_layers,
        c.vocab_size,
        c.num_key_value_heads,
        c.head_dim,
        bool(c.tie_word_embeddings),
    )


def formula_only_8b(world_sizes, seq: int, gen_batch: int, device_gib: float | None) -> list[dict]:
    """The memory formula at Qwen3-8B's full shape per world size: no measurement (a full
    fine-tune of 8B needs about 16 bytes per parameter of states alone, 131 GB at one rank)."""
    from trace_gym.bench.train import SHAPES, memory_estimate

    rows = []
    for world in world_sizes:
        est = memory_estimate(
            SHAPES["qwen3-8b"],
            world,
            micro_batch=1,
            seq_len=seq,
            gen_batch=gen_batch,
            gen_context=seq,
        )
        rows.append(
            {
                "check": "memory_formula_8b_full",
                "formula_only": True,
                "world_size": world,
                "seq_len": seq,
                "rank0_gib": est["rank0"] / 2**30,
                "other_ranks_gib": est["other_ranks"] / 2**30,
                "device_gib": device_gib,
                "fits_device": None if device_gib is None else est["rank0"] / 2**30 <= device_gib,
                "terms_gib": {k: v / 2**30 for k, v in est.items()},
            }
        )
    return rows


def config(path: Path, device: str, args: argparse.Namespace) -> dict:
    cuda = device.startswith("cuda")
    return {
        "steps": args.steps,
        "seed": 0,
        "save_every": 1,
        "tensorboard": False,
        "progress": False,
        "policy": {
            "kind": "hf",
            "path": str(path),
            "device": device,
            "dtype": "float32",
            "max_new_tokens": args.new_tokens,
            "max_context": 2048,
            "gen_batch": args.gen_batch,
            "gradient_checkpointing": True,
        },
        "rollout": {
            "env_id": "trace/Sim-v0",
            "env_kwargs": {"preset": "math-r06", "num_tasks": 8},
            "allocator": "trace",
            "predictor": "empirical",
            "root_budget": 16,
            "replays_per_root": 1.0,
            "candidates_per_step": 4,
            "m_max": 8,
            "group_size": 4,
        },
        # a random-init model rarely succeeds: train on zero-advantage samples too (the memory is the same)
        "algo": {"name": "treerpo", "skip_zero_advantage": False},
        "optim": {"lr": 1e-5, "micro_batch_size": 1, "mini_batch_size": 8, "max_seq_len": 2048},
        "dist": {
            "param_dtype": "bfloat16" if cuda else None,
            "reduce_dtype": "float32" if cuda else None,
            "generator_dtype": "bfloat16" if cuda else None,
            "backend": "nccl" if cuda else "gloo",
        },
    }


def parser():
    from gpu_check_step import check_parser

    p = check_parser(__doc__)
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="ranks of the sharded run (default: visible GPUs)",
    )
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--gen-batch", type=int, default=16)
    p.add_argument(
        "--shape",
        choices=("0.6b", "8b"),
        default="0.6b",
        help="8b: the formula alone at the full 8B shape, and measured on an 8B-wide model of "
        "--layers layers (fits one GPU)",
    )
    p.add_argument("--layers", type=int, default=None, help="8b: decoder layers (default 4)")
    p.add_argument("--json", help="also write the report here")
    return p


def formula_rows(args, shape, world: int, run: dict, cuda: bool) -> tuple[list[dict], dict]:
    """Per rank: the measured peak against `memory_estimate` at the run's longest sample."""
    from trace_gym.bench.train import memory_estimate

    seq = int(run["max_sample_len"] or 2048)
    est = memory_estimate(
        shape, world, micro_batch=1, seq_len=seq, gen_batch=args.gen_batch, gen_context=seq
    )
    rows = []
    for rank, measured in enumerate(run["peak_mem_mb"]):
        want = (est["rank0"] if rank == 0 else est["other_ranks"]) / 2**20
        rows.append(
            {
                "check": "memory_formula",
                "shape": "tiny" if args.tiny else args.shape,
                "layers": shape.layers,
                "rank": rank,
                "world_size": world,
                "seq_len": seq,
                "measured_mb": measured,
                "estimate_mb": want,
                "ratio": measured / want,
                "terms_mb": {k: v / 2**20 for k, v in est.items()},
                "what": "peak_cuda_mb" if cuda else "peak_rss_mb (CPU: not comparable)",
            }
        )
    return rows, est


def main(argv: list[str] | None = None) -> int:
    from gpu_check_step import no_cuda

    # gpu_check.sh hands every check the same arguments: the other checks' are ignored here
    args, _ = parser().parse_known_args(argv)
    import torch
    from trace_gym.bench.train import SHAPES, ModelShape, run_bench

    cuda = args.device.startswith("cuda")
    if no_cuda(args.device):
        return 3
    world = args.world_size or (torch.cuda.device_count() if cuda else 2)
    layers = (args.layers or 4) if args.shape == "8b" else args.layers
    if args.shape == "8b":
        dev = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None
        for row in formula_only_8b((1, 2, 4, 8), 2048, args.gen_batch, dev):
            print(json.dumps(row), flush=True)
    with tempfile.TemporaryDirectory(prefix="trace-gym-fsdp-check-") as tmp:
        model_dir, built = build_model_dir(args.tiny, Path(tmp) / "model", args.shape, layers)
        rep = run_bench(config(model_dir, args.device, args), [world], Path(tmp) / "runs")
    name = "tiny" if args.tiny else args.shape
    head = {"check": "fsdp_bench", "shape": name, "layers": None if args.tiny else layers}
    print(json.dumps({**head, **rep}), flush=True)
    if args.tiny:
        shape = ModelShape(2.3e6, 64, 128, 2, 1024, 1, 32, True)
    elif args.shape == "0.6b" and not layers:
        shape = SHAPES["qwen3-0.6b"]
    else:  # the cut 8B-wide model: its own parameter count and layers
        shape = built
    run = rep["world_sizes"][str(world) if world != 1 else "1-sharded"]
    rows, est = formula_rows(args, shape, world, run, cuda)
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"report": rep, "estimate": est}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
