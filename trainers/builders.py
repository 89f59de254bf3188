"""What a `Trainer` is built from: its config turned into policy, model, optimiser, env, runner.

`build_parts` is the whole construction, in the order a run depends on (torch seeded
first, the policy before the predictor, which may seed torch itself); `build_model`
and `build_runner` are its two halves, for a caller that brings one of them. Each piece
the config would build can be passed in instead (docs/trainers.md).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
from trace_gym.trainers.config import OptimConfig, PolicyConfig, RolloutConfig, TrainConfig
from trace_gym.trainers.sync import sync_weights

from trace_gym.core import unwrap
from trace_gym.errors import ConfigError
from trace_gym.mixture import per_member
from trace_gym.optional import require

torch = require("torch", "train")

__all__ = [
    "ModelParts",
    "TrainerParts",
    "apply_lora",
    "build_model",
    "build_parts",
    "build_policy",
    "build_runner",
    "engine_options",
    "vllm_engines",
    "load_trainer_model",
    "new_optimizer",
    "train_task_ids",
    "trainable_model",
]


def tiny_config(cfg: PolicyConfig) -> Any:
    """The `trace_gym.agents.tiny.TinyConfig` of ``policy.tiny`` (kind "tiny")."""
    from trace_gym.agents.tiny import TinyConfig

    tiny = dict(cfg.tiny)
    if "envs" in tiny:
        tiny["envs"] = tuple(tiny["envs"])
    return TinyConfig(**tiny)


def build_policy(cfg: PolicyConfig) -> Any:
    """An `HFPolicy` for kind "tiny" (the locally built tiny model) or "hf" (a model path)."""
    sampling = dict(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        max_context=cfg.max_context,
        max_batch=cfg.gen_batch,
    )
    if cfg.kind == "tiny":
        from trace_gym.agents.tiny import load_tiny_policy

        return load_tiny_policy(tiny_config(cfg), **sampling)
    if cfg.kind == "hf":
        from trace_gym.agents.hf import HFPolicy

        return HFPolicy.from_pretrained(cfg.path, device=cfg.device, dtype=cfg.dtype, **sampling)
    if cfg.kind == "vllm":
        from trace_gym.agents.hf import SamplingConfig
        from trace_gym.agents.vllm_backend import VLLMPolicy

        return VLLMPolicy(cfg.path, sampling=SamplingConfig(**sampling), **cfg.vllm)
    raise ConfigError("policy.kind = 'custom' needs the policy object: Trainer(config, policy=...)")


def load_trainer_model(cfg: PolicyConfig) -> Any:
    """The trainable HF model at ``cfg.path`` (for generators that keep their own weights)."""
    if not cfg.path:
        raise ConfigError(
            "the policy has no trainable module (policy.model); set policy.path to load one"
        )
    transformers = require("transformers", "train")
    dtype = (
        getattr(torch, cfg.dtype)
        if cfg.dtype
        else (torch.bfloat16 if cfg.device.startswith("cuda") else torch.float32)
    )
    return transformers.AutoModelForCausalLM.from_pretrained(cfg.path, dtype=dtype).to(cfg.device)


def apply_lora(model: Any, cfg: PolicyConfig) -> Any:
    """Wrap `model` with peft LoRA adapters (only they are trained)."""
    peft = require("peft", "pip install peft")
    lora = peft.LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_targets),
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, lora)


@dataclass
class TrainerParts:
    """Everything a `Trainer` runs, built from its config by `build_parts`."""

    #: the generator (an in-process HF policy shares `model`; others are synced to it)
    policy: Any
    #: the trainable module (LoRA-wrapped when `policy.lora`)
    model: Any
    #: frozen copy for the KL term (None without KL, or with LoRA: the base is the reference)
    ref_model: Any
    optimizer: Any
    #: how weights reach the generator (`trace_gym.trainers.sync.sync_weights`)
    sync_mode: str
    env_factory: Callable[[], gym.Env]
    #: the training task pool (ids of the env's tasks)
    task_ids: list[str]
    allocator: Any
    #: the BranchingRunner (local or Ray); it owns the predictor
    runner: Any


def trainable_model(cfg: PolicyConfig, policy: Any) -> Any:
    """The module the optimiser updates: the policy's own (an in-process HF policy), or a
    copy loaded from ``cfg.path``; LoRA-wrapped and gradient-checkpointed as configured."""
    model = getattr(policy, "model", None)
    if model is None:
        model = load_trainer_model(cfg)
    if cfg.lora:
        shared = getattr(policy, "model", None) is model
        model = apply_lora(model, cfg)
        if shared:
            policy.model = model
    if cfg.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False}
            )
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if cfg.lora:
            model.enable_input_require_grads()
    return model


def train_task_ids(env_factory: Callable[[], gym.Env], train_tasks: int | None) -> list[str]:
    """The env's task ids; the first `train_tasks` (of each member, for a mixture)."""
    probe = env_factory()
    ids = list(unwrap(probe).task_ids)
    probe.close()
    return per_member(ids, train_tasks)  # a mixture: the first train_tasks of each member


