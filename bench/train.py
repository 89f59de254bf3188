"""`trace-gym bench train`: FSDP2 sharded training against one process on the same global batch.

For a config (default: `DEFAULT_CONFIG`, the tiny Qwen3 on the simulator; ``--config
FILE`` for any other, e.g. a GPU preset), it runs

1. the **reference**: the single-process `trace_gym.trainers.loop.Trainer` (no
   torch.distributed at all), in a subprocess;
2. for each ``--world-size`` W: the `trace_gym.trainers.sharding.ShardedTrainer` under
   ``torchrun --standalone --nproc-per-node W`` (gloo on CPU, NCCL on CUDA),

each for ``--steps`` steps from the same seed, then compares: ``max_abs_weight_diff``
(final full weights), ``max_abs_grad_diff`` (the full gradient of the first optimiser
step, before clipping), ``loss_diff`` and ``grad_norm_diff`` (largest per-step
difference of the logged loss and pre-clip gradient norm), and reports ``step_s`` /
``update_s`` (mean wall seconds per step and of its update part, steps after the first)
and ``peak_mem_mb`` per rank (CUDA: ``max_memory_allocated``; CPU: the process's peak
RSS, which includes the interpreter and libraries). AdamW is invariant to the scale of
the gradient, so a gradient reduced with AVG instead of SUM would leave the weights almost
unchanged: the gradient and gradient-norm diffs are the comparisons that catch it.

Rollouts: with ``--rollouts all,rank0`` every world size W > 1 runs twice, once with
every rank growing its share of the trees (``dist.rollouts = "all"``) and once with rank 0
growing them all (``"rank0"``), and the report gives ``rollout_s`` (rank 0's mean rollout
wall seconds per step, steps after the first) of each and their ratio. ``--latency S``
makes every policy call of every run wait S seconds (`MeteredPolicy`: a generation engine
that answers at most ``rollout.max_batch`` conversations per call), and
``--latency-per-conversation C`` another C seconds per conversation in the call (an engine
bound by throughput rather than by a call's fixed cost), so the figure measures how the
work is spread over the ranks, not this machine's cores.

``python -m trace_gym.bench.train --worker DIR [--plain]`` is the worker both
launches run (it reads ``DIR/config.json`` and writes ``DIR/rank<r>.json`` and, on rank
0, ``DIR/final.pt``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_gym.cli import Parser
from trace_gym.errors import ConfigError, TraceGymError

__all__ = [
    "DEFAULT_CONFIG",
    "SHAPES",
    "TOLERANCE",
    "MeteredPolicy",
    "ModelShape",
    "compare",
    "launch_command",
    "main",
    "memory_estimate",
    "run_bench",
    "run_launch",
    "write_config",
]

#: the CPU default: a 2-layer tiny Qwen3 (40 SFT steps) on the simulator's "math-r06" preset
DEFAULT_CONFIG: dict[str, Any] = {
    "steps": 2,
    "seed": 0,
    "save_every": 1,
    "tensorboard": False,
    "progress": False,
    "policy": {
        "kind": "tiny",
        "gen_batch": 32,
        "tiny": {
            "vocab_size": 512,
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "num_kv_heads": 1,
            "head_dim": 32,
            "intermediate_size": 128,
            "episodes_per_env": 8,
            "sft_steps": 40,
            "sft_max_len": 512,
            "envs": ["trace/Sim-v0"],
            "env_kwargs": {"trace/Sim-v0": {"num_tasks": 8}},
        },
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
    "algo": {"name": "treerpo"},
    "optim": {
        "lr": 1e-3,
        # Adam's first step moves a weight by lr * g / (|g| + eps): at torch's 1e-8 a gradient
        # of ~1e-9 whose sign flips under rounding moves that weight by ~2e-4 one way or the
        # other (measured on the vLLM-engine comparison: gradients 7.5e-8 apart, weights 1.9e-4).
        # 1e-6 keeps the weight comparison about the sharding (docs/distributed.md)
        "eps": 1e-6,
        "micro_batch_size": 3,
        "mini_batch_size": 8,
        "epochs": 1,
        "max_seq_len": 2048,
    },
}

#: fp32 on CPU: the sharded run sums the same per-token terms in another order (micro-batches
#: hold other samples, gradients are summed across ranks), so they agree to float rounding
TOLERANCE = {
    "max_abs_weight_diff": 1e-5,
    "max_abs_grad_diff": 1e-6,
    "loss_diff": 1e-5,
    "grad_norm_diff": 1e-5,
}


# ---------------------------------------------------------------------- worker
class MeteredPolicy:
    """The runner's policy, waiting `latency_s` per ``generate`` call plus
    `per_conversation_s` per conversation in it (a simulated engine: a fixed cost per call
    and, when throughput-bound, a cost per sequence) and counting calls and conversations;
    every other attribute is the wrapped policy's."""

    def __init__(self, policy: Any, latency_s: float = 0.0, per_conversation_s: float = 0.0):
        self.__dict__.update(
            policy=policy,
            latency_s=latency_s,
            per_conversation_s=per_conversation_s,
            calls=0,
            conversations=0,
        )

    def __getattr__(self, name: str) -> Any:
        if "policy" not in self.__dict__:  # unpickling (a Ray worker's copy): not set yet
            raise AttributeError(name)
        return getattr(self.__dict__["policy"], name)

    def generate(self, conversations: Any) -> Any:
        wait = self.latency_s + self.per_conversation_s * len(conversations)
        if wait:
            time.sleep(wait)
        self.__dict__["calls"] += 1
        self.__dict__["conversations"] += len(conversations)
        return self.policy.generate(conversations)


