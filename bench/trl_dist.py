"""`trace-gym bench trl-dist`: TRL's GRPOTrainer on TRACE trees, 2 processes against 1.

The same run (the tiny Qwen3 on the simulator's learnable preset, TRACE over the prompts
of each global generation batch, TreeRPO advantages, TRL's update) is launched twice from
one seed:

1. the **reference**: one plain process (``python -m trace_gym.bench.trl_dist --worker``);
2. ``accelerate launch --multi_gpu --num_processes 2`` (gloo on a machine without GPUs;
   accelerate's ``--cpu`` would start one process): TRL's batch split over 2 ranks,
   each grows its share of the trees (`trace_gym.distributed.ranks.RankShardedRunner`).

and compared step by step: the allocation (group sizes and replays per prompt, the
root total M of the *global* batch), the trees (``to_dict``: token ids, texts, rewards
and shapes exactly, generator logprobs to float rounding: ``tree_logprob_diff``), the packed
advantages, TRL's own logged advantages against ours (each run), the loss, and the final
weights (``max_abs_weight_diff``). Training runs in fp32 (``bf16=False``, accelerate's
``--mixed_precision no``) unless ``--bf16`` (TRL's default on this machine: bf16 autocast,
whose rounding differs between one and two processes).

``python -m trace_gym.bench.trl_dist --worker DIR`` is the worker both launches run (it
reads ``DIR/config.json``, writes ``DIR/rank<r>.json`` and, on rank 0, ``DIR/final.pt``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trace_gym.cli import Parser
from trace_gym.errors import ConfigError, TraceGymError

__all__ = ["DEFAULT_CONFIG", "GOALS", "compare", "launch_command", "main", "run_bench"]

#: the run both launches make (the settings of docs/trl.md's CPU example)
DEFAULT_CONFIG: dict[str, Any] = {
    "steps": 3,
    "seed": 0,
    "roots": 8,
    "replays": 0.5,
    "m_max": 4,
    "candidates": 4,
    "group": 4,
    "advantage": "treerpo",
    "learning_rate": 1e-3,
    "bf16": False,
}

#: the goals the report is judged against (fp32)
GOALS = {
    "trl_advantage_diff": 1e-5,
    "advantage_diff": 1e-5,
    "tree_logprob_diff": 1e-5,
    "max_abs_weight_diff": 1e-4,
}


# ---------------------------------------------------------------------- the worker
def worker(out: Path) -> int:
    """Train once as this process's rank; write what the comparison reads."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    cfg = json.loads((out / "config.json").read_text())
    torch.set_num_threads(1)
    trainer = build_trainer(cfg, out)
    steps: list[dict[str, Any]] = []
    trainer.add_callback(_recorder(trainer, steps))
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    rank = int(trainer.accelerator.process_index)
    result = {
        "rank": rank,
        "world": int(trainer.accelerator.num_processes),
        "runner": type(trainer.rollout_func.runner).__name__,
        "train_s": round(train_s, 2),
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "steps": steps,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    if rank == 0:
        model = trainer.accelerator.unwrap_model(trainer.model)
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / "final.pt")
    return 0


