"""Quality by depth of learned predictors trained on random-branching simulator trees.

``python -m trace_gym.sim.quality [--preset NAME] [--prefix-share X] [--json]`` prints,
per predictor and depth, Spearman / within-prompt Spearman / squared error against the
exact values. Kept apart from `trace_gym.sim.calibrate`, which may not import predictors.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from trace_gym.cli import Parser
from trace_gym.sim.presets import PRESETS, SimPreset

__all__ = ["main", "predictor_quality"]


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
    kw: dict[str, Any] = dict(
        num_tasks=n, pool_seed=seed, roots=roots, replays_per_root=replays_per_root
    )
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


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m trace_gym.sim.quality", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--preset", choices=sorted(PRESETS), action="append", help="default: math, hotpotqa, bfcl"
    )
    ap.add_argument(
        "--prefix-share", type=float, default=0.06, help="prefix share of predictor batches"
    )
    ap.add_argument("--seed", type=int, default=0, help="task pool seed")
    ap.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = ap.parse_args(argv)
    args.preset = args.preset or ["math", "hotpotqa", "bfcl"]
    return _print_quality(args)


def _print_quality(args: argparse.Namespace) -> int:
    for name in args.preset:
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