def _capture_first_gradient(tr: Any, box: dict[str, Any]) -> None:
    """Wrap the optimiser's step so the first call records the full gradient (a collective when sharded)."""
    original = tr.optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        # only the trainer's own steps: DCP's state dict steps a fresh optimizer at lr 0
        if "grads" not in box and box.get("updating"):
            grads = {}
            for name, p in tr.model.named_parameters():
                g = p.grad
                if g is not None:
                    grads[name] = (
                        (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().float().cpu()
                    )
            box["grads"] = grads
        return original(*args, **kwargs)

    tr.optimizer.step = step
    update = tr.update

    def recorded(samples: list[Any], step_: int) -> dict[str, float]:
        box["max_len"] = max([box.get("max_len", 0)] + [len(s.input_ids) for s in samples])
        box["updating"] = True
        try:
            return update(samples, step_)
        finally:
            box["updating"] = False

    tr.update = recorded


def _peak_mem() -> dict[str, float]:
    import torch

    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    out["peak_mem_mb"] = out.get("peak_cuda_mb", out["peak_rss_mb"])
    return out


def worker(out: Path, plain: bool) -> int:
    """Run the config in `out/config.json` (one rank of it); write this rank's results."""
    import torch
    from trace_gym.trainers.config import TrainConfig
    from trace_gym.trainers.loop import Trainer
    from trace_gym.trainers.sharding import ShardedTrainer, full_state

    cfg = TrainConfig.from_dict(json.loads((out / "config.json").read_text()))
    tr = Trainer(cfg) if plain else ShardedTrainer(cfg)
    rank, world = (0, 1) if plain else (tr.dist.rank, tr.dist.world_size)
    bench = json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else {}
    metered = tr.runner.policy = MeteredPolicy(
        tr.runner.policy, bench.get("latency_s", 0.0), bench.get("per_conversation_s", 0.0)
    )
    box: dict[str, Any] = {}
    _capture_first_gradient(tr, box)
    t0 = time.perf_counter()
    hist = tr.run()
    wall = time.perf_counter() - t0
    if plain:
        weights = {n: t.detach().float().cpu() for n, t in tr.model.state_dict().items()}
    else:
        weights = {n: t.float().cpu() for n, t in full_state(tr.model, rank == 0, None).items()}
    if rank == 0:
        torch.save({"weights": weights, "grads": box.get("grads", {})}, out / "final.pt")
    keys = (
        "step",
        "loss",
        "grad_norm",
        "samples",
        "trained_tokens",
        "time_rollout_s",
        "time_train_s",
    )
    rows = [{k: m.get(k) for k in keys} for m in hist]
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "world_size": world,
                "wall_s": wall,
                "max_sample_len": box.get("max_len", 0),
                "policy_calls": metered.calls,
                "policy_conversations": metered.conversations,
                "history": rows,
                **_peak_mem(),
            }
        )
        + "\n"
    )
    if not plain:
        tr.close()
    return 0


# ---------------------------------------------------------------------- launcher
def launch_command(out: Path, world_size: int | None) -> list[str]:
    """The command that runs the worker on `out` (world_size None: one plain process)."""
    me = ["-m", "trace_gym.bench.train", "--worker", str(out)]
    if world_size is None:
        return [sys.executable, *me, "--plain"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world_size}",
        *me,
    ]