def build_trainer(cfg: dict[str, Any], out: Path) -> Any:
    """TRL's GRPOTrainer of `cfg` on this process's share (``WORLD_SIZE``) of the global batch."""
    import gymnasium as gym
    from trace_gym.agents.hf import HFPolicy
    from trace_gym.agents.tiny import default_test_config, tiny_model_dir
    from trace_gym.bench.pipeline import pipeline_preset
    from trace_gym.trainers.trl_adapter import TRLRolloutConfig, make_grpo_trainer
    from trl import GRPOConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rows = cfg["candidates"] * cfg["group"]
    if rows % world:
        raise ConfigError(f"{rows} rows per batch do not split over {world} processes")
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=rows // world,
        num_generations=cfg["group"],
        max_steps=cfg["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=cfg["bf16"],
        scale_rewards="none",
        learning_rate=cfg["learning_rate"],
        seed=cfg["seed"],
        temperature=1.0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    policy = HFPolicy.from_pretrained(
        str(tiny_model_dir(default_test_config(env_kwargs={"trace/Sim-v0": {"num_tasks": 8}}))),
        temperature=1.0,
        max_batch=32,
    )
    preset = pipeline_preset()
    rollout = TRLRolloutConfig(
        root_budget=cfg["roots"],
        replays_per_root=cfg["replays"],
        m_max=cfg["m_max"],
        advantage=cfg["advantage"],
        seed=cfg["seed"],
    )
    return make_grpo_trainer(
        policy,
        lambda: gym.make("trace/Sim-v0", preset=preset, num_tasks=8, seed=0),
        args,
        rollout,
    )


def _recorder(trainer: Any, steps: list[dict[str, Any]]) -> Any:
    """A callback appending, after each optimiser step, its trees, our advantages and TRL's."""
    import transformers

    class Record(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            r = trainer.rollout_func
            steps.append(
                {
                    "step": r.last_record["step"],
                    "record": r.last_record,
                    "trees": [t.to_dict() for t in r.last_trees],
                    "ours": [row.reward for row in r.last_rows],
                    "trl": [float(a) for a in trainer._logs["advantages"]],
                }
            )

    return Record()


# ---------------------------------------------------------------------- the launches
def launch_command(out: Path, processes: int, bf16: bool = False) -> list[str]:
    """The command that runs the worker on `out` (1: one plain process)."""
    me = ["-m", "trace_gym.bench.trl_dist", "--worker", str(out)]
    if processes == 1:
        return [sys.executable, *me]
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--multi_gpu",  # starts N processes (gloo without GPUs); --cpu would start just one
        "--mixed_precision",
        "bf16" if bf16 else "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        *me,
    ]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_launch(
    config: dict[str, Any], out: Path, processes: int, *, timeout: float = 1800
) -> tuple[list[dict[str, Any]], float]:
    """Run `config` in `out` on `processes` processes; (per-rank results, wall seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    proc = subprocess.run(
        launch_command(out, processes, config["bf16"]),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise TraceGymError(
            f"{processes} process(es) failed (exit {proc.returncode}): {tail[-600:]}"
        )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(processes)], wall


def _max_abs(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def _without_logprobs(trees: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[float]]:
    """The trees with each turn's generator logprobs taken out, and those logprobs in order.

    Token ids, texts, rewards and shapes must match exactly; the logprobs come from
    batched fp32 forwards whose padding depends on which prompts share a rank, so they
    match to float rounding (about 1e-6), not bit for bit.
    """
    flat: list[float] = []
    out = []
    for tree in trees:
        nodes = []
        for node in tree["nodes"]:
            turn = node.get("turn")
            if isinstance(turn, dict) and turn.get("logprobs") is not None:
                flat += turn["logprobs"]
                node = {**node, "turn": {**turn, "logprobs": len(turn["logprobs"])}}
            nodes.append(node)
        out.append({**tree, "nodes": nodes})
    return out, flat


def _tree_diff(x: list[dict[str, Any]], y: list[dict[str, Any]]) -> tuple[bool, float]:
    """(equal but for logprobs, largest logprob difference) of two steps' trees."""
    (sx, lx), (sy, ly) = _without_logprobs(x), _without_logprobs(y)
    return sx == sy, _max_abs(lx, ly)


def compare(
    ref_dir: Path, run_dir: Path, ref: list[dict[str, Any]], run: list[dict[str, Any]]
) -> dict[str, Any]:
    """The differences of the multi-process run to the one-process reference."""
    import torch

    one, first = ref[0], run[0]
    a = torch.load(ref_dir / "final.pt", weights_only=True)
    b = torch.load(run_dir / "final.pt", weights_only=True)
    if set(a) != set(b):
        raise TraceGymError("the runs' models hold different tensors")
    weight = max(float((a[k].float() - b[k].float()).abs().max()) for k in a if a[k].numel())
    pairs = list(zip(one["steps"], first["steps"], strict=True))
    trees = [_tree_diff(x["trees"], y["trees"]) for x, y in pairs]
    return {
        "steps": len(pairs),
        "runner": first["runner"],
        "ranks_agree": all(r["steps"] == first["steps"] for r in run),
        "trees_equal": all(same for same, _ in trees),
        "tree_logprob_diff": max(d for _, d in trees),
        "allocation_equal": all(x["record"] == y["record"] for x, y in pairs),
        "roots_per_step": [y["record"]["roots"] for _, y in pairs],
        "candidates_per_step": [len(y["record"]["candidates"]) for _, y in pairs],
        "group_sizes": [y["record"]["group_sizes"] for _, y in pairs],
        "advantage_diff": max(_max_abs(x["ours"], y["ours"]) for x, y in pairs),
        "per_step": [
            {
                "trees_equal": same,
                "tree_logprob_diff": d,
                "advantage_diff": _max_abs(x["ours"], y["ours"]),
            }
            for (same, d), (x, y) in zip(trees, pairs, strict=True)
        ],
        "trl_advantage_diff": max(
            _max_abs(s["ours"], s["trl"]) for r in (*ref, *run) for s in r["steps"]
        ),
        "loss_diff": _max_abs(one["losses"], first["losses"]),
        "max_abs_weight_diff": weight,
        "unit_rows": [sum(1 for v in y["ours"] if v != 0.0) for _, y in pairs],
    }


def run_bench(config: dict[str, Any], out: Path, processes: int = 2) -> dict[str, Any]:
    """Both launches of `config` under `out`, and their comparison."""
    ref, ref_wall = run_launch(config, out / "p1", 1)
    run, run_wall = run_launch(config, out / f"p{processes}", processes)
    rep = compare(out / "p1", out / f"p{processes}", ref, run)
    met = {k: rep[k] <= v for k, v in GOALS.items()}
    met["trees_equal"] = rep["trees_equal"] and rep["ranks_agree"]
    return {
        "config": config,
        "processes": processes,
        "load": os.getloadavg()[0],
        "wall_s": {"1": round(ref_wall, 1), str(processes): round(run_wall, 1)},
        "train_s": {"1": ref[0]["train_s"], str(processes): run[0]["train_s"]},
        "goals": GOALS,
        "met": met,
        **rep,
    }


def _table(rep: dict[str, Any]) -> str:
    keys = ("trees_equal", "tree_logprob_diff", "allocation_equal", "advantage_diff")
    keys += ("trl_advantage_diff",)
    keys += ("loss_diff", "max_abs_weight_diff", "roots_per_step", "group_sizes")
    lines = [
        f"TRL on TRACE trees: {rep['processes']} processes vs 1 ({'bf16' if rep['config']['bf16'] else 'fp32'})"
    ]
    lines += [f"  {k:<22} {rep[k]}" for k in keys]
    lines += [f"  {'wall_s':<22} {rep['wall_s']} (load {rep['load']:.2f})"]
    lines += [f"  {'met':<22} {rep['met']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="trace-gym bench trl-dist", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=DEFAULT_CONFIG["steps"])
    p.add_argument("--processes", type=int, default=2, help="processes of the second launch")
    p.add_argument("--bf16", action="store_true", help="train in TRL's bf16 default, not fp32")
    p.add_argument("--out", help="keep the runs here (default: a temporary directory)")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(Path(args.worker))
    if args.steps < 1 or args.processes < 2:
        raise ConfigError("--steps must be >= 1 and --processes >= 2")
    config = {**DEFAULT_CONFIG, "steps": args.steps, "bf16": bool(args.bf16)}
    with tempfile.TemporaryDirectory(prefix="trace-gym-bench-trl-dist-") as tmp:
        rep = run_bench(config, Path(args.out) if args.out else Path(tmp), args.processes)
    print(_table(rep))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
