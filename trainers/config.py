"""Training configuration: nested dataclasses, validated at construction, loaded from TOML/YAML/JSON.

Every name (optimiser, allocator, predictor, aggregation, policy kind) is checked in
``__post_init__``, so a typo fails before a model is loaded or a rollout is run. A
config file mirrors the dataclasses: top-level fields plus the tables ``[policy]``,
``[rollout]``, ``[algo]``, ``[optim]``, ``[logging]`` and ``[dist]`` (sharded training); an unknown key
is an error.

The step's own settings are the runner's: ``[rollout.runner]`` is a
`trace_gym.runner.RunnerConfig` (every field but ``seed``, which is the run's), checked by
the runner's rules alone. The six settings older configs write flat in ``[rollout]``
(`FLAT_RUNNER_KEYS`) are still read there (docs/trainers.md).
"""

from __future__ import annotations

import functools
import json
import math
import types
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError, did_you_mean, unknown
from trace_gym.optional import require
from trace_gym.registration import check_env_id
from trace_gym.runner import RunnerConfig

__all__ = [
    "FLAT_RUNNER_KEYS",
    "AlgoConfig",
    "DistConfig",
    "LoggingConfig",
    "OptimConfig",
    "PolicyConfig",
    "RolloutConfig",
    "TrainConfig",
    "load_config",
    "runner_table",
]

POLICY_KINDS = ("tiny", "hf", "vllm", "custom")
DIST_STRATEGIES = ("auto", "fsdp", "none")
DIST_BACKENDS = ("auto", "gloo", "nccl")
DIST_ROLLOUTS = ("all", "rank0")
DTYPES = ("float32", "bfloat16", "float16")


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether `value` (as read from a config file) fits the field annotation `hint`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in args)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # an integer is a fine float; NaN and infinities never are
        return (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
    if hint is str:
        return isinstance(value, str)
    if origin is dict:
        return isinstance(value, dict)
    if origin is list:
        return isinstance(value, (list, tuple)) and all(_type_ok(v, args[0]) for v in value)
    if origin is tuple:  # fixed length, as in betas: tuple[float, float]
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(args)
            and all(_type_ok(v, a) for v, a in zip(value, args, strict=True))
        )
    return isinstance(value, hint) if isinstance(hint, type) else True


def _check_types(obj: Any, where: str) -> None:
    """Refuse a field whose value has the wrong type (``steps = 2.5``, ``lr = nan``)."""
    _check_values(type(obj), {f.name: getattr(obj, f.name) for f in fields(obj)}, where)