def write_config(
    config: dict[str, Any],
    out: Path,
    world_size: int | None,
    resume: bool = False,
    latency_s: float = 0.0,
    per_conversation_s: float = 0.0,
) -> None:
    """`out/config.json`: `config` with its run directory under `out`, sharded unless
    `world_size` is None; `out/bench.json`: the simulated policy latency."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(
        json.dumps({"latency_s": latency_s, "per_conversation_s": per_conversation_s})
    )
    cfg = {
        **config,
        "out_dir": str(out / "run"),
        "resume": resume,
        "overwrite": not resume,  # a fresh launch replaces an earlier one in `out`
        "dist": {**config.get("dist", {}), "strategy": "none" if world_size is None else "fsdp"},
    }
    (out / "config.json").write_text(json.dumps(cfg))


def run_launch(
    config: dict[str, Any],
    out: Path,
    world_size: int | None,
    *,
    resume: bool = False,
    timeout: float = 1800,
    latency_s: float = 0.0,
    per_conversation_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Run `config` in `out` (world_size None: the plain single-process trainer); per-rank results."""
    write_config(config, out, world_size, resume, latency_s, per_conversation_s)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(
        launch_command(out, world_size), capture_output=True, text=True, timeout=timeout, env=env
    )
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise TraceGymError(
            f"{'one process' if world_size is None else f'{world_size} ranks'} failed "
            f"(exit {proc.returncode}): {tail[-600:]}"
        )
    n = 1 if world_size is None else world_size
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:

    if set(a) != set(b):
        raise TraceGymError(f"the runs hold different tensors: {sorted(set(a) ^ set(b))[:4]}")
    return max((float((a[k] - b[k]).abs().max()) for k in a if a[k].numel()), default=0.0)


def _series_diff(ref: list[dict[str, Any]], run: list[dict[str, Any]], key: str) -> float | None:
    pairs = [(x.get(key), y.get(key)) for x, y in zip(ref, run, strict=False)]
    pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
    return max((abs(x - y) for x, y in pairs), default=None)


def compare(
    ref_dir: Path, run_dir: Path, ref: list[dict[str, Any]], run: list[dict[str, Any]]
) -> dict[str, Any]:
    """The differences of a sharded run to the single-process reference."""
    import torch

    a = torch.load(ref_dir / "final.pt", weights_only=False)
    b = torch.load(run_dir / "final.pt", weights_only=False)
    h0, h1 = ref[0]["history"], run[0]["history"]
    return {
        "max_abs_weight_diff": _max_diff(a["weights"], b["weights"]),
        "max_abs_grad_diff": _max_diff(a["grads"], b["grads"])
        if a["grads"] and b["grads"]
        else None,
        "loss_diff": _series_diff(h0, h1, "loss"),
        "grad_norm_diff": _series_diff(h0, h1, "grad_norm"),
        "same_samples": [r.get("samples") for r in h0] == [r.get("samples") for r in h1],
        "grad_norm": [r.get("grad_norm") for r in h1],
    }


def _timing(results: list[dict[str, Any]]) -> dict[str, Any]:
    rows = results[0]["history"]
    timed = rows[1:] or rows
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "step_s": mean([r["time_rollout_s"] + r["time_train_s"] for r in timed]),
        "update_s": mean([r["time_train_s"] for r in timed]),
        "rollout_s": mean([r["time_rollout_s"] for r in timed]),
        "policy_calls": [r.get("policy_calls") for r in results],
        "policy_conversations": [r.get("policy_conversations") for r in results],
        "peak_mem_mb": [r["peak_mem_mb"] for r in results],
        "peak_rss_mb": [r["peak_rss_mb"] for r in results],
        "losses": [r["loss"] for r in rows],
        "max_sample_len": results[0].get("max_sample_len"),
    }


#: ``dist.rollouts`` values a run can compare (`trace_gym.trainers.config.DIST_ROLLOUTS`)
ROLLOUTS = ("all", "rank0")


