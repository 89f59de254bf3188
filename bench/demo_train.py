"""The `make demo` training section: a short CPU run of the tiny model with TRACE + TreeRPO."""

from __future__ import annotations

import argparse
import os
import tempfile

from trace_gym.optional import require

__all__ = ["demo_section", "training_demo"]


def demo_section(args: argparse.Namespace) -> None:
    """The `trace-gym demo` training section (routed by `trace_gym.bench.demo.SECTIONS`)."""
    training_demo(steps=8, seed=args.seed)


def training_demo(steps: int = 8, seed: int = 0) -> None:
    """Train the warm-started tiny Qwen3 on the simulator for a few steps and print the metrics."""
    from trace_gym.trainers.loop import Trainer

    torch = require("torch", "train")
    from trace_gym.bench.pipeline import method_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and kind to a shared machine
    try:
        with tempfile.TemporaryDirectory(prefix="trace-gym-train-") as out:
            cfg = method_config("trace", seed, steps, os.path.join(out, "run"))
            kw = cfg.rollout.env_kwargs
            print(
                f"  tiny Qwen3 (built and cached on first use) on trace/Sim-v0 ({kw['num_tasks']} tasks of the "
                f"'{kw['preset'].name}' preset, see trace_gym.bench.pipeline); "
                f"TRACE allocation (M={cfg.rollout.root_budget}, N={cfg.rollout.replays_per_root:g}) + TreeRPO, "
                f"lr {cfg.optim.lr:g}, {steps} steps"
            )
            tr = Trainer(cfg)
            before = tr.evaluate()
            print(
                f"  eval before: success {before['success']:.3f} over {cfg.eval_tasks * cfg.eval_samples} episodes"
            )
            print(
                f"  {'step':>4} {'reward':>7} {'eff.ratio':>9} {'pairs':>6} {'samples':>7} {'loss':>8} "
                f"{'entropy':>7} {'clip':>5} {'gen tok/s':>9} {'rollout s':>9} {'train s':>7}"
            )
            cfg.progress = False
            for m in tr.run():
                print(
                    f"  {m['step']:>4} {m['reward']:>7.3f} {m['effective_ratio']:>9.2f} {m['contrastive_pairs']:>6} "
                    f"{m['samples']:>7} {m.get('loss', 0.0):>8.4f} {m.get('entropy', 0.0):>7.3f} "
                    f"{m.get('clip_frac', 0.0):>5.2f} {m['gen_tokens_per_s']:>9.0f} {m['time_rollout_s']:>9.1f} "
                    f"{m['time_train_s']:>7.1f}"
                )
            after = tr.history[-1].get("eval_success")
            print(
                f"  eval after:  success {after:.3f} (same tasks and seeds; a pipeline check, not a benchmark)"
            )
            print(
                "  full run: trace-gym train --config configs/cpu_tiny_sim.toml; "
                "comparison: python -m trace_gym.bench.pipeline --seeds 3"
            )
    finally:
        torch.set_num_threads(threads)
