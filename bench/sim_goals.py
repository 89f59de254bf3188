"""The simulator-v2 goal table as one command: ``python -m trace_gym.bench.sim_goals OUT_DIR``.

Runs the `bench alloc` invocations of the pre-registered protocol (docs/sim.md,
"Benchmark protocol") one after another, each writing ``OUT_DIR/<name>.json``, then
prints one line per goal. ``--only NAME,...`` runs a subset; ``--seeds``/``--steps``
override the protocol's (say so when you report such figures). ``--seed-base B`` runs
seeds B..B+K-1 (tuning: 0-4; the final figures: 100-104); ``--predictor`` is the
predictor every policy learns (default ``clue``, the protocol's since issue 25).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from trace_gym.cli import Parser

#: runs with their own step count (the others take --steps, protocol 4)
STEPS = {"math-12": 12}
#: name -> (bench alloc arguments, seeds); every run adds COMMON: fresh prompts, M=128, N=2
COMMON = "--roots 128 --replays 2"
RUNS: dict[str, tuple[str, int]] = {
    "math": (
        "--preset math --policies grpo,treepo,trace,oracle --reference "
        "--noisy-curve 0.95,0.9,0.8,0.7 --oracle-predictor-row",
        5,
    ),
    "hotpotqa": (
        "--preset hotpotqa --policies treepo,trace_roots_random_prefixes,"
        "uniform_roots_trace_prefixes,trace,oracle --reference "
        "--shapes 512x2,512x6,1024x2 --scale 0.25 --oracle-prefix-ablation",
        5,
    ),
    "math-12": ("--preset math --policies grpo,trace --reference", 5),
    "hotpotqa-prefix-share-0.3": ("--preset hotpotqa --policies trace --prefix-share 0.3", 5),
    "bfcl": ("--preset bfcl --policies grpo,treepo,trace,oracle", 2),
    "math-drift": ("--preset math --drift --policies grpo,treepo,trace", 5),
    "math-revisit": ("--preset math --revisit --policies grpo,treepo,trace", 5),
    **{
        f"math-{r}": ("--preset math-" + r + " --policies grpo,trace,oracle", 2)
        for r in ("luck", "r02", "r04", "r08")
    },
    **{
        f"hotpotqa-{r}": (
            "--preset hotpotqa-" + r + " --policies treepo,trace_roots_random_prefixes,trace",
            2,
        )
        for r in ("luck", "r02", "r04", "r08")
    },
}


def main(argv: list[str] | None = None) -> int:
    from trace_gym.bench.alloc import main as bench_main

    ap = Parser(prog="python -m trace_gym.bench.sim_goals", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder for the JSON summaries")
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(RUNS)}")
    ap.add_argument("--seeds", type=int, default=None, help="override every run's seeds")
    ap.add_argument("--steps", type=int, default=4, help="steps per run (protocol: 4)")
    ap.add_argument("--seed-base", type=int, default=0, help="first seed (final figures: 100)")
    ap.add_argument("--predictor", default="clue", help="predictor of every run (default clue)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        print(
            f"sim_goals: unknown run(s) {', '.join(unknown)}; known: {', '.join(RUNS)}",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        extra, seeds = RUNS[name]
        path = args.out / f"{name}.json"
        steps = STEPS.get(name, args.steps)
        cmd = (
            f"{COMMON} {extra} --seeds {args.seeds or seeds} --seed-base {args.seed_base} "
            f"--steps {steps} --predictor {args.predictor} --no-progress --json {path}"
        )
        t0 = time.time()
        print(f"== {name}: trace-gym bench alloc {cmd}", flush=True)
        rc = bench_main(cmd.split())
        if rc:
            return rc
        goals = json.loads(path.read_text())["goals"]
        print(
            f"== {name}: {time.time() - t0:.0f} s; "
            + "; ".join(
                f"[{'met' if g['met'] else 'report' if g['met'] is None else 'NOT met'}] {g['measured']}"
                for g in goals
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