def run_bench(
    config: dict[str, Any],
    world_sizes: list[int],
    out: Path,
    *,
    rollouts: tuple[str, ...] = ("all",),
    latency_s: float = 0.0,
    per_conversation_s: float = 0.0,
) -> dict[str, Any]:
    """The report: the reference (key "1") and every world size (and, for W > 1, every
    ``dist.rollouts`` in `rollouts`: key "W", or "W-rank0"), with the differences, the
    goals and, with both rollouts, the ratio of their rollout times per step."""
    lat = {"latency_s": latency_s, "per_conversation_s": per_conversation_s}
    ref = run_launch(config, out / "ref", None, **lat)
    report: dict[str, Any] = {
        "world_sizes": {"1": {"launch": "one process (Trainer)", **_timing(ref)}},
        "tolerance": TOLERANCE,
        "steps": config.get("steps"),
        "latency_s": latency_s,
        "per_conversation_s": per_conversation_s,
        "max_batch": config.get("rollout", {}).get("max_batch"),
        "rollout_ratio": {},
    }
    for w in world_sizes:
        for mode in rollouts if w > 1 else ("all",):
            key = (str(w) if w != 1 else "1-sharded") + ("" if mode == "all" else f"-{mode}")
            cfg = {**config, "dist": {**config.get("dist", {}), "rollouts": mode}}
            res = run_launch(cfg, out / f"w{key}", w, **lat)
            diff = compare(out / "ref", out / f"w{key}", ref, res)
            report["world_sizes"][key] = {
                "launch": f"torchrun --nproc-per-node {w} (ShardedTrainer, rollouts {mode})",
                **_timing(res),
                **diff,
            }
            report["world_sizes"][key]["within_tolerance"] = all(
                diff[k] is not None and diff[k] <= tol for k, tol in TOLERANCE.items()
            )
        both = report["world_sizes"].get(str(w)), report["world_sizes"].get(f"{w}-rank0")
        if w > 1 and all(r and r["rollout_s"] for r in both):
            report["rollout_ratio"][str(w)] = both[0]["rollout_s"] / both[1]["rollout_s"]
    return report


