"""`trace-gym bench async`: steps per hour of asynchronous rollouts against the synchronous loop.

One run measures every ``--staleness`` k (default 0, 1, 2) side by side, on two backends:

- ``sim``: the simulator's policy (`SimPolicy`) in the local `BranchingRunner`, behind
  `AsyncRollouts` (k = 0 is its synchronous schedule: step s starts once update s - 1 is
  published). Generation waits the engines' heavy-tailed simulated latency
  (``--latency 0.05 --latency-sigma 1.5``: log-normal per conversation, drawn from its
  seed; a policy call - one batched round of the step - waits for its slowest
  conversation, `LatencyPolicy`). The simulator has no trainer worth timing, so the
  **train step is a cost model**: it occupies the trainer's thread for
  ``--train-ratio`` R times the wall its own step's generation took (R = train /
  generation time of a synchronous step; R = 1: they cost the same). The simulator's
  policy does not learn, so every k generates the same trees with the same latency
  draws: the arms are paired.
- ``tiny-ray`` (not in the default run): the same trainer with generation in another
  process - the Ray runner with one env worker and one HF engine actor
  (``rollout.ray_engines = 1``), the weights pushed to the engine by version, the same
  simulated latency as the engine's own (`Latency`, per batched call) - so the producer
  thread in the driver mostly waits on Ray and the update has the driver's GIL.
- ``tiny``: the real `trace_gym.trainers.loop.Trainer` (``rollout.max_staleness = k``)
  on the tiny local Qwen3 (built on this machine, `trace_gym.agents.tiny`) on
  ``trace/Sim-v0``: real HF generation plus the same simulated latency per policy call,
  real updates (old logprobs, AdamW, weight sync, the frozen snapshot per update at
  k >= 1; every unit trains, zero advantage or not). This policy learns, so each k
  generates somewhat different trees (its ``gen s`` shows how much). Its train / generation ratio is what it is on this machine (reported);
  ``--tiny-epochs`` (PPO epochs per update) makes the real train step costlier.

Per (backend, k): ``steps_per_hour`` over the whole run (pipeline fill included: the first
k steps cannot overlap), ``ratio_vs_sync`` (the same backend's k = 0 wall over this k's;
with ``--repeats n`` every k runs n times, interleaved, and the rows give the median wall
and the median of the per-round ratios, each k against the k = 0 run of its own round),
the trainer's mean wait for trees and the producer's mean generation wall. The best a
fixed lag can do is (1 + R) / max(1, R): a ratio of 1.5 needs R >= 0.5.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trace_gym.cli import Parser
from trace_gym.errors import ConfigError

__all__ = ["AsyncBenchConfig", "format_async_bench", "main", "run_async_bench"]

BACKENDS = ("sim", "tiny", "tiny-ray")


@dataclass
class AsyncBenchConfig:
    """One comparison (CLI: `trace-gym bench async`)."""

    backends: tuple[str, ...] = ("sim", "tiny")
    staleness: tuple[int, ...] = (0, 1, 2)
    #: steps per (backend, k), all timed (the first k cannot overlap: part of the price)
    steps: int = 12
    #: runs of every k, interleaved (0, 1, 2, 0, 1, 2, ...); the median is reported
    repeats: int = 1
    #: steps of the tiny-model rows (slower on these cores)
    tiny_steps: int = 6
    #: PPO epochs per update of the tiny rows (more epochs: a costlier train step)
    tiny_epochs: int = 1
    #: mean simulated latency of one conversation's turn, seconds
    latency_s: float = 0.05
    #: log-normal sigma of that latency (0: fixed)
    latency_sigma: float = 1.5
    #: simulator rows: a train step costs R x its own step's generation wall
    train_ratio: float = 1.0
    preset: str = "math"
    #: M of the simulator rows
    root_budget: int = 32
    replays_per_root: float = 2.0
    candidates: int = 16
    #: most conversations per policy call (None: one call per round)
    max_batch: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [b for b in self.backends if b not in BACKENDS]
        if bad or not self.backends:
            raise ConfigError(f"--backends takes {' / '.join(BACKENDS)}, got {bad}")
        if not self.staleness or min(self.staleness) < 0 or 0 not in self.staleness:
            raise ConfigError(
                f"--staleness needs 0 (the synchronous reference) and values >= 0, got {self.staleness}"
            )
        if (
            min(self.steps, self.tiny_steps, self.tiny_epochs) < 1
            or self.root_budget < 2
            or self.candidates < 1
        ):
            raise ConfigError(
                "need --steps, --tiny-steps, --tiny-epochs, --repeats, --candidates >= 1, --roots >= 2"
            )
        if self.latency_s < 0 or self.latency_sigma < 0 or self.train_ratio < 0:
            raise ConfigError("--latency, --latency-sigma and --train-ratio must be >= 0")


# ---------------------------------------------------------------------- simulator rows
def _sim_row(cfg: AsyncBenchConfig, k: int) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np

    from trace_gym.alloc import make_allocator
    from trace_gym.async_rollouts import AsyncRollouts
    from trace_gym.distributed.testing import LatencyPolicy
    from trace_gym.predict import make_predictor
    from trace_gym.runner import BranchingRunner, RunnerConfig
    from trace_gym.seeding import stable_seed
    from trace_gym.sim import SimPolicy

    kwargs = {"preset": cfg.preset, "num_tasks": max(64, 4 * cfg.candidates), "seed": cfg.seed}

    def factory() -> Any:
        return gym.make("trace/Sim-v0", **kwargs)

    env = factory()
    ids = [str(t) for t in env.unwrapped.task_ids]
    env.close()

    def candidates(step: int) -> list[str]:
        rng = np.random.default_rng(stable_seed("async-bench", cfg.seed, step))
        return [str(t) for t in rng.choice(ids, cfg.candidates, replace=False)]

    runner = BranchingRunner(
        LatencyPolicy(SimPolicy(cfg.preset), cfg.latency_s, cfg.latency_sigma),
        factory,
        make_allocator("trace"),
        make_predictor("features"),
        RunnerConfig(
            root_budget=cfg.root_budget,
            replays_per_root=cfg.replays_per_root,
            max_batch=cfg.max_batch,
            seed=cfg.seed,
        ),
    )
    gen, waits, train, episodes = [], [], [], 0
    t0 = time.perf_counter()
    try:
        with AsyncRollouts(runner, candidates, max_staleness=k, stop=cfg.steps) as ar:
            for step in range(cfg.steps):
                got = ar.get(step)
                t = time.perf_counter()
                time.sleep(cfg.train_ratio * got.wall_s)  # the train step's cost model
                train.append(time.perf_counter() - t)
                gen.append(got.wall_s)
                waits.append(got.wait_s)
                episodes += got.report.roots + got.report.replays
                ar.publish()
        wall = time.perf_counter() - t0
    finally:
        runner.close()
    return _row("sim", k, wall, cfg.steps, gen, train, waits, episodes=episodes)


def _row(
    backend: str,
    k: int,
    wall: float,
    steps: int,
    gen: list[float],
    train: list[float],
    waits: list[float],
    **extra: Any,
) -> dict[str, Any]:
    g, tr = sum(gen) / len(gen), sum(train) / len(train)
    return {
        "backend": backend,
        "staleness": k,
        "steps": steps,
        "wall_s": wall,
        "step_wall_s": wall / steps,
        "steps_per_hour": 3600.0 * steps / wall,
        "gen_s_mean": g,
        "train_s_mean": tr,
        "train_gen_ratio": tr / g if g else float("nan"),
        "wait_s_mean": sum(waits) / len(waits),
        **extra,
    }


# ---------------------------------------------------------------------- tiny-model rows
def _tiny_config(cfg: AsyncBenchConfig, k: int, out_dir: str, ray: bool = False) -> Any:
    from trace_gym.bench.train import DEFAULT_CONFIG
    from trace_gym.trainers.config import TrainConfig

    d = copy.deepcopy(DEFAULT_CONFIG)
    d.update(steps=cfg.tiny_steps, seed=cfg.seed, out_dir=out_dir, save_every=0, overwrite=True)
    d["rollout"]["max_staleness"] = k
    d["optim"]["epochs"] = cfg.tiny_epochs
    # every unit trains, zero advantage or not: the train step's cost does not hinge on how
    # many groups of a random-ish tiny model happened to be mixed
    d["algo"]["skip_zero_advantage"] = False
    if cfg.max_batch is not None:
        d["rollout"]["max_batch"] = cfg.max_batch
    if ray:  # generation on one engine actor, the latency the engine's own
        d["rollout"].update(ray_address="local", ray_workers=1, ray_engines=1)
        d["rollout"]["ray_options"] = {
            "engine_latency_s": cfg.latency_s,
            "engine_latency_sigma": cfg.latency_sigma,
            "worker_cpus": 0.5,
            "engine_cpus": 0.5,
        }
    return TrainConfig.from_dict(d)


def _tiny_row(cfg: AsyncBenchConfig, k: int, ray: bool = False) -> dict[str, Any]:
    from trace_gym.trainers.loop import Trainer

    from trace_gym.async_rollouts import policy_snapshot
    from trace_gym.distributed.testing import LatencyPolicy

    lat, sigma = cfg.latency_s, cfg.latency_sigma

    class LatencyTrainer(Trainer):
        """The real trainer whose generator waits the simulated latency per policy call."""

        def __init__(self, config: Any):
            super().__init__(config)
            self.runner.policy = LatencyPolicy(self.policy, lat, sigma)  # k = 0's generator

        def _rollout_snapshot(self, policy: Any) -> Any:  # k >= 1's frozen generator
            return LatencyPolicy(policy_snapshot(policy), lat, sigma)

    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        config = _tiny_config(cfg, k, tmp, ray)
        tr = Trainer(config) if ray else LatencyTrainer(config)
        try:
            t0 = time.perf_counter()
            hist = tr.run()
            wall = time.perf_counter() - t0
        finally:
            tr.runner.close()
    return _row(
        "tiny-ray" if ray else "tiny",
        k,
        wall,
        len(hist),
        [m["time_rollout_s"] for m in hist],
        [m["time_train_s"] for m in hist],
        [m.get("time_rollout_wait_s", m["time_rollout_s"]) for m in hist],
        episodes=int(sum(m["roots"] + m["replays"] for m in hist)),
        generated_tokens=int(sum(m["generated_tokens"] for m in hist)),
        samples=int(sum(m.get("samples", 0) for m in hist)),
        staleness_mean=sum(m.get("staleness_mean", 0.0) for m in hist) / len(hist),
    )


# ---------------------------------------------------------------------- the bench
def _merge(runs: list[dict[str, Any]], sync: list[dict[str, Any]]) -> dict[str, Any]:
    """One k's repeats: the median wall, and the median of the ratios to the synchronous
    run of the same round (run next to it in time)."""
    import numpy as np

    walls = [r["wall_s"] for r in runs]
    ratios = [s["wall_s"] / r["wall_s"] for s, r in zip(sync, runs, strict=True)]
    row = {**runs[0]}
    for key in ("gen_s_mean", "train_s_mean", "wait_s_mean"):
        row[key] = float(np.mean([r[key] for r in runs]))
    row["train_gen_ratio"] = row["train_s_mean"] / row["gen_s_mean"] if row["gen_s_mean"] else 0.0
    row["wall_s"] = float(np.median(walls))
    row["step_wall_s"] = row["wall_s"] / row["steps"]
    row["steps_per_hour"] = 3600.0 * row["steps"] / row["wall_s"]
    row["ratio_vs_sync"] = float(np.median(ratios))
    row.update(repeats=len(runs), walls_s=walls, ratios_vs_sync=ratios)
    return row


def _backend_row(cfg: AsyncBenchConfig, backend: str, k: int) -> dict[str, Any]:
    if backend == "sim":
        return _sim_row(cfg, k)
    return _tiny_row(cfg, k, ray=backend == "tiny-ray")


def run_async_bench(cfg: AsyncBenchConfig) -> dict[str, Any]:
    """Every (backend, k) row (`repeats` runs each, interleaved) with its ratio to the same
    backend's synchronous row."""
    import torch

    load_start = os.getloadavg()

    torch.set_num_threads(1)  # the producer and the trainer share the cores: one each
    rows = []
    for backend in cfg.backends:
        runs: dict[int, list[dict[str, Any]]] = {k: [] for k in cfg.staleness}
        for _ in range(cfg.repeats):  # k interleaved: a change of load hits every k alike
            for k in cfg.staleness:
                runs[k].append(_backend_row(cfg, backend, k))
        rows += [_merge(runs[k], runs[0]) for k in cfg.staleness]
    goal = [r for r in rows if r["staleness"] == 1]
    return {
        "config": asdict(cfg),
        "load_start": load_start,
        "load": os.getloadavg(),
        "rows": rows,
        "goals": [
            {
                "goal": f"{r['backend']}: staleness 1 >= 1.5x the synchronous steps per hour",
                "value": r["ratio_vs_sync"],
                "met": r["ratio_vs_sync"] >= 1.5,
            }
            for r in goal
        ],
        "bound_sim": (1 + cfg.train_ratio) / max(1.0, cfg.train_ratio),
    }