def _check_values(cls: type, values: dict[str, Any], where: str) -> None:
    """`_check_types` on the would-be fields `values` of the dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name not in values:
            continue
        value = values[f.name]
        if not _type_ok(value, hints[f.name]):
            hint = hints[f.name]
            name = f.name if where == "config" else f"{where}.{f.name}"
            if f.name in _SECTIONS and where == "config":
                raise ConfigError(f"{name} must be a table ([{name}] in TOML), got {value!r:.60}")
            want = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
            finite = " (a finite number)" if "float" in want else ""
            raise ConfigError(f"{name} must be of type {want}{finite}, got {value!r:.60}")


@dataclass
class PolicyConfig:
    """The policy model, its sampling, and how it is trained (LoRA, checkpointing)."""

    #: "tiny" (trace_gym.agents.tiny, built locally), "hf" (a model dir or hub id in
    #: `path`), "vllm" (a vLLM engine on `path` generates, an HF copy trains; weights are
    #: pushed every step, see trace_gym.trainers.sync) or "custom" (an object passed to
    #: `Trainer(policy=...)`)
    kind: str = "tiny"
    path: str = ""
    #: keyword arguments of `trace_gym.agents.tiny.TinyConfig` for kind "tiny"
    tiny: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    #: torch dtype name of the weights ("float32", "bfloat16"); None: float32 on CPU, bf16 on CUDA
    dtype: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None
    max_context: int | None = None
    #: most conversations per forward batch of the generator
    gen_batch: int = 16
    #: train LoRA adapters (peft) instead of all weights
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    gradient_checkpointing: bool = False
    #: extra `vllm.LLM` keyword arguments for kind "vllm" (gpu_memory_utilization, ...)
    vllm: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_types(self, "policy")
        if self.kind not in POLICY_KINDS:
            raise unknown("policy kind", self.kind, POLICY_KINDS)
        if self.kind in ("hf", "vllm") and not self.path:
            raise ConfigError(
                f"policy.kind = {self.kind!r} needs policy.path (a model directory or hub id)"
            )
        if self.lora and self.lora_r < 1:
            raise ConfigError(f"policy.lora_r must be >= 1, got {self.lora_r}")
        if self.kind == "tiny" and self.tiny:
            from trace_gym.agents.tiny import TinyConfig

            from trace_gym.plugins import check_kwargs

            check_kwargs("policy.tiny", TinyConfig, self.tiny)
        if self.temperature <= 0:
            raise ConfigError(
                "policy.temperature must be > 0 for RL (greedy rollouts have no variance)"
            )


#: runner settings a ``[rollout]`` table may still write flat, as configs did before it
#: embedded ``[rollout.runner]`` (read back as properties: ``cfg.rollout.root_budget``)
FLAT_RUNNER_KEYS = (
    "root_budget",
    "replays_per_root",
    "m_max",
    "replay_cost",
    "max_batch",
    "rollout_cost",
)
#: M of a table that does not set it
DEFAULT_ROOT_BUDGET = 16


def runner_table(
    value: Any, where: str = "rollout", flat: tuple[str, ...] = FLAT_RUNNER_KEYS
) -> RunnerConfig:
    """The `RunnerConfig` a ``runner`` table (a dict, or one already built) describes.

    Its keys are the runner's fields, type-checked like any config value; ``root_budget``
    defaults to 16. Every bound is the runner's own (`RunnerConfig.__post_init__`), its
    message naming the key where it can be written: ``rollout.root_budget`` for one of
    the `flat` keys, ``rollout.runner.expansion`` for the others.
    """
    if isinstance(value, RunnerConfig):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}.runner must be a table ([{where}.runner] in TOML)")
    known = {f.name for f in fields(RunnerConfig)}
    extra = sorted(set(value) - known)
    if extra:
        raise ConfigError(
            f"unknown key(s) {extra} in [{where}.runner]{did_you_mean(extra[0], known)}; "
            f"known keys: {', '.join(sorted(known))}"
        )
    for key in value:  # one at a time, so each message names its own table
        _check_values(RunnerConfig, {key: value[key]}, where if key in flat else f"{where}.runner")
    try:
        return RunnerConfig(**{"root_budget": DEFAULT_ROOT_BUDGET, **value})
    except ConfigError as e:
        name = str(e).partition(" ")[0]
        raise ConfigError(f"{where if name in flat else where + '.runner'}.{e}") from None


def takes_flat_runner_keys(keys: tuple[str, ...], where: str) -> Any:
    """Class decorator: the dataclass's ``runner`` (a `RunnerConfig`) also takes `keys` as
    keyword arguments of its own, each read and set back as a property of the class."""

    def merge(runner: Any, flat: dict[str, Any]) -> Any:
        """The ``runner`` argument with the flat keys in (`runner_table` checks the result)."""
        if not flat or not isinstance(runner, (dict, RunnerConfig, type(None))):
            return {} if runner is None else runner
        if isinstance(runner, RunnerConfig):  # flat keys override a built one
            return {**asdict(runner), **flat}
        twice = sorted(set(flat) & set(runner or {}))
        if twice:
            raise ConfigError(f"{where}: {twice} set both in [{where}] and in [{where}.runner]")
        return {**(runner or {}), **flat}

    def decorate(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kw: Any) -> None:
            flat = {k: kw.pop(k) for k in keys if k in kw}
            kw["runner"] = merge(kw.get("runner"), flat)
            init(self, *args, **kw)

        def alias(name: str) -> property:
            def get(self: Any) -> Any:
                return getattr(self.runner, name)

            def put(self: Any, value: Any) -> None:
                self.runner = replace(self.runner, **{name: value})

            return property(get, put, doc=f"``runner.{name}`` (a flat key of [{where}])")

        cls.__init__ = __init__  # type: ignore[misc]
        cls.FLAT_KEYS = keys  # type: ignore[attr-defined]
        for name in keys:
            setattr(cls, name, alias(name))
        return cls

    return decorate


@takes_flat_runner_keys(FLAT_RUNNER_KEYS, "rollout")
@dataclass
class RolloutConfig:
    """What the `BranchingRunner` collects each step."""

    env_id: str = "trace/Sim-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: allocation policy: a name in `trace_gym.alloc.ALLOCATORS`, an installed entry point
    #: (group ``trace_gym.allocators``) or "module:Class"
    allocator: str = "trace"
    allocator_kwargs: dict[str, Any] = field(default_factory=dict)
    #: predictor name in `trace_gym.predict.PREDICTORS` or a "module:Class" entry point
    #: ("" = none: every value 0.5)
    predictor: str = "empirical"
    predictor_kwargs: dict[str, Any] = field(default_factory=dict)
    #: the step's budget and scheduling, ``[rollout.runner]`` (`trace_gym.runner.RunnerConfig`:
    #: root_budget M = 16 unless set, replays_per_root N, m_max, replay_cost, max_batch,
    #: rollout_cost, expansion, policy_retries, reseed_replays, prefix_share,
    #: raise_on_failures, update_predictor); its seed is the run's. N is ignored by flat
    #: allocators; rollout_cost "turns" / "tokens" is for a multi-env mixture
    #: (``env_id = "trace/Mixture-v0"``, docs/trainers.md)
    runner: RunnerConfig = field(default_factory=lambda: runner_table({}))
    #: candidate prompts drawn (without replacement) from the task pool each step
    candidates_per_step: int = 16
    #: group size of flat allocators (grpo, pcl, ...)
    group_size: int = 8
    #: restrict training to the first `train_tasks` task ids (None: all)
    train_tasks: int | None = None
    #: collect on Ray rollout workers: None (local runner), "local" or a cluster address
    ray_address: str | None = None
    #: Ray rollout workers (with `ray_address`; see docs/distributed.md)
    ray_workers: int = 2
    #: generation-engine actors the workers call (with `ray_address`; 0: the policy on
    #: each worker). The trainer's weights reach them by version after every step. With
    #: ``policy.kind = "vllm"`` each engine builds its own vLLM engine on `policy.path` and
    #: the driver keeps only the HF copy it trains (docs/distributed.md)
    ray_engines: int = 0
    #: GPUs reserved per engine actor (1 for a vLLM engine on a GPU node)
    ray_engine_gpus: float = 0.0
    #: any other `trace_gym.distributed.RayConfig` field (worker_cpus, engine_cpus,
    #: engine_slots, num_cpus, init_kwargs, ...), e.g. ``{ worker_cpus = 0.5 }``
    ray_options: dict[str, Any] = field(default_factory=dict)
    #: asynchronous rollouts: step t+1's trees grow (in a background thread, from a frozen
    #: copy of the policy) while step t trains, at most this many updates stale; samples
    #: past it are dropped, stale ones weighted by a truncated importance ratio
    #: (`algo.stale_is_cap`). 0: synchronous (docs/distributed.md "Asynchronous rollouts")
    max_staleness: int = 0

    def __post_init__(self) -> None:
        from trace_gym.alloc import allocator_class

        self.runner = runner_table(self.runner, "rollout")
        _check_types(self, "rollout")
        check_env_id(self.env_id)
        allocator_class(self.allocator)  # a registered name, an entry point or "module:Class"
        if self.predictor:
            from trace_gym.predict import predictor_entry_point

            predictor_entry_point(self.predictor)  # a registered name or "module:Class"
        self._check_kwargs()
        if self.candidates_per_step < 1:
            raise ConfigError(
                f"rollout.candidates_per_step must be >= 1, got {self.candidates_per_step}"
            )
        if self.group_size < 2:
            raise ConfigError(
                f"rollout.group_size must be >= 2 (a prompt's rollouts are compared with "
                f"each other), got {self.group_size}"
            )
        if self.ray_options and self.ray_address is None:
            raise ConfigError(
                "rollout.ray_options needs rollout.ray_address (the local runner uses no Ray)"
            )
        if self.ray_engine_gpus < 0:
            raise ConfigError(f"rollout.ray_engine_gpus must be >= 0, got {self.ray_engine_gpus}")
        if self.ray_engines < 0 or self.ray_workers < 1:
            raise ConfigError(
                f"rollout.ray_engines must be >= 0 and rollout.ray_workers >= 1, got "
                f"{self.ray_engines} and {self.ray_workers}"
            )
        if self.train_tasks is not None and self.train_tasks < 1:
            raise ConfigError(
                f"rollout.train_tasks must be >= 1 (or unset), got {self.train_tasks}"
            )
        if self.max_staleness < 0:
            raise ConfigError(f"rollout.max_staleness must be >= 0, got {self.max_staleness}")

    def _check_kwargs(self) -> None:
        """Each ``*_kwargs`` table against the constructor it is for: a typo fails here, at
        ``--check`` and start-up, not after the first rollouts (nothing is built)."""
        from trace_gym.alloc import check_allocator_kwargs
        from trace_gym.plugins import check_kwargs
        from trace_gym.registration import check_env_kwargs

        check_env_kwargs(self.env_id, self.env_kwargs, "rollout.env_kwargs")
        check_ray_options(self.ray_options)
        check_allocator_kwargs(self.allocator, self.allocator_kwargs, "rollout.allocator_kwargs")
        if self.predictor:
            from trace_gym.predict import predictor_class

            try:
                cls = predictor_class(self.predictor)
            except ImportError:  # an extra not installed here: building it will say so
                return
            check_kwargs("rollout.predictor_kwargs", cls, self.predictor_kwargs)


#: RayConfig fields `rollout.ray_options` may not set: they have rollout keys of their own
#: or are the trainer's to set
_RAY_OWN = {
    "address": "ray_address",
    "num_workers": "ray_workers",
    "num_engines": "ray_engines",
    "engine_gpus": "ray_engine_gpus",
    "engine_policy": "policy.kind",
    "engine_export": "policy",
    "engine_apply": "policy",
}


def check_ray_options(options: dict[str, Any]) -> None:
    """`rollout.ray_options` keys against `RayConfig`'s fields."""
    from dataclasses import fields

    from trace_gym.distributed.runner import RayConfig

    known = {f.name for f in fields(RayConfig)}
    for key in options:
        if key in _RAY_OWN:
            raise ConfigError(
                f"rollout.ray_options.{key}: set it with rollout.{_RAY_OWN[key]}"
                if _RAY_OWN[key].startswith("ray_")
                else f"rollout.ray_options.{key} is set by the trainer (from {_RAY_OWN[key]})"
            )
        if key not in known:
            raise unknown("rollout.ray_options key", key, sorted(known - set(_RAY_OWN)))


