"""Calibration figures of the simulator presets, on *non-adaptive* baselines only.

The baselines (GRPO-8 exact and Monte-Carlo, random-branching trees) live in
`trace_gym.sim.baselines`; the exact resolved share and depth figures in
`trace_gym.sim.exact`; the U-shape is the share of prompts with Z_0 below 0.1 or
above 0.9.

``trace-gym sim-calibrate [--preset NAME] [--tasks N] [--mc-prompts N] [--json PATH]``
prints the figures that docs/sim.md records; ``--fit`` runs the deterministic search of
`trace_gym.sim.fit`, which looks at these baseline figures only.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trace_gym.cli import Parser
from trace_gym.errors import ConfigError
from trace_gym.sim.baselines import (
    grpo_effective_ratio,
    grpo_effective_ratio_mc,
    random_branching_effective_ratio,
)
from trace_gym.sim.exact import preset_stats
from trace_gym.sim.model import pool_values
from trace_gym.sim.presets import PRESETS, SimPreset, get_preset

__all__ = [
    "CalibrationReport",
    "calibrate",
    "grpo_effective_ratio",
    "grpo_effective_ratio_mc",
    "main",
    "DEFAULT_REPORT",
    "random_branching_effective_ratio",
]


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
    #: exact: share of Z_0 (1 - Z_0) resolved by moves (prompts with 0.1 < Z_0 < 0.9)
    resolved_share: float = 0.0
    #: exact, by depth: E[Z (1 - Z)] over the prefixes there (the floor of any predictor's
    #: squared error against the outcome), mean |Z - Z_0|, share with |Z - Z_0| > 0.2
    attainable_mse_by_depth: dict[int, float] = field(default_factory=dict)
    spread_by_depth: dict[int, float] = field(default_factory=dict)
    far_share_by_depth: dict[int, float] = field(default_factory=dict)


def calibrate(
    preset: str | SimPreset, num_tasks: int = 2000, mc_prompts: int = 400, seed: int = 0
) -> CalibrationReport:
    """All calibration figures of a preset (exact where possible, Monte-Carlo otherwise)."""
    p = get_preset(preset)
    z = pool_values(p, num_tasks, seed)
    st = preset_stats(p, min(num_tasks, 1000), seed)
    return CalibrationReport(
        preset=p.name,
        grpo8_exact=grpo_effective_ratio(p, num_tasks, seed),
        grpo8_mc=grpo_effective_ratio_mc(p, mc_prompts, seed),
        random_branching_mc=random_branching_effective_ratio(p, mc_prompts, seed),
        mean_success=float(z.mean()),
        share_below_0_1=float(np.mean(z < 0.1)),
        share_above_0_9=float(np.mean(z > 0.9)),
        histogram=tuple(int(c) for c in np.histogram(z, bins=10, range=(0, 1))[0]),
        resolved_share=st.resolved_share,
        attainable_mse_by_depth=st.attainable_mse_by_depth,
        spread_by_depth=st.spread_by_depth,
        far_share_by_depth=st.far_share_by_depth,
    )


#: the presets reported when none is named: the defaults and the v1 (luck) ones
DEFAULT_REPORT = ("math", "hotpotqa", "bfcl", "math-luck", "hotpotqa-luck", "bfcl-luck")


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="trace-gym sim-calibrate", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        action="append",
        help="default: the defaults and the luck presets",
    )
    ap.add_argument("--tasks", type=int, default=2000, help="pool size for the exact figures")
    ap.add_argument("--mc-prompts", type=int, default=400, help="prompts per Monte-Carlo estimate")
    ap.add_argument("--seed", type=int, default=0, help="task pool seed")
    ap.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the figures as JSON here",
    )
    ap.add_argument(
        "--fit", action="store_true", help="instead: fit the v2 families (baseline targets only)"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="with --fit: write the fitted module here (default: print it)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    """Print the calibration figures of the presets (or fit the v2 families with --fit)."""
    args = _parser().parse_args(argv)
    try:
        if args.tasks < 1 or args.mc_prompts < 1:
            raise ConfigError(
                f"need --tasks >= 1 and --mc-prompts >= 1, got {args.tasks}, {args.mc_prompts}"
            )
        if args.fit:
            return _fit(args)
        names = args.preset or list(DEFAULT_REPORT)
        reports = [calibrate(n, args.tasks, args.mc_prompts, args.seed) for n in names]
    except ConfigError as e:
        print(f"trace-gym sim-calibrate: {e}", file=sys.stderr)
        return 2
    print(
        f"{'preset':14} {'grpo8 exact':>11} {'grpo8 MC':>9} {'rand-branch MC':>14} {'mean p':>7} {'p<.1':>6} {'p>.9':>6} {'resolved':>8}  attainable MSE by depth"
    )
    for n, r in zip(names, reports, strict=True):
        mse = " ".join(f"{v:.3f}" for v in r.attainable_mse_by_depth.values())
        print(
            f"{n:14} {r.grpo8_exact:11.3f} {r.grpo8_mc:9.3f} {r.random_branching_mc:14.3f} "
            f"{r.mean_success:7.3f} {r.share_below_0_1:6.3f} {r.share_above_0_9:6.3f} {r.resolved_share:8.3f}  {mse}"
        )
    if args.json is not None:
        out = {n: asdict(r) for n, r in zip(names, reports, strict=True)}
        args.json.write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    return 0


def _fit(args: argparse.Namespace) -> int:
    from trace_gym.sim.fit import fit_family, fitted_source

    src = fitted_source(fit_family())
    if args.out is None:
        print(src, end="")
    else:
        args.out.write_text(src)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