def format_async_bench(rep: dict[str, Any]) -> str:
    c = rep["config"]
    lines = [
        f"latency {c['latency_s']:g} s, log-normal sigma {c['latency_sigma']:g}; sim train "
        f"ratio R {c['train_ratio']:g} (fixed-lag bound {rep['bound_sim']:.2f}x); load "
        + " ".join(f"{x:.2f}" for x in rep["load"]),
        f"{'backend':8} {'k':>2} {'steps':>5} {'wall s':>8} {'steps/h':>9} {'x sync':>7} "
        f"{'gen s':>7} {'train s':>7} {'train/gen':>9} {'wait s':>7}",
    ]
    for r in rep["rows"]:
        lines.append(
            f"{r['backend']:8} {r['staleness']:>2} {r['steps']:>5} {r['wall_s']:>8.2f} "
            f"{r['steps_per_hour']:>9.0f} {r['ratio_vs_sync']:>7.2f} {r['gen_s_mean']:>7.3f} "
            f"{r['train_s_mean']:>7.3f} {r['train_gen_ratio']:>9.2f} {r['wait_s_mean']:>7.3f}"
        )
    for g in rep["goals"]:
        lines.append(f"goal: {g['goal']}: {g['value']:.2f}x -> {'met' if g['met'] else 'not met'}")
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise ConfigError(f"--staleness takes comma-separated ints, got {text!r}") from None