@dataclass
class AlgoConfig:
    """The optimiser: advantages from trees and the clipped policy-gradient loss."""

    #: advantage function in `trace_gym.trainers.advantages.ADVANTAGES`
    name: str = "treerpo"
    #: divide by the group std (False: Dr. GRPO-style centring only)
    std: bool = True
    eps: float = 1e-6
    #: "roots" (a prompt weighs its root rollouts) or "none"
    prompt_weight: str = "roots"
    clip_low: float = 0.2
    clip_high: float = 0.28
    #: dual-clip constant c for negative advantages (None: off)
    dual_clip: float | None = 3.0
    #: "token_mean", "seq_mean" or "dr_grpo"
    aggregation: str = "token_mean"
    #: Dr. GRPO's constant length per sequence
    dr_grpo_len: int = 1024
    #: coefficient of the k3 KL to the initial policy (0: no reference model)
    kl_coef: float = 0.0
    #: cap of the truncated importance weight exp(trainer - generator) logprobs (None: off)
    tis_cap: float | None = None
    #: cap of the truncated importance weight exp(trainer - generator) of samples generated
    #: by an older policy (asynchronous rollouts, `rollout.max_staleness`); with `tis_cap`
    #: set, the smaller of the two
    stale_is_cap: float = 2.0
    #: leave zero-advantage units out of the batch (they only add KL terms)
    skip_zero_advantage: bool = True

    def __post_init__(self) -> None:
        from trace_gym.trainers.advantages import ADVANTAGES, PROMPT_WEIGHTS
        from trace_gym.trainers.losses import AGGREGATIONS

        _check_types(self, "algo")
        if self.name not in ADVANTAGES:
            raise unknown("optimiser", self.name, ADVANTAGES)
        if self.aggregation not in AGGREGATIONS:
            raise unknown("loss aggregation", self.aggregation, AGGREGATIONS)
        if self.prompt_weight not in PROMPT_WEIGHTS:
            raise ConfigError(
                f"algo.prompt_weight must be one of {PROMPT_WEIGHTS}, got {self.prompt_weight!r}"
            )
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ConfigError("algo.clip_low must be in [0, 1) and algo.clip_high >= 0")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ConfigError(f"algo.dual_clip must be > 1 (or None), got {self.dual_clip}")
        if self.kl_coef < 0:
            raise ConfigError(f"algo.kl_coef must be >= 0, got {self.kl_coef}")
        if self.stale_is_cap <= 0:
            raise ConfigError(f"algo.stale_is_cap must be > 0, got {self.stale_is_cap}")