def engine_options(
    ro: RolloutConfig, policy: Any, pcfg: PolicyConfig | None = None
) -> dict[str, Any]:
    """Ray engine-pool options: HF weights travel by version through `sync.py`'s engine hooks.

    With `vllm_engines` (``policy.kind = "vllm"``) every engine builds its own `VLLMPolicy`
    from `pcfg` (``RayConfig.engine_policy``) and loads the pushed weights through vLLM's
    ``reload_weights``; the driver's `policy` is the HF copy the trainer trains.
    """
    if not ro.ray_engines or ro.ray_address is None:
        return {}
    opts: dict[str, Any] = {
        "num_engines": ro.ray_engines,
        "engine_batching": "batch",
        "engine_max_batch": ro.runner.max_batch,
        "engine_gpus": ro.ray_engine_gpus,
    }
    if pcfg is not None and vllm_engines(pcfg, ro):
        from trace_gym.distributed import WorkerPolicy

        opts["engine_policy"] = WorkerPolicy(build_policy, pcfg)
    if (
        getattr(policy, "model", None) is not None
    ):  # an in-process HF policy (the trainer's, or the driver's copy for vLLM engines)
        opts.update(
            engine_export="trace_gym.trainers.sync:engine_weights",
            engine_apply="trace_gym.trainers.sync:load_engine_weights",
        )
    return opts


def vllm_engines(pcfg: PolicyConfig, ro: RolloutConfig) -> bool:
    """Whether vLLM generates on Ray engine actors (not in the driver) in this run."""
    return pcfg.kind == "vllm" and ro.ray_engines > 0 and ro.ray_address is not None


@dataclass
class ModelParts:
    """The trained side of a run (`build_model`)."""

    #: the generator (an in-process HF policy shares `model`; others are synced to it)
    policy: Any
    #: the trainable module (LoRA-wrapped when `policy.lora`)
    model: Any
    #: frozen copy for the KL term (None without KL, or with LoRA: the base is the reference)
    ref_model: Any
    optimizer: Any
    #: how weights reach the generator (`trace_gym.trainers.sync.sync_weights`)
    sync_mode: str


def new_optimizer(model: Any, o: OptimConfig) -> Any:
    """AdamW over `model`'s trainable parameters (LoRA: the adapters alone), as ``[optim]`` sets it."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, betas=o.betas, eps=o.eps)


def build_model(cfg: TrainConfig, policy: Any = None) -> ModelParts:
    """Seed torch, then build (or take) the policy, its trainable model, the KL reference
    and the AdamW optimiser."""
    torch.manual_seed(cfg.seed)
    if policy is None and vllm_engines(cfg.policy, cfg.rollout):
        # the engines build the vLLM engines; the driver trains (and exports) an HF copy
        policy = build_policy(replace(cfg.policy, kind="hf"))
    policy = policy if policy is not None else build_policy(cfg.policy)
    model = trainable_model(cfg.policy, policy)
    sync_mode = sync_weights(policy, model)
    ref_model = None
    if cfg.algo.kl_coef > 0 and not cfg.policy.lora:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    return ModelParts(policy, model, ref_model, new_optimizer(model, cfg.optim), sync_mode)


def build_runner(
    cfg: TrainConfig,
    policy: Any,
    env_factory: Callable[[], gym.Env],
    allocator: Any = None,
    predictor: Any = None,
) -> tuple[Any, Any]:
    """(allocator, runner) of ``[rollout]``: the local `BranchingRunner` or the Ray one, on
    the ``[rollout.runner]`` settings with the run's seed; the runner owns the predictor."""
    from trace_gym.alloc import make_allocator
    from trace_gym.distributed import make_runner
    from trace_gym.predict import make_predictor

    ro = cfg.rollout
    allocator = allocator or make_allocator(
        ro.allocator, m_max=ro.runner.m_max, group_size=ro.group_size, **ro.allocator_kwargs
    )
    if predictor is None and ro.predictor:
        predictor = make_predictor(ro.predictor, **ro.predictor_kwargs)
    runner = make_runner(
        policy,
        env_factory,
        allocator,
        predictor,
        replace(ro.runner, seed=cfg.seed),
        ray_address=ro.ray_address,
        num_workers=ro.ray_workers,
        **{**engine_options(ro, policy, cfg.policy), **ro.ray_options},
    )
    return allocator, runner


def build_parts(
    cfg: TrainConfig,
    *,
    policy: Any = None,
    env_factory: Callable[[], gym.Env] | None = None,
    allocator: Any = None,
    predictor: Any = None,
) -> TrainerParts:
    """Build the policy, trainable model, optimiser, env factory, allocator, predictor and runner.

    Each of `policy`, `env_factory`, `allocator`, `predictor` overrides what the config would build.
    """
    m = build_model(cfg, policy)
    ro = cfg.rollout
    env_factory = env_factory or (lambda: gym.make(ro.env_id, **ro.env_kwargs))
    task_ids = train_task_ids(env_factory, ro.train_tasks)
    allocator, runner = build_runner(cfg, m.policy, env_factory, allocator, predictor)
    return TrainerParts(
        m.policy,
        m.model,
        m.ref_model,
        m.optimizer,
        m.sync_mode,
        env_factory,
        task_ids,
        allocator,
        runner,
    )
