"""TRACE rollouts inside TRL's `GRPOTrainer`: our runner collects, TRL updates.

TRL (>= 1.16) offers two extension points that fit, and this module uses only those:

- ``rollout_func(prompts, trainer) -> dict`` (`GRPOTrainer(rollout_func=...)`): called
  once per generation batch with the batch's ``prompt`` column; it must return
  ``prompt_ids``, ``completion_ids`` and ``logprobs`` (one row per input row); extra keys
  go to the reward functions, and ``env_mask`` (1 = model token, 0 = env token) becomes
  TRL's per-token loss mask;
- ``reward_funcs``: callables ``f(prompts, completions, **columns) -> list[float]``, also
  handed ``log_metric`` (scalars that TRL logs with its own metrics).

How one TRL generation batch runs (`TraceRollout.__call__`):

1. TRL's sampler draws ``generation_batch_size / num_generations`` distinct prompts, each
   repeated ``num_generations`` (G) times. The dataset's ``prompt`` column holds *task
   ids* (`task_dataset`); the env renders the prompt itself.
2. Those distinct task ids are the step's candidates. `BranchingRunner.run_step`
   (TRACE by default) allocates the root budget M over them - most get 0 rollouts, a
   selected prompt gets 2..m_max, the *group sizes* - runs the roots, then replays from
   restored prefix checkpoints (round(N * M) replays), and closes one tree per selected
   prompt. Generation uses `trace_gym.agents.hf.HFPolicy` on **the very module TRL
   trains** (rebound to ``trainer.model`` at every call), in eval mode.
3. Our advantage function (``advantage``: treerpo, tree_grpo, grpo, ...) turns the trees
   into `TrainUnit` s; each becomes one TRL row: ``prompt_ids`` = the tree's prompt tokens,
   ``completion_ids`` = every token after them up to the unit's last turn (earlier turns
   and env observations included), ``env_mask`` = 1 exactly on the unit's own generated
   tokens (`trace_gym.trainers.data.sample_from_unit`'s loss mask).
4. The advantages reach TRL's loss **exactly**, through the reward interface. TRL turns
   rewards into advantages as ``r - mean(r over a block of G consecutive rows)`` (with
   ``scale_rewards="none"``, which `check_grpo_args` requires; any std scaling would
   rescale them). `pack_rows` fills each block with at most G - 1 units and one
   *balance row* whose reward is minus the sum of the block's advantages, so every
   block's mean is 0 and TRL's advantage of a unit row is our advantage (float32
   rounding aside). The balance row and the empty rows are one masked token
   (``env_mask`` 0): no gradient, no token in ``dapo``/``bnpo`` normalisers. A unit's
   weight (``prompt_weight="roots"``: m / U) is folded into its advantage, which is exact
   for TRL's clipped, cispo and sapo objectives (each is linear in A at fixed sign).
5. ``trace/*`` scalars (roots, replays, selected prompts, group sizes min/mean/max, env
   reward, effective ratio, units, dropped units, accounted cost) go to TRL's logs via
   ``log_metric``; the per-prompt allocation of every step is appended to
   ``<output_dir>/trace_allocation.jsonl`` and logged at INFO.

What TRL's loss therefore sees: per-row advantages equal to our tree-aware ones, the
unit's tokens as the trained tokens, TRL's own clipped objective (``epsilon``,
``epsilon_high``, ``loss_type``; no dual clip), TRL's recomputed logprobs at
``args.temperature`` (which must equal the policy's) and TRL's optimiser, scheduler and
checkpoints. Without the balance rows - returning raw leaf rewards and letting TRL
normalise - TRL would centre over fixed blocks of G rows, which cannot represent TRACE's
variable groups (2..m_max root rollouts plus replays per prompt): a prompt's leaves would
be split across blocks or mixed with another prompt's, so that mode is not offered.

Limits: TRL's logged ``reward``/``rewards/trace_advantage/*`` are the packed advantages
(mean 0 by construction); the env reward is ``trace/reward``. The ``prompt`` TRL logs
with a row is the sampler's row, not necessarily the unit's prompt. A batch holds at most
``(B / G) * (G - 1)`` units (B rows); extra units, smallest |advantage| first, are
dropped and counted (``trace/dropped_units``) - size ``per_device_train_batch_size``
for M(1 + 2N) units. ``loss_type="grpo"`` averages over rows, so balance/empty rows
scale its loss by (unit rows / B); ``dapo`` (TRL's default) does not.

Several processes (``accelerate launch``): the candidates are the distinct prompts of the
*global* batch (every rank's slice, all-gathered), the runner is a
`trace_gym.distributed.ranks.RankShardedRunner` (the same allocation of the one budget M
on every rank; rank r grows its share of the trees; all trees gathered), the rows are
packed over the global batch and each rank returns its slice, so TRL's gathered rewards
are one process's (docs/distributed.md, "TRL across processes").
`make_grpo_trainer` adds `runner_state_callback`, so TRL's checkpoints also hold the
runner's predictor state and visit histories and a resumed run restores them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from trace_gym.trainers.advantages import ADVANTAGES, PROMPT_WEIGHTS, compute_advantages
from trace_gym.trainers.config import FLAT_RUNNER_KEYS, runner_table, takes_flat_runner_keys
from trace_gym.trainers.data import sample_from_unit

from trace_gym.core import unwrap
from trace_gym.errors import ConfigError, unknown
from trace_gym.optional import require
from trace_gym.runner import RunnerConfig
from trace_gym.tree import RolloutTree, batch_metrics

__all__ = [
    "Row",
    "TRLRolloutConfig",
    "TraceRollout",
    "check_grpo_args",
    "global_prompts",
    "make_grpo_trainer",
    "pack_rows",
    "runner_state_callback",
    "task_dataset",
    "trace_advantage",
]

log = logging.getLogger(__name__)

#: the file (under TRL's output_dir) that gets one JSON line per generation batch
ALLOCATION_FILE = "trace_allocation.jsonl"


#: the runner settings `TRLRolloutConfig` takes as keyword arguments of its own
TRL_FLAT_KEYS = (*FLAT_RUNNER_KEYS, "seed")


@takes_flat_runner_keys(TRL_FLAT_KEYS, "TRLRolloutConfig")
@dataclass
class TRLRolloutConfig:
    """What `TraceRollout` collects per TRL generation batch and how it scores it.

    `runner` is the trainer's ``[rollout.runner]`` table (`trace_gym.trainers.config.
    runner_table`, the runner's rules): M = ``root_budget`` root rollouts per generation
    batch over its distinct prompts, N = ``replays_per_root`` (0: root rollouts only), and
    every other runner setting. The flat keyword arguments ``root_budget``,
    ``replays_per_root``, ``m_max``, ``replay_cost``, ``max_batch``, ``rollout_cost`` and
    ``seed`` set the same fields (and read them back).
    """

    #: the runner's settings (`trace_gym.runner.RunnerConfig`; root_budget 16 unless set)
    runner: RunnerConfig = field(
        default_factory=lambda: runner_table({}, "TRLRolloutConfig", TRL_FLAT_KEYS)
    )
    allocator: str = "trace"
    allocator_kwargs: dict[str, Any] = field(default_factory=dict)
    #: predictor name or "module:Class" ("" = none: every value 0.5)
    predictor: str = "empirical"
    predictor_kwargs: dict[str, Any] = field(default_factory=dict)
    #: advantage function in `trace_gym.trainers.advantages.ADVANTAGES`
    advantage: str = "treerpo"
    std: bool = True
    eps: float = 1e-6
    prompt_weight: str = "roots"
    #: leave zero-advantage units out (they would only take rows)
    skip_zero_advantage: bool = True
    #: longer units are dropped (and counted)
    max_seq_len: int = 8192

    def __post_init__(self) -> None:
        from trace_gym.alloc import allocator_class

        self.runner = runner_table(self.runner, "TRLRolloutConfig", TRL_FLAT_KEYS)
        allocator_class(self.allocator)  # a registered name, an entry point or "module:Class"
        if self.advantage not in ADVANTAGES:
            raise unknown("optimiser", self.advantage, ADVANTAGES)
        if self.prompt_weight not in PROMPT_WEIGHTS:
            raise ConfigError(
                f"prompt_weight must be one of {PROMPT_WEIGHTS}, got {self.prompt_weight!r}"
            )
        if self.max_seq_len < 2:
            raise ConfigError(f"max_seq_len must be >= 2, got {self.max_seq_len}")

    def runner_config(self) -> RunnerConfig:
        """The runner's settings (`runner`)."""
        return self.runner


@dataclass
class Row:
    """One TRL row: prompt and completion token ids, loss mask, sampling logprobs, reward."""

    prompt_ids: list[int]
    completion_ids: list[int]
    #: 1 on the completion tokens TRL trains (the unit's own generated tokens)
    env_mask: list[int]
    logprobs: list[float]
    #: the reward TRL sees: the unit's advantage x weight (balance rows: minus a block's sum)
    reward: float
    #: (tree index, node ids) of the unit; None for balance and empty rows
    unit: tuple[int, tuple[int, ...]] | None = None


def unit_rows(
    trees: Sequence[RolloutTree], cfg: TRLRolloutConfig
) -> tuple[list[Row], dict[str, float]]:
    """One `Row` per trained unit of the trees (zero-advantage and over-long units dropped)."""
    units = compute_advantages(
        cfg.advantage, trees, std=cfg.std, eps=cfg.eps, prompt_weight=cfg.prompt_weight
    )
    n_units = len(units)
    if cfg.skip_zero_advantage:
        units = [u for u in units if abs(u.advantage * u.weight) > 1e-8]
    rows, too_long = [], 0
    for u in units:
        s = sample_from_unit(trees[u.tree], u)
        if len(s.input_ids) > cfg.max_seq_len:
            too_long += 1
            continue
        p = len(trees[u.tree].prompt_token_ids or ())
        if s.num_trained == 0:
            continue
        rows.append(
            Row(
                s.input_ids[:p],
                s.input_ids[p:],
                s.loss_mask[p:],
                s.gen_logprobs[p:],
                float(u.advantage * u.weight),
                (u.tree, u.nodes),
            )
        )
    return rows, {"units": float(n_units), "dropped_too_long": float(too_long)}


def pack_rows(
    rows: Sequence[Row], n_rows: int, group: int, *, pad_id: int, eos_id: int
) -> tuple[list[Row], int]:
    """Lay `rows` out in `n_rows` slots so that TRL's per-block centring is the identity.

    Each block of `group` consecutive slots holds at most ``group - 1`` unit rows and one
    balance row with reward ``-sum(block's rewards)``; the rest are empty rows (reward
    0). Balance and empty rows are prompt ``[pad_id]``, completion ``[eos_id]``, mask 0.
    When there are more unit rows than ``(n_rows // group) * (group - 1)`` slots, the ones
    with the smallest |reward| are dropped; returns (the `n_rows` rows, how many dropped).
    """
    if group < 2 or n_rows % group:
        raise ConfigError(
            f"TRL's batch of {n_rows} rows is not whole groups of num_generations={group}"
        )
    per_block = group - 1
    capacity = (n_rows // group) * per_block
    keep = list(range(len(rows)))
    if len(rows) > capacity:  # drop the least informative units, keep the rest in order
        keep = sorted(sorted(keep, key=lambda i: -abs(rows[i].reward))[:capacity])
    kept = [rows[i] for i in keep]
    out: list[Row] = []
    for b in range(n_rows // group):
        block = kept[b * per_block : (b + 1) * per_block]
        fill = [_filler(pad_id, eos_id, -sum(r.reward for r in block))]
        fill += [_filler(pad_id, eos_id, 0.0) for _ in range(group - len(block) - 1)]
        out += block + fill
    return out, len(rows) - len(kept)


def global_prompts(prompts: list[Any], world: int) -> list[Any]:
    """The generation batch of every process, in rank order (TRL's gathered order)."""
    if world == 1:
        return list(prompts)
    from trace_gym.distributed.ranks import all_gather

    parts = all_gather(list(prompts))
    if len({len(p) for p in parts}) != 1:
        raise ConfigError(f"the processes hold batches of {[len(p) for p in parts]} prompts")
    return [p for part in parts for p in part]


def _filler(pad_id: int, eos_id: int, reward: float) -> Row:
    return Row([pad_id], [eos_id], [0], [0.0], reward)


def allocation_record(
    step: int, candidates: Sequence[str], trees: Sequence[RolloutTree], report: Any
) -> dict[str, Any]:
    """The step's allocation: root rollouts (group size) and replay episodes per selected prompt."""
    sizes = {t.prompt_id: len(t.root.children) for t in trees}
    replays = {
        t.prompt_id: sum(1 for n in t.leaves(include_failed=True) if n.origin == "replay")
        for t in trees
    }
    return {
        "step": step,
        "candidates": list(candidates),
        "group_sizes": sizes,
        "replays": replays,
        "roots": report.roots,
        "replays_total": report.replays,
        "accounted_cost": report.accounted_cost,
    }


def step_stats(
    record: dict[str, Any], trees: Sequence[RolloutTree], counts: dict[str, float]
) -> dict[str, float]:
    """The ``trace/*`` scalars of one generation batch (without the prefix)."""
    sizes = list(record["group_sizes"].values()) or [0]
    bm = batch_metrics(trees)
    return {
        "candidates": float(len(record["candidates"])),
        "selected_prompts": float(len(record["group_sizes"])),
        "roots": float(record["roots"]),
        "replays": float(record["replays_total"]),
        "accounted_cost": float(record["accounted_cost"]),
        "group_size_min": float(min(sizes)),
        "group_size_mean": float(sum(sizes) / len(sizes)),
        "group_size_max": float(max(sizes)),
        "reward": float(bm["success_rate"]),
        "effective_ratio": float(bm["effective_ratio"]) if trees else 0.0,
        "failed_branches": float(bm["failed_branches"]),
        **counts,
    }


class TraceRollout:
    """TRL's ``rollout_func``: TRACE allocation + BranchingRunner trees -> exact-advantage rows.

    `policy` is an `HFPolicy` (anything with ``.model``, ``.tokenizer``, ``generate``);
    it generates with the module TRL trains. `runner` overrides the `BranchingRunner`
    the config would build (e.g. a Ray runner). After each call, `last_trees`,
    `last_rows` and `last_record` hold what it produced (under several processes: the
    global batch's trees and rows; this rank returned its slice of the rows).
    """

    def __init__(
        self,
        policy: Any,
        env_factory: Callable[[], gym.Env],
        config: TRLRolloutConfig | None = None,
        *,
        allocator: Any = None,
        predictor: Any = None,
        runner: Any = None,
    ):
        from trace_gym.alloc import make_allocator
        from trace_gym.distributed.ranks import RankShardedRunner, rank_world
        from trace_gym.predict import make_predictor
        from trace_gym.runner import BranchingRunner

        self.config = cfg = config or TRLRolloutConfig()
        self.policy = policy
        if runner is None:
            allocator = allocator or make_allocator(
                cfg.allocator, m_max=cfg.m_max, **cfg.allocator_kwargs
            )
            if predictor is None and cfg.predictor:
                predictor = make_predictor(cfg.predictor, **cfg.predictor_kwargs)
            # under accelerate / torchrun the ranks share one step's prompts (RankShardedRunner)
            cls = RankShardedRunner if rank_world()[1] > 1 else BranchingRunner
            runner = cls(policy, env_factory, allocator, predictor, cfg.runner_config())
        self.runner = runner
        self.last_trees: list[RolloutTree] = []
        self.last_rows: list[Row] = []
        self.last_record: dict[str, Any] = {}

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        group = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        rank, world = self._ranks(trainer)
        every = global_prompts(prompts, world)  # TRL's global batch: rank 0's rows first
        if len(every) % group:
            raise ConfigError(
                f"TRL passed {len(every)} prompts over {world} process(es), not whole groups "
                f"of num_generations={group}"
            )
        candidates = list(dict.fromkeys(str(p) for p in every))
        step = int(trainer.state.global_step)
        trees, report = self._collect(trainer, step, candidates)
        rows, counts = unit_rows(trees, self.config)
        tok = self.policy.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        eos = tok.eos_token_id if tok.eos_token_id is not None else pad
        # packed over the global batch: TRL centres the gathered rewards in blocks of G
        packed, dropped = pack_rows(rows, len(every), group, pad_id=pad, eos_id=eos)
        mine = packed[rank * len(prompts) : (rank + 1) * len(prompts)]
        record = allocation_record(step, candidates, trees, report)
        stats = step_stats(
            record,
            trees,
            {
                **counts,
                "unit_rows": float(len(rows) - dropped),
                "dropped_units": float(dropped),
                "rows": float(len(packed)),
            },
        )
        self._write_record(
            trainer, {**record, **{k: stats[k] for k in ("reward", "unit_rows", "dropped_units")}}
        )
        self.last_trees, self.last_rows, self.last_record = trees, packed, record
        return {
            "prompt_ids": [r.prompt_ids for r in mine],
            "completion_ids": [r.completion_ids for r in mine],
            "logprobs": [r.logprobs for r in mine],
            "env_mask": [r.env_mask for r in mine],
            "trace_advantage": [r.reward for r in mine],
            "trace_stats": stats,  # not a list: TRL copies it to every row
        }

    def _ranks(self, trainer: Any) -> tuple[int, int]:
        """(rank, processes) of TRL's accelerator; several need a rank-sharded runner."""
        from trace_gym.distributed.ranks import RankShardedRunner

        world = int(trainer.accelerator.num_processes)
        if world > 1 and getattr(self.runner, "world", 1) != world:
            kind = type(self.runner).__name__
            raise ConfigError(
                f"TRL runs {world} processes but the rollout's runner is a {kind} over "
                f"{getattr(self.runner, 'world', 1)}: build TraceRollout after the process "
                f"group is up (GRPOConfig does it), or pass a {RankShardedRunner.__name__}"
            )
        return int(trainer.accelerator.process_index), world

    def _collect(
        self, trainer: Any, step: int, candidates: list[str]
    ) -> tuple[list[RolloutTree], Any]:
        """Run one runner step with the policy on TRL's current module, in eval mode."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self.policy.model is not model:  # e.g. TRL wrapped it with peft: generate with that
            self.policy.model = model
        if hasattr(self.policy, "version"):
            self.policy.version = step
        was_training = model.training
        model.eval()
        try:
            result = self.runner.run_step(step, candidates)
        finally:
            model.train(was_training)
        return result.trees, result.report

    def _write_record(self, trainer: Any, record: dict[str, Any]) -> None:
        log.info(
            "TRACE step %d: group sizes %s, replays %s (%d roots, %d replays)",
            record["step"],
            record["group_sizes"],
            record["replays"],
            record["roots"],
            record["replays_total"],
        )
        if not trainer.accelerator.is_main_process:
            return
        out = Path(trainer.args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / ALLOCATION_FILE, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")


def trace_advantage(
    prompts: list[Any],
    completions: list[Any],
    trace_advantage: list[float] | None = None,
    trace_stats: list[dict[str, float]] | None = None,
    log_metric: Callable | None = None,
    **_: Any,
) -> list[float]:
    """TRL reward function of `TraceRollout` rows: each row's packed advantage.

    Also logs the step's ``trace/*`` scalars through TRL's ``log_metric``.
    """
    if trace_advantage is None:
        raise ConfigError(
            "trace_advantage is the reward of TraceRollout rows; pass rollout_func=TraceRollout(...) "
            "to GRPOTrainer (or build it with make_grpo_trainer)"
        )
    if log_metric is not None and trace_stats:
        for k, v in trace_stats[0].items():
            log_metric(f"trace/{k}", float(v))
    return [float(a) for a in trace_advantage]


def check_grpo_args(args: Any, policy: Any) -> None:
    """Refuse GRPOConfig settings under which TRL's loss would not see our advantages."""
    if args.scale_rewards != "none":
        raise ConfigError(
            f"GRPOConfig.scale_rewards must be 'none' for TRACE rollouts (got {args.scale_rewards!r}): "
            "the adapter passes exact advantages and a std scaling would rescale them"
        )
    if args.multi_objective_aggregation != "sum_then_normalize":
        raise ConfigError(
            "GRPOConfig.multi_objective_aggregation must be 'sum_then_normalize' for TRACE rollouts"
        )
    if args.reward_weights not in (None, [1.0]):
        raise ConfigError(
            f"GRPOConfig.reward_weights must be None (one reward: trace_advantage), got {args.reward_weights}"
        )
    if args.use_vllm:
        raise ConfigError(
            "GRPOConfig.use_vllm must be False: the BranchingRunner's policy generates"
        )
    temp = getattr(getattr(policy, "sampling", None), "temperature", None)
    if temp is not None and abs(float(temp) - float(args.temperature)) > 1e-9:
        raise ConfigError(
            f"GRPOConfig.temperature ({args.temperature}) must equal the policy's sampling temperature "
            f"({temp}): TRL recomputes logprobs at its temperature"
        )


#: the runner's state inside each TRL checkpoint folder (predictor + visit histories):
#: ``trace_runner.safetensors`` + ``trace_runner.json`` (`trace_gym.trainers.state_io`)
RUNNER_STATE_STEM = "trace_runner"
RUNNER_STATE_FILE = "trace_runner.json"
#: what releases before the pickle-free format wrote (loaded only when trusted)
LEGACY_RUNNER_STATE_FILE = "trace_runner.pkl"


def _save_runner_state(folder: Path, blob: dict[str, Any]) -> None:
    """Write `blob` next to TRL's files; the JSON (which `_load_runner_state` looks for) last."""
    from trace_gym.trainers.state_io import save_state, state_files

    tmp_stem = RUNNER_STATE_STEM + ".tmp"
    for tmp, final in zip(
        save_state(folder, tmp_stem, blob), state_files(RUNNER_STATE_STEM), strict=True
    ):
        os.replace(folder / tmp, folder / final)


def _load_runner_state(folder: Path, trusted: bool) -> dict[str, Any] | None:
    """The runner state of a TRL checkpoint folder (None: it has none)."""
    from trace_gym.trainers.state_io import load_legacy, load_state

    if (folder / RUNNER_STATE_FILE).is_file():
        return load_state(folder, RUNNER_STATE_STEM)
    if (folder / LEGACY_RUNNER_STATE_FILE).is_file():
        return load_legacy(folder / LEGACY_RUNNER_STATE_FILE, trusted)
    return None


def runner_state_callback(rollout: TraceRollout, *, trust_checkpoint: bool = False) -> Any:
    """A `transformers.TrainerCallback` that keeps the runner's state in TRL's checkpoints.

    ``on_save`` writes the predictor's ``state_dict()`` and the prompts' visit histories
    to ``<output_dir>/checkpoint-<step>/trace_runner.{safetensors,json}`` (no pickle);
    ``on_train_begin`` of a resumed run (``global_step > 0``) loads them back from the
    checkpoint of that step. An old ``trace_runner.pkl`` is loaded only with
    `trust_checkpoint` (a `ConfigError` says so otherwise).
    """
    transformers = require("transformers", "train")

    class RunnerStateCallback(transformers.TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and folder.is_dir():
                pred = rollout.runner.predictor
                blob = {
                    "predictor": None if pred is None else pred.state_dict(),
                    "history": dict(rollout.runner.history),
                }
                _save_runner_state(folder, blob)

        def on_train_begin(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            blob = None if state.global_step == 0 else _load_runner_state(folder, trust_checkpoint)
            if blob is None:
                return
            if blob["predictor"] is not None and rollout.runner.predictor is not None:
                rollout.runner.predictor.load_state_dict(blob["predictor"])
            rollout.runner.history.clear()
            rollout.runner.history.update(blob["history"])
            log.info(
                "restored the runner's predictor and %d visit histories from %s",
                len(blob["history"]),
                folder,
            )

    return RunnerStateCallback()


def task_dataset(task_ids: Sequence[str]) -> Any:
    """A `datasets.Dataset` whose ``prompt`` column holds task ids (what `TraceRollout` reads)."""
    datasets = require("datasets", "trl")
    if not task_ids:
        raise ConfigError("the task pool is empty")
    return datasets.Dataset.from_dict({"prompt": [str(t) for t in task_ids]})


def make_grpo_trainer(
    policy: Any,
    env_factory: Callable[[], gym.Env],
    args: Any,
    config: TRLRolloutConfig | None = None,
    *,
    task_ids: Sequence[str] | None = None,
    allocator: Any = None,
    predictor: Any = None,
    trust_checkpoint: bool = False,
    **trainer_kwargs: Any,
) -> Any:
    """A TRL `GRPOTrainer` on `policy.model` whose rollouts are TRACE trees.

    `args` is a `trl.GRPOConfig` (checked by `check_grpo_args`); `task_ids` default to
    the env's task pool; `trust_checkpoint` lets a resumed run load an old pickled
    ``trace_runner.pkl``; other keywords (callbacks, peft_config, ...) go to `GRPOTrainer`.
    """
    trl = require("trl", "trl")
    check_grpo_args(args, policy)
    if task_ids is None:
        probe = env_factory()
        task_ids = list(unwrap(probe).task_ids)
        probe.close()
    rollout = TraceRollout(policy, env_factory, config, allocator=allocator, predictor=predictor)
    callbacks = [
        *(trainer_kwargs.pop("callbacks", None) or []),
        runner_state_callback(rollout, trust_checkpoint=trust_checkpoint),
    ]
    return trl.GRPOTrainer(
        model=policy.model,
        reward_funcs=[trace_advantage],
        args=args,
        train_dataset=task_dataset(task_ids),
        processing_class=policy.tokenizer,
        rollout_func=rollout,
        callbacks=callbacks,
        **trainer_kwargs,
    )