@dataclass
class OptimConfig:
    """AdamW and batching of the update."""

    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    #: AdamW's epsilon (torch's default)
    eps: float = 1e-8
    grad_clip: float = 1.0
    #: samples per forward/backward (gradient accumulation across micro-batches)
    micro_batch_size: int = 8
    #: samples per optimiser step (None: the whole step's batch, one optimiser step)
    mini_batch_size: int | None = None
    #: passes over the step's batch
    epochs: int = 1
    #: longer samples are dropped (and counted in the metrics)
    max_seq_len: int = 8192

    def __post_init__(self) -> None:
        _check_types(self, "optim")
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        if self.lr <= 0 or self.micro_batch_size < 1 or self.epochs < 1:
            raise ConfigError(
                "optim.lr must be > 0, optim.micro_batch_size >= 1 and optim.epochs >= 1"
            )
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ConfigError("optim.mini_batch_size must be >= 1 or None")
        if not self.eps > 0:
            raise ConfigError(f"optim.eps must be > 0, got {self.eps}")


@dataclass
class DistConfig:
    """Sharded training with FSDP2 (`trace_gym.trainers.sharding`; docs/distributed.md)."""

    #: "auto": FSDP when launched by torchrun with WORLD_SIZE > 1, else one process;
    #: "fsdp": always (a single process gets a one-rank group); "none": refuse a multi-process launch
    strategy: str = "auto"
    #: process-group backend: "auto" (nccl on CUDA, gloo on CPU), "gloo" or "nccl"
    backend: str = "auto"
    #: compute dtype of the all-gathered weights (None: the weights' own dtype; no mixed precision)
    param_dtype: str | None = None
    #: dtype of the gradient reduce-scatter (None: param_dtype)
    reduce_dtype: str | None = None
    #: free the gathered weights of a layer after its forward (ZeRO-3); False keeps them to the backward
    reshard_after_forward: bool = True
    #: reduce-scatter gradients only after the last micro-batch (faster, but holds unsharded
    #: gradients between micro-batches); False reduces after every micro-batch
    accumulate_unsharded: bool = False
    #: dtype of the full generator copy (None: param_dtype, else the weights' dtype)
    generator_dtype: str | None = None
    #: who grows the trees: "all" (every rank its share, each with a full generator copy;
    #: the trees are gathered) or "rank0" (rank 0 alone; the other ranks wait)
    rollouts: str = "all"

    def __post_init__(self) -> None:
        _check_types(self, "dist")
        if self.strategy not in DIST_STRATEGIES:
            raise unknown("dist strategy", self.strategy, DIST_STRATEGIES)
        if self.backend not in DIST_BACKENDS:
            raise unknown("dist backend", self.backend, DIST_BACKENDS)
        if self.rollouts not in DIST_ROLLOUTS:
            raise unknown("dist.rollouts", self.rollouts, DIST_ROLLOUTS)
        for name in ("param_dtype", "reduce_dtype", "generator_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise unknown(f"dist.{name}", value, DTYPES)


@dataclass
class LoggingConfig:
    """Metric sinks beside metrics.jsonl (`trace_gym.trainers.loggers`)."""

    #: any of "tensorboard", "wandb", "mlflow" (the top-level ``tensorboard = false`` drops TensorBoard)
    backends: list[str] = field(default_factory=lambda: ["tensorboard"])
    #: run name in W&B and MLflow ("" = the name of out_dir)
    run_name: str = ""
    wandb_project: str = "trace-gym"
    #: "offline" (default: files under out_dir/wandb, `wandb sync` uploads them), "online" or "disabled"
    wandb_mode: str = "offline"
    #: extra `wandb.init` keyword arguments (entity, tags, group, ...)
    wandb_kwargs: dict[str, Any] = field(default_factory=dict)
    #: MLflow tracking URI ("" = sqlite:///<out_dir>/mlflow.db)
    mlflow_tracking_uri: str = ""
    mlflow_experiment: str = "trace-gym"

    def __post_init__(self) -> None:
        from trace_gym.trainers.loggers import LOGGERS, WANDB_MODES

        _check_types(self, "logging")
        for name in self.backends:
            if name not in LOGGERS:
                raise unknown("logging backend", name, LOGGERS)
        if len(set(self.backends)) != len(self.backends):
            raise ConfigError(f"logging.backends lists a backend twice: {self.backends}")
        if self.wandb_mode not in WANDB_MODES:
            raise ConfigError(
                f"logging.wandb_mode must be one of {WANDB_MODES}, got {self.wandb_mode!r}"
            )

    def active(self, tensorboard: bool = True) -> list[str]:
        """The backends to open (TensorBoard only when the top-level switch allows it)."""
        return [b for b in self.backends if b != "tensorboard" or tensorboard]


@dataclass
class TrainConfig:
    """One training run."""

    steps: int = 10
    seed: int = 0
    out_dir: str = "runs/train"
    #: checkpoint every k steps (0: only at the end)
    save_every: int = 1
    #: complete checkpoints kept (older ones are deleted)
    keep_checkpoints: int = 2
    #: continue from the latest checkpoint in out_dir when there is one
    resume: bool = True
    #: start over in an out_dir that holds an earlier run (its metrics, checkpoints,
    #: trees and TensorBoard logs are deleted first); without it such a dir is refused
    overwrite: bool = False
    #: also load checkpoints of the old pickle format (trainer.pt, state.pkl), which run
    #: code when loaded: only for checkpoints you made yourself
    trust_checkpoint: bool = False
    #: evaluate every k steps (0: never) on `eval_tasks` task ids x `eval_samples`
    eval_every: int = 0
    eval_tasks: int = 16
    eval_samples: int = 4
    #: write each step's trees to out_dir/trees/
    save_trees: bool = False
    tensorboard: bool = True
    progress: bool = True
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, _build(cls, value, name))
        _check_types(self, "config")
        self._seed_runner()
        if (
            self.steps < 0
            or self.save_every < 0
            or self.eval_every < 0
            or self.keep_checkpoints < 1
        ):
            raise ConfigError(
                "steps, save_every and eval_every must be >= 0; keep_checkpoints >= 1"
            )

    def _seed_runner(self) -> None:
        """The runner draws from the run's seed: a ``[rollout.runner]`` seed may only repeat it."""
        runner = self.rollout.runner
        if runner.seed == self.seed:
            return
        if runner.seed != 0:  # 0 is RunnerConfig's default: not set
            raise ConfigError(
                f"rollout.runner.seed ({runner.seed}) differs from the run's seed ({self.seed}); "
                "the runner uses the run's seed: set the top-level seed"
            )
        self.rollout.runner = replace(runner, seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data; `FLAT_RUNNER_KEYS` stay flat in ``rollout`` (the keys
        provenance.json and checkpoints have always had), the other runner settings are
        under ``rollout.runner``. `from_dict` reads it back."""
        d = asdict(self)
        runner = d["rollout"].pop("runner")
        d["rollout"].update({k: runner.pop(k) for k in FLAT_RUNNER_KEYS})
        d["rollout"]["runner"] = runner
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        return _build(cls, d, "config")


_SECTIONS = {
    "policy": PolicyConfig,
    "rollout": RolloutConfig,
    "algo": AlgoConfig,
    "optim": OptimConfig,
    "logging": LoggingConfig,
    "dist": DistConfig,
}


def _build(cls: type, d: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)} | set(getattr(cls, "FLAT_KEYS", ()))
    extra = sorted(set(d) - known)
    if extra:
        raise ConfigError(
            f"unknown key(s) {extra} in [{where}]{did_you_mean(extra[0], known)}; "
            f"known keys: {', '.join(sorted(known))}"
        )
    return cls(**d)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a TOML (stdlib), YAML (needs pyyaml) or JSON config file into a `TrainConfig`.

    `overrides` maps dotted keys ("algo.name", "steps") to values applied on top.
    Every problem (unreadable file, bad syntax, a wrong key or value) is a `ConfigError`.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (or is not a file)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8"
        ) from e
    d = _parse_config(path, text)
    for key, value in (overrides or {}).items():
        *head, last = key.split(".")
        node = d
        for i, part in enumerate(head):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"cannot set {key!r}: {'.'.join(head[: i + 1])} is a value, not a table"
                )
        node[last] = value
        _override_runner_key(d, head, last)
    return TrainConfig.from_dict(d)


def _override_runner_key(d: dict[str, Any], head: list[str], last: str) -> None:
    """An override of a runner setting replaces it in whichever of its two homes the file
    used (``rollout.runner.root_budget`` overrides a flat ``[rollout] root_budget``)."""
    rollout = d.get("rollout")
    if last not in FLAT_RUNNER_KEYS or not isinstance(rollout, dict):
        return
    runner = rollout.get("runner")
    if head == ["rollout"] and isinstance(runner, dict):
        runner.pop(last, None)
    elif head == ["rollout", "runner"]:
        rollout.pop(last, None)


def _parse_config(path: Path, text: str) -> dict[str, Any]:
    """The file's top-level table (syntax errors become `ConfigError` naming the file)."""
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            tomllib = require("tomli", "pip install tomli", what="tomli (TOML on Python 3.10)")
        parse, errors = tomllib.loads, (tomllib.TOMLDecodeError,)
    elif path.suffix in (".yaml", ".yml"):
        yaml = require("yaml", "pip install pyyaml", what="pyyaml")
        parse, errors = (lambda t: yaml.safe_load(t) or {}), (yaml.YAMLError,)
    elif path.suffix == ".json":
        parse, errors = json.loads, (json.JSONDecodeError, RecursionError)
    else:
        raise ConfigError(f"config file {path} must end in .toml, .yaml/.yml or .json")
    try:
        d = parse(text)
    except errors as e:
        raise ConfigError(
            f"config file {path} is not valid {path.suffix[1:].upper()}: {str(e).splitlines()[0]}"
        ) from e
    if not isinstance(d, dict):
        raise ConfigError(
            f"config file {path} must hold a table of settings, got {type(d).__name__}"
        )
    return d
