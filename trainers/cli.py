"""`trace-gym train --config FILE`: run a training config (TOML, YAML or JSON).

Under torchrun (``torchrun --nproc-per-node N -m trace_gym.cli train --config FILE``) every
process runs this command and the run is sharded with FSDP2 (`trace_gym.trainers.sharding`).
"""

from __future__ import annotations

import json
import logging
import shlex
import sys

from trace_gym.cli import Parser
from trace_gym.errors import ConfigError

__all__ = ["interrupted_message", "main", "parse_value"]


def parse_value(text: str):
    """Parse an override value as JSON when it is JSON (numbers, booleans, lists), else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


#: the last step's figures `main` prints
SUMMARY_KEYS = (
    "step",
    "reward",
    "effective_ratio",
    "mixed_groups",
    "contrastive_pairs",
    "loss",
    "kl",
    "entropy",
)


def _print_last(last: dict) -> None:
    """The last step's summary line (and, for a mixture, its per-env figures)."""
    print(json.dumps({k: last.get(k) for k in SUMMARY_KEYS}))
    per_env = {k: v for k, v in last.items() if k.startswith("env/")}
    if per_env:
        print(json.dumps(per_env))


def interrupted_message(stopped, argv: list[str]) -> str:
    """One line for a run a Ctrl-C stopped (`trace_gym.trainers.loop.Interrupted`): what
    was kept and the command that resumes it (this one, without ``--overwrite`` or a
    ``resume`` override, with ``--set resume=true``)."""
    args, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--overwrite":
            i += 1
            continue
        if a == "--set" and i + 1 < len(argv) and argv[i + 1].split("=")[0].strip() in _FRESH:
            i += 2
            continue
        args.append(a)
        i += 1
    cmd = shlex.join(["trace-gym", "train", *args, "--set", "resume=true"])
    return (
        f"trace-gym train: interrupted; kept steps 0-{stopped.step - 1} in {stopped.checkpoint}; "
        f"resume with: {cmd}"
    )


#: overrides that would make the resume command start over
_FRESH = ("resume", "overwrite")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="trace-gym train", description=__doc__)
    p.add_argument(
        "--config", required=True, help="config file (.toml, .yaml, .json); see configs/"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set algo.name=grpo --set steps=5",
    )
    p.add_argument("--out-dir", help="shortcut for --set out_dir=...")
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an --out-dir that holds an earlier run (deletes its metrics, "
        "checkpoints, trees, TensorBoard logs)",
    )
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="also resume from an old pickle-format checkpoint (runs its code: only your own)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)

    from trace_gym.trainers.config import load_config

    overrides = {}
    for item in args.set:
        if "=" not in item:
            print(f"trace-gym train: --set needs KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        k, v = item.split("=", 1)
        overrides[k.strip()] = parse_value(v)
    if args.out_dir:
        overrides["out_dir"] = args.out_dir
    if args.overwrite:
        overrides["overwrite"] = True
    if args.trust_checkpoint:
        overrides["trust_checkpoint"] = True
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"trace-gym train: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    return _train(cfg, sys.argv[1:] if argv is None else argv)


def _train(cfg, argv: list[str]) -> int:
    """Run `cfg`; print the last step's summary, or what a Ctrl-C kept (exit 130)."""
    from trace_gym.trainers.sharding import make_trainer

    # sharded (FSDP2) when torchrun started this process, see docs/distributed.md
    trainer = make_trainer(cfg)
    try:
        history = trainer.run()
    finally:
        if hasattr(trainer, "close"):
            trainer.close()
    if getattr(getattr(trainer, "dist", None), "rank", 0) != 0:
        return 130 if trainer.interrupted else 0
    if trainer.interrupted is not None:
        print(interrupted_message(trainer.interrupted, argv), file=sys.stderr)
        return 130
    if history:
        _print_last(history[-1])
    print(f"metrics: {cfg.out_dir}/metrics.jsonl  checkpoints: {cfg.out_dir}/checkpoints")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