def _parser() -> Parser:
    p = Parser(prog="trace-gym bench async", description=__doc__.split("\n")[0])
    d = AsyncBenchConfig()
    p.add_argument(
        "--backends", default=",".join(d.backends), help="sim, tiny, tiny-ray (comma-separated)"
    )
    p.add_argument("--staleness", default="0,1,2", help="max_staleness values; 0 is required")
    p.add_argument("--steps", type=int, default=d.steps, help="steps per simulator row")
    p.add_argument(
        "--repeats", type=int, default=d.repeats, help="runs per k, interleaved; medians reported"
    )
    p.add_argument("--tiny-steps", type=int, default=d.tiny_steps, help="steps per tiny row")
    p.add_argument(
        "--tiny-epochs",
        type=int,
        default=d.tiny_epochs,
        help="PPO epochs per update of the tiny rows (a costlier real train step)",
    )
    p.add_argument("--latency", type=float, default=d.latency_s, help="mean seconds per turn")
    p.add_argument("--latency-sigma", type=float, default=d.latency_sigma)
    p.add_argument(
        "--train-ratio",
        type=float,
        default=d.train_ratio,
        help="sim rows: a train step costs R x its step's generation wall",
    )
    p.add_argument("--preset", default=d.preset)
    p.add_argument("--roots", type=int, default=d.root_budget)
    p.add_argument("--replays", type=float, default=d.replays_per_root)
    p.add_argument("--candidates", type=int, default=d.candidates)
    p.add_argument("--max-batch", type=int, default=None)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = AsyncBenchConfig(
            backends=tuple(b for b in args.backends.split(",") if b),
            staleness=_ints(args.staleness),
            steps=args.steps,
            repeats=args.repeats,
            tiny_steps=args.tiny_steps,
            tiny_epochs=args.tiny_epochs,
            latency_s=args.latency,
            latency_sigma=args.latency_sigma,
            train_ratio=args.train_ratio,
            preset=args.preset,
            root_budget=args.roots,
            replays_per_root=args.replays,
            candidates=args.candidates,
            max_batch=args.max_batch,
            seed=args.seed,
        )
        from trace_gym.sim import PRESETS

        if cfg.preset not in PRESETS:
            raise ConfigError(f"--preset must be one of {', '.join(PRESETS)}, got {cfg.preset!r}")
        rep = run_async_bench(cfg)
    except ConfigError as e:
        print(f"trace-gym bench async: {e}", file=sys.stderr)
        return 2
    print(format_async_bench(rep))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rep, indent=1))
    return 0