# ---------------------------------------------------------------------- memory estimate
#: bytes per token per vocabulary entry on the logits path: bf16 logits and their temperature-scaled
#: copy (2 + 2), fp32 log-softmax (4), its gradient (4), the bf16 gradient of the logits (2), 2 spare
LOGIT_BYTES = 16.0


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of a model (`SHAPES` holds the Qwen3 sizes)."""

    params: float
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    kv_heads: int
    head_dim: int
    tied: bool

    @property
    def largest_unit(self) -> float:
        """Parameters of the largest FSDP unit: the root (tied embeddings) or one embedding matrix
        or one decoder layer, whichever is larger."""
        emb = self.vocab * self.hidden
        layer = (self.params - emb * (1 if self.tied else 2)) / self.layers
        return max(emb, layer)


#: published Qwen3 shapes (config.json of each model)
SHAPES = {
    "qwen3-0.6b": ModelShape(0.596e9, 1024, 3072, 28, 151936, 8, 128, True),
    "qwen3-8b": ModelShape(8.19e9, 4096, 12288, 36, 151936, 8, 128, False),
    "qwen3-14b": ModelShape(14.77e9, 5120, 17408, 40, 151936, 8, 128, False),
}


def memory_estimate(
    shape: ModelShape,
    world: int,
    *,
    micro_batch: int,
    seq_len: int,
    checkpointing: bool = True,
    gen_batch: int = 0,
    gen_context: int = 0,
    generator_bytes: float = 2.0,
) -> dict[str, float]:
    """Peak GPU bytes per rank of a full fine-tune under `ShardedTrainer` (docs/distributed.md,
    "Memory estimate"; checked only at 0.6B by scripts/gpu_check.sh). Terms:

    - sharded states: fp32 weights + fp32 gradients + AdamW's two fp32 moments, 16 bytes per
      parameter, over `world` ranks;
    - gathered units: the largest FSDP unit in bf16 twice (current + prefetched) and its fp32
      unsharded gradient (8 bytes per parameter of that unit);
    - activations of one micro-batch of `seq_len` tokens: checkpointed, one bf16 hidden state per
      layer plus one layer recomputed (16 h + 8 I bytes per token), else every layer's; plus the
      logits path (`LOGIT_BYTES` per vocabulary entry per token);
    - a generating rank only: the generator copy (`generator_bytes` per parameter) and its
      KV cache for `gen_batch` sequences of `gen_context` tokens (bf16). "rank0" is such a
      rank's peak, "other_ranks" a rank that does not generate: with ``dist.rollouts =
      "all"`` (the default) every rank generates, so every rank's peak is "rank0".
    """
    tokens = micro_batch * seq_len
    layer_acts = 16.0 * shape.hidden + 8.0 * shape.intermediate
    acts = tokens * (
        2.0 * shape.hidden * shape.layers + layer_acts
        if checkpointing
        else layer_acts * shape.layers
    )
    terms = {
        "sharded_states": 16.0 * shape.params / world,
        "gathered_units": 8.0 * shape.largest_unit,
        "activations": acts,
        "logits": tokens * LOGIT_BYTES * shape.vocab,
        "generator": generator_bytes * shape.params,
        "kv_cache": 2.0
        * 2
        * gen_batch
        * gen_context
        * shape.layers
        * shape.kv_heads
        * shape.head_dim,
    }
    terms["rank0"] = sum(terms.values())
    terms["other_ranks"] = terms["rank0"] - terms["generator"] - terms["kv_cache"]
    return terms


# ---------------------------------------------------------------------- command line
def _table(rep: dict[str, Any]) -> str:
    lines = [
        f"{'world size':<12} {'step s':>8} {'rollout s':>9} {'update s':>9} "
        f"{'peak mem MB per rank':<26} {'max |dW|':>10} "
        f"{'max |dG|':>10} {'loss diff':>10} {'|g| diff':>10}"
    ]
    fmt = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
    for key, r in rep["world_sizes"].items():
        mem = ", ".join(f"{m:.0f}" for m in r["peak_mem_mb"])
        lines.append(
            f"{key:<12} {r['step_s'] or 0:>8.2f} {r['rollout_s'] or 0:>9.2f} "
            f"{r['update_s'] or 0:>9.2f} {mem:<26} "
            f"{fmt(r.get('max_abs_weight_diff')):>10} {fmt(r.get('max_abs_grad_diff')):>10} "
            f"{fmt(r.get('loss_diff')):>10} {fmt(r.get('grad_norm_diff')):>10}"
        )
    for w, ratio in rep["rollout_ratio"].items():
        lines.append(
            f"rollout wall time per step at {w} ranks, all ranks / rank 0 only: {ratio:.2f}x"
        )
    return "\n".join(lines)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    from trace_gym.trainers.cli import parse_value
    from trace_gym.trainers.config import load_config

    if args.config:
        d = load_config(args.config).to_dict()
    else:
        d = json.loads(json.dumps(DEFAULT_CONFIG))
    d["steps"] = args.steps
    for item in args.set:
        if "=" not in item:
            raise ConfigError(f"--set needs KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        *head, last = k.strip().split(".")
        node = d
        for part in head:
            node = node.setdefault(part, {})
        node[last] = parse_value(v)
    from trace_gym.trainers.config import TrainConfig

    TrainConfig.from_dict(d)  # validated here, not in the workers
    return d


def _parser() -> Parser:
    p = Parser(prog="trace-gym bench train", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--config", help="a training config (default: the tiny CPU config of this module)"
    )
    p.add_argument(
        "--world-size",
        default="2",
        help="comma-separated world sizes of the sharded runs (default 2)",
    )
    p.add_argument("--steps", type=int, default=2)
    p.add_argument(
        "--rollouts",
        default="all",
        help="comma-separated dist.rollouts of the runs with W > 1: all, rank0 (default all)",
    )
    p.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="seconds every policy call waits (a simulated engine; default 0)",
    )
    p.add_argument(
        "--latency-per-conversation",
        type=float,
        default=0.0,
        help="seconds every policy call also waits per conversation in it (default 0)",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value"
    )
    p.add_argument("--out", help="keep the runs here (default: a temporary directory)")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        return worker(Path(args.worker), args.plain)
    try:
        sizes = [int(x) for x in args.world_size.split(",") if x.strip()]
    except ValueError as e:
        raise ConfigError(
            f"--world-size must be integers separated by commas, got {args.world_size!r}"
        ) from e
    if not sizes or min(sizes) < 1 or args.steps < 1:
        raise ConfigError("--world-size values and --steps must be >= 1")
    rollouts = tuple(x.strip() for x in args.rollouts.split(",") if x.strip())
    if not rollouts or any(x not in ROLLOUTS for x in rollouts):
        raise ConfigError(f"--rollouts takes {', '.join(ROLLOUTS)}, got {args.rollouts!r}")
    if args.latency < 0 or args.latency_per_conversation < 0:
        raise ConfigError(
            "--latency and --latency-per-conversation must be >= 0 seconds, got "
            f"{args.latency} and {args.latency_per_conversation}"
        )
    config = _config(args)
    with tempfile.TemporaryDirectory(prefix="trace-gym-bench-train-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        rep = run_bench(
            config,
            sizes,
            out,
            rollouts=rollouts,
            latency_s=args.latency,
            per_conversation_s=args.latency_per_conversation,
        )
    print(_table(rep))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
