"""CPU end-to-end pipeline check: the warm-started tiny model under RL on the simulator.

Trains the tiny Qwen3 (`trace_gym.agents.tiny`) on ``trace/Sim-v0`` through its text
interface with several (allocator, optimiser) methods at equal *accounted* budget and
several seeds, and reports the evaluation success rate before and after training with
95% confidence intervals (Student t over seeds). A pipeline check - that rollouts,
advantages, losses, updates and weight sync fit together so the model learns - not
evidence about the methods: the model, task pool and budgets are tiny.

    python -m trace_gym.bench.pipeline --steps 15 --seeds 3 --out runs/pipeline

Methods (budget M roots, N replays per root, replay cost 1/2):

- ``trace``: TRACE allocation + TreeRPO, M roots and N*M replays (cost M (1 + N/2));
- ``treepo``: random branch points (the paper's TreePO baseline) + TreeRPO, same budget;
- ``grpo``: flat GRPO groups with M (1 + N/2) roots, no replays.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.budget import DEFAULT_REPLAY_COST
from trace_gym.cli import Parser

__all__ = ["METHODS", "compare", "mean_ci", "method_config"]

#: method -> (allocator, optimiser, uses replays)
METHODS: dict[str, tuple[str, str, bool]] = {
    "trace": ("trace", "treerpo", True),
    "treepo": ("treepo", "treerpo", True),
    "grpo": ("grpo", "grpo", False),
}


#: two-sided 95% Student-t quantiles for 1..10 degrees of freedom
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval (nan for n < 2)."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return float(x.mean()) if x.size else math.nan, math.nan
    if level != 0.95:
        raise ValueError("only 95% intervals are tabulated")
    df = x.size - 1
    t = _T95[df - 1] if df <= len(_T95) else 1.96
    return float(x.mean()), t * float(x.std(ddof=1)) / math.sqrt(x.size)


def warm_start_config() -> Any:
    """The tiny model of the pipeline check: enough SFT (400 steps) to write 'action N' reliably."""
    from trace_gym.agents.tiny import default_test_config

    return default_test_config(
        env_kwargs={"trace/Sim-v0": {"num_tasks": 32}}, sft_steps=400, episodes_per_env=32
    )


def pipeline_preset() -> Any:
    """A simulator preset where the move choice decides most outcomes (so a tiny model can learn it).

    The "math" preset with base logits near 0 (base_sd 1) and larger move effects
    (delta_sd 3): on 8 tasks, P(success) goes from 0.42 under uniform moves to 0.96 at
    skill 4, where the stock preset's extreme base rates leave little to learn.
    """
    from dataclasses import replace

    from trace_gym.sim import get_preset

    # The stem must be set with the name: since simulator v2 a preset's task ids and task
    # draws key on `stem` (math-luck's is "math"), so name="learnable" alone would make the
    # RL pool sim-math-0-0..7 - the very prompts (and rescaled draws) the warm start was
    # fine-tuned on, which RL then barely moves (docs/trainers.md, "Pipeline check").
    return replace(
        get_preset("math-luck"), name="learnable", stem="learnable", base_sd=1.0, delta_sd=3.0
    )


def method_config(
    method: str,
    seed: int,
    steps: int,
    out_dir: str,
    *,
    roots: int = 16,
    replays: float = 1.0,
    num_tasks: int = 8,
    pool_seed: int = 0,
    lr: float = 3e-4,
    eval_samples: int = 8,
    mini_batch_size: int = 8,
    epochs: int = 2,
) -> Any:
    """The `TrainConfig` of one (method, seed) run."""
    from trace_gym.trainers.config import TrainConfig

    allocator, algo, branching = METHODS[method]
    tiny = asdict(warm_start_config())
    budget = roots if branching else int(round(roots * (1 + replays * DEFAULT_REPLAY_COST)))
    return TrainConfig.from_dict(
        {
            "steps": steps,
            "seed": seed,
            "out_dir": out_dir,
            "resume": False,
            "overwrite": True,  # each (method, seed) starts fresh, also when the bench is rerun
            "save_every": 0,
            "eval_every": steps,
            "eval_tasks": num_tasks,
            "eval_samples": eval_samples,
            "tensorboard": False,
            "progress": False,
            "policy": {"kind": "tiny", "tiny": tiny, "gen_batch": 32},
            "rollout": {
                "env_id": "trace/Sim-v0",
                "env_kwargs": {
                    "preset": pipeline_preset(),
                    "num_tasks": num_tasks,
                    "seed": pool_seed,
                },
                "allocator": allocator,
                "root_budget": budget,
                "replays_per_root": replays if branching else 0.0,
                "candidates_per_step": num_tasks,
                "group_size": 4,
                "m_max": 8,
            },
            "algo": {"name": algo},
            "optim": {
                "lr": lr,
                "micro_batch_size": 16,
                "mini_batch_size": mini_batch_size,
                "epochs": epochs,
            },
        }
    )


def compare(
    methods: list[str], seeds: list[int], steps: int, out: str | Path, **kw: Any
) -> dict[str, Any]:
    """Train every (method, seed); success before/after and training metrics with CIs."""
    from trace_gym.trainers.loop import Trainer

    out = Path(out)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for method in methods:
        for seed in seeds:
            cfg = method_config(method, seed, steps, str(out / f"{method}-s{seed}"), **kw)
            tr = Trainer(cfg)
            before = tr.evaluate()["success"]
            hist = tr.run()
            runs[method].append(
                {
                    "seed": seed,
                    "before": before,
                    "after": hist[-1]["eval_success"],
                    "train_reward_first": float(np.mean([h["reward"] for h in hist[:3]])),
                    "train_reward_last": float(np.mean([h["reward"] for h in hist[-3:]])),
                    "effective_ratio": float(np.mean([h["effective_ratio"] for h in hist])),
                    "contrastive_pairs": float(np.mean([h["contrastive_pairs"] for h in hist])),
                    "accounted_cost": float(np.mean([h["accounted_cost"] for h in hist])),
                    "generated_tokens": float(np.sum([h["generated_tokens"] for h in hist])),
                }
            )
    summary = {}
    for method, rs in runs.items():
        row = {}
        for key in (
            "before",
            "after",
            "effective_ratio",
            "contrastive_pairs",
            "accounted_cost",
            "generated_tokens",
        ):
            row[key] = mean_ci([r[key] for r in rs])
        row["gain"] = mean_ci([r["after"] - r["before"] for r in rs])
        summary[method] = row
    report = {"steps": steps, "seeds": seeds, "runs": runs, "summary": summary}
    out.mkdir(parents=True, exist_ok=True)
    (out / "pipeline.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    p = Parser(
        prog="python -m trace_gym.bench.pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--methods", default="trace,treepo,grpo")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--roots", type=int, default=16)
    p.add_argument("--replays", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--pool-seed", type=int, default=0, help="simulator task-pool seed")
    p.add_argument("--out", default="runs/pipeline")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rep = compare(
        args.methods.split(","),
        list(range(args.seeds)),
        args.steps,
        args.out,
        roots=args.roots,
        replays=args.replays,
        lr=args.lr,
        pool_seed=args.pool_seed,
    )
    print(
        f"{'method':<8} {'success before':>18} {'success after':>18} {'gain':>18} {'eff. ratio':>16} {'cost/step':>10}"
    )
    for m, row in rep["summary"].items():
        f = lambda v: f"{v[0]:.3f} +- {v[1]:.3f}"  # noqa: E731
        print(
            f"{m:<8} {f(row['before']):>18} {f(row['after']):>18} {f(row['gain']):>18} "
            f"{f(row['effective_ratio']):>16} {row['accounted_cost'][0]:>10.1f}"
        )
    print(
        f"(mean +- 95% CI half-width over {args.seeds} seeds, {args.steps} steps each; {args.out}/pipeline.json)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
