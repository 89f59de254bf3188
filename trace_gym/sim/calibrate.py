"""Calibration of the simulator presets on *non-adaptive* baseline statistics only.

- GRPO with a fixed group of G rollouts per prompt: the effective ratio is exactly
  ``mean_x 1 - p_x^G - (1 - p_x)^G`` with ``p_x = Z_0(x)`` (`grpo_effective_ratio`);
  `grpo_effective_ratio_mc` checks it by playing the groups with `SimEnv` + `SimPolicy`.
- Random-branching tree rollouts (TreePO-style): R roots per prompt, then
  ``replays_per_root * R`` continuations from prefixes drawn uniformly (with
  replacement) among the inner turn boundaries of the prompt's roots, replayed from
  restored checkpoints (`random_branching_effective_ratio`, Monte-Carlo).
- The U-shape: the share of prompts with Z_0 below 0.1 or above 0.9.

``python -m trace_gym.sim.calibrate [--preset NAME] [--tasks N] [--mc-prompts N]``
prints the figures that docs/sim.md records for the frozen presets.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import numpy as np

from trace_gym.sim.env import SimEnv
from trace_gym.sim.model import pool_values
from trace_gym.sim.policy import SimPolicy
from trace_gym.sim.presets import PRESETS, SimPreset, get_preset
from trace_gym.sim.sampling import sample_tree

__all__ = [
    "CalibrationReport",
    "calibrate",
    "grpo_effective_ratio",
    "grpo_effective_ratio_mc",
    "main",
    "random_branching_effective_ratio",
]


def grpo_effective_ratio(
    preset: str | SimPreset, num_tasks: int = 2000, seed: int = 0, group: int = 8
) -> float:
    """Exact expected effective ratio of GRPO with `group` rollouts on every prompt of a pool."""
    p = pool_values(preset, num_tasks, seed)
    return float(np.mean(1.0 - p**group - (1.0 - p) ** group))


def grpo_effective_ratio_mc(
    preset: str | SimPreset, num_prompts: int = 500, seed: int = 0, group: int = 8, mc_seed: int = 1
) -> float:
    """Monte-Carlo effective ratio of GRPO groups played with `SimEnv` + `SimPolicy`."""
    return random_branching_effective_ratio(preset, num_prompts, seed, group, 0.0, mc_seed)


def random_branching_effective_ratio(
    preset: str | SimPreset,
    num_prompts: int = 500,
    seed: int = 0,
    roots: int = 8,
    replays_per_root: float = 2.0,
    mc_seed: int = 1,
) -> float:
    """Monte-Carlo effective ratio of random-branching trees (roots + random-prefix replays).

    Plays with `SimEnv` + `SimPolicy`, replaying from restored checkpoints
    (`trace_gym.sim.sampling.sample_tree`); one tree per prompt of the pool.
    """
    env = SimEnv(preset, num_tasks=num_prompts, seed=seed)
    policy = SimPolicy(env.preset)
    rng = np.random.default_rng(mc_seed)
    mixed = 0
    for task in range(num_prompts):
        mixed += sample_tree(env, policy, task, rng, roots, replays_per_root).metrics().mixed
    return mixed / num_prompts


def predictor_quality(
    preset: str | SimPreset,
    predictors: tuple[str, ...] = ("features", "empirical", "constant"),
    train_tasks: int = 160,
    test_tasks: int = 80,
    roots: int = 6,
    replays_per_root: float = 2.0,
    prefix_share: float = 0.06,
    epochs: int = 3,
    seed: int = 0,
) -> dict[str, dict[str, dict[int, dict[str, float]]]]:
    """Quality by depth against true values of predictors trained on random-branching trees.

    Trains each predictor on the trees of `train_tasks` tasks (`epochs` update calls,
    each on a fresh `training_batch`), then scores two held-out sets: new trees of the
    *same* tasks ("seen_tasks") and trees of `test_tasks` *unseen* tasks ("new_tasks").
    """
    from trace_gym.predict import make_predictor, quality_by_depth, training_batch
    from trace_gym.sim.sampling import sample_trees

    n = train_tasks + test_tasks
    kw = dict(num_tasks=n, pool_seed=seed, roots=roots, replays_per_root=replays_per_root)
    train = sample_trees(preset, range(train_tasks), seed=seed + 1, **kw)
    seen = sample_trees(preset, range(train_tasks), seed=seed + 2, **kw)
    new = sample_trees(preset, range(train_tasks, n), seed=seed + 3, **kw)
    out = {}
    for name in predictors:
        pred = make_predictor(name)
        rng = np.random.default_rng(seed)
        for _ in range(epochs):
            pred.update(*training_batch(train, prefix_share=prefix_share, rng=rng))
        out[name] = {
            "seen_tasks": quality_by_depth(pred, seen, use_true_values=True),
            "new_tasks": quality_by_depth(pred, new, use_true_values=True),
        }
    return out


@dataclass(frozen=True)
class CalibrationReport:
    """The calibration figures of one preset (what docs/sim.md records)."""

    preset: str
    grpo8_exact: float
    grpo8_mc: float
    random_branching_mc: float
    mean_success: float
    share_below_0_1: float
    share_above_0_9: float
    histogram: tuple[int, ...]


def calibrate(
    preset: str | SimPreset, num_tasks: int = 2000, mc_prompts: int = 400, seed: int = 0
) -> CalibrationReport:
    """All calibration figures of a preset (exact where possible, Monte-Carlo otherwise)."""
    p = get_preset(preset)
    z = pool_values(p, num_tasks, seed)
    return CalibrationReport(
        preset=p.name,
        grpo8_exact=grpo_effective_ratio(p, num_tasks, seed),
        grpo8_mc=grpo_effective_ratio_mc(p, mc_prompts, seed),
        random_branching_mc=random_branching_effective_ratio(p, mc_prompts, seed),
        mean_success=float(z.mean()),
        share_below_0_1=float(np.mean(z < 0.1)),
        share_above_0_9=float(np.mean(z > 0.9)),
        histogram=tuple(int(c) for c in np.histogram(z, bins=10, range=(0, 1))[0]),
    )


def main(argv: list[str] | None = None) -> int:
    """Print the calibration figures of the presets (JSON with --json)."""
    ap = argparse.ArgumentParser(
        prog="python -m trace_gym.sim.calibrate", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--preset", choices=sorted(PRESETS), action="append", help="default: all presets"
    )
    ap.add_argument("--tasks", type=int, default=2000, help="pool size for the exact figures")
    ap.add_argument("--mc-prompts", type=int, default=400, help="prompts per Monte-Carlo estimate")
    ap.add_argument("--seed", type=int, default=0, help="task pool seed")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument(
        "--predictor-quality",
        action="store_true",
        help="instead: Spearman / squared error by depth of the predictors on held-out trees",
    )
    ap.add_argument("--prefix-share", type=float, default=0.06, help="with --predictor-quality")
    args = ap.parse_args(argv)
    if args.predictor_quality:
        return _print_quality(args)
    reports = [
        calibrate(name, args.tasks, args.mc_prompts, args.seed) for name in args.preset or PRESETS
    ]
    if args.json:
        print(json.dumps([asdict(r) for r in reports], indent=2))
        return 0
    print(
        f"{'preset':9} {'grpo8 exact':>11} {'grpo8 MC':>9} {'rand-branch MC':>14} {'mean p':>7} {'p<.1':>6} {'p>.9':>6}"
    )
    for r in reports:
        print(
            f"{r.preset:9} {r.grpo8_exact:11.3f} {r.grpo8_mc:9.3f} {r.random_branching_mc:14.3f} "
            f"{r.mean_success:7.3f} {r.share_below_0_1:6.3f} {r.share_above_0_9:6.3f}"
        )
    return 0


def _print_quality(args: argparse.Namespace) -> int:
    for name in args.preset or PRESETS:
        q = predictor_quality(name, prefix_share=args.prefix_share, seed=args.seed)
        if args.json:
            print(json.dumps({name: q}))
            continue
        for pred, sets in q.items():
            for which, by_depth in sets.items():
                cells = "  ".join(
                    f"d{d}: {v['spearman']:+.2f}/{v['spearman_within']:+.2f}/{v['mse']:.3f}"
                    for d, v in by_depth.items()
                )
                print(f"{name:9} {pred:10} {which:10} {cells}")
    print("cells: depth: Spearman / within-prompt Spearman / squared error, against true values")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
