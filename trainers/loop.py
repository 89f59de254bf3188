"""The training loop: collect trees with the BranchingRunner, compute advantages, update the policy.

One step:

1. draw the step's candidate prompts from the task pool (a pure function of
   (seed, step), so a resumed run draws the same ones);
2. ``runner.run_step``: allocation, root rollouts, replays; the runner also updates the
   predictor on the finished trees (``RunnerConfig.update_predictor``), so the trainer
   does not update it a second time;
3. advantages (`trace_gym.trainers.advantages`) -> samples from the recorded token ids
   (`trace_gym.trainers.data`);
4. old logprobs recomputed by the trainer in one no-grad pass (the generator's logprobs
   are kept only for the mismatch diagnostic and the optional truncated importance
   weight); then ``epochs`` passes of mini-batches, each accumulated over micro-batches
   with the whole mini-batch's normaliser, one AdamW step per mini-batch;
5. weight sync to the generator (`trace_gym.trainers.sync`). The in-process HF policy
   (`trace_gym.agents.hf.HFPolicy`) generates with *the same module object* the trainer
   updates (LoRA adapters included), so there is nothing to copy; a generator with its
   own weights either exposes ``sync_weights(model)`` or is a vLLM engine whose model
   gets the new weights through ``load_weights`` (a best-effort hook on vLLM internals);
6. metrics to JSONL + the configured loggers (TensorBoard, W&B, MLflow:
   `trace_gym.trainers.loggers`), periodic evaluation, an atomic checkpoint.

Checkpoints (``out_dir/checkpoints/step_NNNNNN``) hold the trainable weights, the
optimiser, the predictor's ``state_dict()``, the runner's visit histories, the RNG states
and the step; resuming loads them into the parts the config builds.
They are written into a temporary directory and moved into place with ``os.replace``;
``latest`` is updated the same way, so a run killed at any moment resumes from the last
complete step and replays the following steps with the same data. Each checkpoint
carries the sha256 of its files (``checksums.json``); resuming skips, with a warning,
one that is truncated or fails its checksum, or that ``latest`` names but is missing,
and loads the newest valid one. A torn last row of ``metrics.jsonl`` is dropped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import pickle
import random
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from trace_gym.trainers.advantages import compute_advantages
from trace_gym.trainers.config import PolicyConfig, TrainConfig
from trace_gym.trainers.data import Sample, collate, sample_from_unit
from trace_gym.trainers.loggers import check_backends, make_loggers, scalars
from trace_gym.trainers.losses import LossOutput, entropy_from_logits, policy_loss, token_logprobs
from trace_gym.trainers.predictor_metrics import predictor_metrics
from trace_gym.trainers.sync import sync_weights

from trace_gym.core import unwrap
from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.mixture import flat_env_metrics, mixture_candidates, per_member
from trace_gym.optional import require
from trace_gym.provenance import write_provenance
from trace_gym.seeding import stable_seed
from trace_gym.tree import RolloutTree, batch_metrics, save_trees

torch = require("torch", "train")

__all__ = ["Trainer", "TrainerParts", "build_parts", "build_policy", "load_trainer_model"]

log = logging.getLogger(__name__)

MIXTURE = "trace/Mixture-v0"


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
        from trace_gym.agents.tiny import TinyConfig, load_tiny_policy

        tiny = dict(cfg.tiny)
        if "envs" in tiny:
            tiny["envs"] = tuple(tiny["envs"])
        return load_tiny_policy(TinyConfig(**tiny), **sampling)
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


def _task_ids(env_factory: Callable[[], gym.Env], train_tasks: int | None) -> list[str]:
    probe = env_factory()
    ids = list(unwrap(probe).task_ids)
    probe.close()
    return per_member(ids, train_tasks)  # a mixture: the first train_tasks of each member


def _engine_options(ro: Any, policy: Any) -> dict[str, Any]:
    """Ray engine-pool options: HF weights travel by version through `sync.py`'s engine hooks."""
    if not ro.ray_engines or ro.ray_address is None:
        return {}
    opts: dict[str, Any] = {
        "num_engines": ro.ray_engines,
        "engine_batching": "batch",
        "engine_max_batch": ro.max_batch,
    }
    if hasattr(getattr(policy, "model", None), "peft_config"):
        raise ConfigError(
            "rollout.ray_engines does not support LoRA policies (the engines would get merged "
            "weights in a LoRA copy); set policy.lora = false or rollout.ray_engines = 0"
        )
    if (
        getattr(policy, "model", None) is not None
    ):  # an in-process HF policy (vLLM: not from the trainer)
        opts.update(
            engine_export="trace_gym.trainers.sync:engine_weights",
            engine_apply="trace_gym.trainers.sync:load_engine_weights",
        )
    return opts


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
    from trace_gym.alloc import make_allocator
    from trace_gym.distributed import make_runner
    from trace_gym.predict import make_predictor
    from trace_gym.runner import RunnerConfig

    torch.manual_seed(cfg.seed)
    policy = policy if policy is not None else build_policy(cfg.policy)
    model = trainable_model(cfg.policy, policy)
    sync_mode = sync_weights(policy, model)
    ref_model = None
    if cfg.algo.kl_coef > 0 and not cfg.policy.lora:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optim
    optimizer = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, betas=o.betas)

    ro = cfg.rollout
    env_factory = env_factory or (lambda: gym.make(ro.env_id, **ro.env_kwargs))
    task_ids = _task_ids(env_factory, ro.train_tasks)
    allocator = allocator or make_allocator(
        ro.allocator, m_max=ro.m_max, group_size=ro.group_size, **ro.allocator_kwargs
    )
    if predictor is None and ro.predictor:
        predictor = make_predictor(ro.predictor, **ro.predictor_kwargs)
    rc = RunnerConfig(
        root_budget=ro.root_budget,
        replays_per_root=ro.replays_per_root,
        m_max=ro.m_max,
        replay_cost=ro.replay_cost,
        max_batch=ro.max_batch,
        seed=cfg.seed,
        rollout_cost=ro.rollout_cost,
    )
    runner = make_runner(
        policy,
        env_factory,
        allocator,
        predictor,
        rc,
        ray_address=ro.ray_address,
        num_workers=ro.ray_workers,
        **_engine_options(ro, policy),
    )
    return TrainerParts(
        policy, model, ref_model, optimizer, sync_mode, env_factory, task_ids, allocator, runner
    )


class OldLogprobs(NamedTuple):
    """No-grad logprobs of each sample before the update, per token (1-D tensors)."""

    #: under the current weights (the PPO ratio's denominator)
    old: list[Any]
    #: under the reference policy (None without a KL term)
    ref: list[Any] | None


@dataclass
class MicroStats:
    """Detached statistics of one micro-batch, weighted by its trained tokens."""

    #: trained tokens in the micro-batch
    tokens: float
    entropy: float
    #: sum |old - generator| logprob over trained tokens whose generator logprob is known
    mismatch_sum: float
    #: how many such tokens
    mismatch_n: float


@dataclass
class _UpdateStats:
    """Accumulates micro-batch and optimiser-step statistics into `Trainer.update`'s metrics."""

    values: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: {
            k: [] for k in ("loss", "pg_loss", "kl", "clip_frac", "ratio", "entropy", "grad_norm")
        }
    )
    mismatch: float = 0.0
    mismatch_n: float = 0.0
    opt_steps: int = 0

    def add_micro(self, out: LossOutput, st: MicroStats) -> None:
        for k, v in (
            ("loss", float(out.loss.detach())),
            ("pg_loss", out.pg_loss),
            ("kl", out.kl),
            ("clip_frac", out.clip_frac),
            ("ratio", out.ratio_mean),
            ("entropy", st.entropy),
        ):
            self.values[k].append((v, st.tokens))
        self.mismatch += st.mismatch_sum
        self.mismatch_n += st.mismatch_n

    def add_step(self, grad_norm: float) -> None:
        self.values["grad_norm"].append((grad_norm, 1.0))
        self.opt_steps += 1

    def summary(self, samples: Sequence[Sample]) -> dict[str, float]:
        res = {}
        for k, vals in self.values.items():
            w = sum(n for _, n in vals)
            res[k] = sum(v * n for v, n in vals) / w if w else 0.0
        # micro-batch losses are shares of their mini-batch loss: sum, then mean over optimiser steps
        res["loss"] = sum(v for v, _ in self.values["loss"]) / max(self.opt_steps, 1)
        res["optimizer_steps"] = float(self.opt_steps)
        res["logprob_mismatch"] = self.mismatch / self.mismatch_n if self.mismatch_n else 0.0
        res["trained_tokens"] = float(sum(s.num_trained for s in samples))
        return res


class Trainer:
    """Runs `TrainConfig`: rollouts by the BranchingRunner, updates by the configured optimiser.

    `policy` (kind "custom"), `env_factory`, `allocator` and `predictor` may be passed in
    to override what the config would build (see `build_parts`).
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        policy: Any = None,
        env_factory: Callable[[], gym.Env] | None = None,
        allocator: Any = None,
        predictor: Any = None,
    ):
        self.config = config
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        write_provenance(self.out, config)
        parts = build_parts(
            config, policy=policy, env_factory=env_factory, allocator=allocator, predictor=predictor
        )
        self.policy, self.model, self.ref_model = parts.policy, parts.model, parts.ref_model
        self.optimizer, self.sync_mode = parts.optimizer, parts.sync_mode
        self.env_factory, self.task_ids = parts.env_factory, parts.task_ids
        self.allocator, self.runner = parts.allocator, parts.runner
        self.step = 0  # next step to run
        check_backends(config.logging.active(config.tensorboard))
        self._loggers: list[Any] | None = None  # opened at the first logged step
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ data
    def candidates(self, step: int) -> list[str]:
        """The step's candidate prompts: a pure function of (seed, step)."""
        rng = np.random.default_rng(stable_seed("candidates", self.config.seed, step))
        k = min(self.config.rollout.candidates_per_step, len(self.task_ids))
        weights = (
            self.config.rollout.env_kwargs.get("weights")
            if self.config.rollout.env_id == MIXTURE
            else None
        )
        if weights:  # a mixture's per-env candidate shares
            return mixture_candidates(self.task_ids, weights, k, rng)
        return [
            self.task_ids[i] for i in sorted(rng.choice(len(self.task_ids), size=k, replace=False))
        ]

    def samples(self, trees: Sequence[RolloutTree]) -> tuple[list[Sample], dict[str, float]]:
        """Advantages -> samples; drops zero-advantage units and over-long samples (counted)."""
        a = self.config.algo
        units = compute_advantages(
            a.name, trees, std=a.std, eps=a.eps, prompt_weight=a.prompt_weight
        )
        n_units = len(units)
        if a.skip_zero_advantage:
            units = [u for u in units if abs(u.advantage) > 1e-8]
        out, too_long, no_tokens = [], 0, 0
        for u in units:
            s = sample_from_unit(trees[u.tree], u)
            if len(s.input_ids) > self.config.optim.max_seq_len:
                too_long += 1
            elif s.num_trained == 0:
                no_tokens += 1
            else:
                out.append(s)
        return out, {
            "units": n_units,
            "samples": len(out),
            "dropped_too_long": too_long,
            "dropped_no_tokens": no_tokens,
        }

    # ------------------------------------------------------------------ update
    def _forward(self, model: Any, batch: Any) -> tuple[Any, Any]:
        """Per-token logprobs [B, T] (temperature-scaled like the generator) and logits [B, T, V]."""
        dev = next(model.parameters()).device
        logits = model(
            input_ids=batch.input_ids.to(dev),
            attention_mask=batch.attention_mask.to(dev),
            use_cache=False,
        ).logits
        logits = logits / self.config.policy.temperature
        return token_logprobs(logits, batch.input_ids.to(dev)), logits

    def _logprobs_no_grad(self, samples: list[Sample], reference: bool = False) -> list[Any]:
        out = []
        mbs = self.config.optim.micro_batch_size
        model = self.ref_model if (reference and self.ref_model is not None) else self.model
        with torch.no_grad():
            for i in range(0, len(samples), mbs):
                chunk = samples[i : i + mbs]
                batch = collate(chunk, self._pad_id())
                if reference and self.ref_model is None:  # LoRA: the base model is the reference
                    with self.model.disable_adapter():
                        lp, _ = self._forward(model, batch)
                else:
                    lp, _ = self._forward(model, batch)
                out += [lp[j, : len(s.input_ids)].float().cpu() for j, s in enumerate(chunk)]
        return out

    def _pad_id(self) -> int:
        tok = getattr(self.policy, "tokenizer", None)
        pad = getattr(tok, "pad_token_id", None)
        return int(pad) if pad is not None else 0

    def _old_logprobs(self, samples: list[Sample]) -> OldLogprobs:
        """The no-grad pass before the update: old logprobs, and reference ones for the KL term."""
        self.model.eval()
        old = self._logprobs_no_grad(samples)
        ref = (
            self._logprobs_no_grad(samples, reference=True)
            if self.config.algo.kl_coef > 0
            else None
        )
        return OldLogprobs(old, ref)

    def _micro_step(
        self, chunk: list[Sample], old: OldLogprobs, norm: dict[str, float]
    ) -> tuple[LossOutput, MicroStats]:
        """Forward and backward of one micro-batch; `old` holds the chunk's rows, `norm` the
        mini-batch's normaliser (so accumulated gradients equal one big batch's)."""
        a = self.config.algo
        batch = collate(chunk, self._pad_id())
        logp, logits = self._forward(self.model, batch)  # [B, T], [B, T, V]
        dev, t = logp.device, batch.input_ids.shape[1]

        def pad(rows: list[Any]) -> Any:  # 1-D rows -> [B, T]
            return torch.stack([torch.nn.functional.pad(r, (0, t - len(r))) for r in rows]).to(dev)

        old_lp = pad(old.old)
        mask = batch.loss_mask.to(dev)  # [B, T]
        gen = batch.gen_logprobs.to(dev)  # [B, T]
        known = mask * batch.gen_known.to(dev)  # [B, T]: trained tokens with a recorded logprob
        is_w = None
        if a.tis_cap is not None:
            is_w = torch.where(
                known > 0, torch.clamp(torch.exp(old_lp - gen), max=a.tis_cap), torch.ones_like(gen)
            )
        out = policy_loss(
            logp,
            old_lp,
            batch.advantages.to(dev),
            mask,
            batch.weights.to(dev),
            ref_logp=None if old.ref is None else pad(old.ref),
            is_weights=is_w,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            kl_coef=a.kl_coef,
            aggregation=a.aggregation,
            **norm,
        )
        out.loss.backward()
        with torch.no_grad():
            n = float(mask.sum())
            ent = float((entropy_from_logits(logits.detach()) * mask).sum()) / max(n, 1.0)
            st = MicroStats(n, ent, float(((old_lp - gen).abs() * known).sum()), float(known.sum()))
        return out, st

    def _optimizer_step(
        self, samples: list[Sample], idx: Sequence[int], old: OldLogprobs, stats: _UpdateStats
    ) -> None:
        """One AdamW step on the mini-batch `samples[idx]`, accumulated over micro-batches."""
        a, o = self.config.algo, self.config.optim
        tokens = float(sum(samples[i].num_trained for i in idx))
        norm = {
            "tokens": tokens,
            "seqs": float(len(idx)),
            "constant": float(len(idx) * a.dr_grpo_len),
        }
        self.optimizer.zero_grad(set_to_none=True)
        for m0 in range(0, len(idx), o.micro_batch_size):
            mid = idx[m0 : m0 + o.micro_batch_size]
            rows = OldLogprobs(
                [old.old[i] for i in mid], None if old.ref is None else [old.ref[i] for i in mid]
            )
            stats.add_micro(*self._micro_step([samples[i] for i in mid], rows, norm))
        params = [p for p in self.model.parameters() if p.requires_grad]
        gn = (
            torch.nn.utils.clip_grad_norm_(params, o.grad_clip)
            if o.grad_clip > 0
            else torch.tensor(0.0)
        )
        stats.add_step(float(gn))
        self.optimizer.step()

    def update(self, samples: list[Sample], step: int) -> dict[str, float]:
        """Old logprobs, then `epochs` passes of mini-batched clipped-PG steps; returns the metrics."""
        o = self.config.optim
        old = self._old_logprobs(samples)
        self.model.train()
        rng = np.random.default_rng(stable_seed("minibatch", self.config.seed, step))
        mini = o.mini_batch_size or len(samples)
        stats = _UpdateStats()
        for _ in range(o.epochs):
            order = rng.permutation(len(samples))
            for start in range(0, len(order), mini):
                self._optimizer_step(samples, order[start : start + mini], old, stats)
        self.model.eval()
        return stats.summary(samples)

    def _sync(self) -> str:
        """Weights to the generator (`trace_gym.trainers.sync`); the sharded trainer gathers them first."""
        return sync_weights(self.policy, self.model)

    # ------------------------------------------------------------------ step
    def train_step(self, step: int) -> dict[str, Any]:
        """Collect, update, sync; returns the step's metrics."""
        t0 = time.perf_counter()
        result = self.runner.run_step(step, self.candidates(step))
        t_roll = time.perf_counter() - t0
        trees, rep = result.trees, result.report
        if self.config.save_trees:
            save_trees(trees, self.out / "trees" / f"step_{step:06d}.jsonl.gz")
        t1 = time.perf_counter()
        samples, counts = self.samples(trees)
        upd = self.update(samples, step) if samples else {}
        self.sync_mode = self._sync()
        t_train = time.perf_counter() - t1
        bm = batch_metrics(trees)
        m: dict[str, Any] = {
            "step": step,
            "reward": bm["success_rate"],
            "effective_ratio": bm["effective_ratio"],
            "mixed_groups": bm["mixed_groups"],
            "mixed_anchors": bm["mixed_anchors"],
            "contrastive_pairs": bm["contrastive_pairs"],
            "prompts": bm["prompts"],
            "leaves": bm["leaves"],
            "roots": rep.roots,
            "replays": rep.replays,
            "accounted_cost": rep.accounted_cost,
            "measured_turns": rep.measured_turns,
            "generated_tokens": rep.generated_tokens,
            "failed_branches": rep.failed_branches,
            **counts,
            **upd,
            "gen_tokens_per_s": rep.generated_tokens / t_roll if t_roll > 0 else 0.0,
            "train_tokens_per_s": upd.get("trained_tokens", 0.0) / t_train if t_train > 0 else 0.0,
            "time_rollout_s": t_roll,
            "time_train_s": t_train,
            **{f"time_rollout_{k}_s": v for k, v in rep.time_s.items()},
            **{f"predictor_{k}": v for k, v in rep.predictor_update.items()},
            **flat_env_metrics(trees),  # a mixture: effective ratio, success, tokens per env
            **predictor_metrics(trees, rep.time_s.get("predictor", 0.0), t_roll + t_train),
        }
        return m

    def run(self) -> list[dict[str, Any]]:
        """Train from the latest checkpoint (or from scratch) to `config.steps`."""
        from tqdm.auto import tqdm

        cfg = self.config
        if cfg.resume:
            self.load()
        bar = tqdm(total=cfg.steps, initial=self.step, disable=not cfg.progress, desc="train")
        try:
            while self.step < cfg.steps:
                step = self.step
                m = self.train_step(step)
                if cfg.eval_every and (step + 1) % cfg.eval_every == 0:
                    t = time.perf_counter()
                    m.update({f"eval_{k}": v for k, v in self.evaluate().items()})
                    m["time_eval_s"] = time.perf_counter() - t
                self.step = step + 1
                if (cfg.save_every and self.step % cfg.save_every == 0) or self.step == cfg.steps:
                    t = time.perf_counter()
                    self.save()
                    m["time_checkpoint_s"] = time.perf_counter() - t
                self._log(m)
                bar.update(1)
                bar.set_postfix(reward=f"{m['reward']:.3f}", eff=f"{m['effective_ratio']:.2f}")
        finally:
            bar.close()
            for logger in self._loggers or []:
                logger.close()
            self._loggers = None
        return self.history

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        """Success rate on the first `eval_tasks` tasks x `eval_samples` episodes (fixed seeds).

        Uses the shared evaluator, `trace_gym.agents.evaluate.evaluate` (seeds from
        (seed, task, sample, turn) only, so the same weights always score the same).
        """
        from trace_gym.agents.evaluate import evaluate

        cfg = self.config
        k = cfg.eval_samples
        s = evaluate(
            self.policy,
            self.env_factory,
            per_member(self.task_ids, cfg.eval_tasks),
            k=k,
            seed=cfg.seed,
        ).summary
        return {
            "success": s[f"mean@{k}"],
            "pass": s[f"pass@{k}"],
            "turns": s["avg_turns"],
            "tokens": s["avg_tokens"],
            "errors": s["errors"],
            "overflows": s["overflows"],
        }

    # ------------------------------------------------------------------ logging
    def _log(self, m: dict[str, Any]) -> None:
        self.history.append(m)
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(m, default=float) + "\n")
        if self._loggers is None:  # TensorBoard / W&B / MLflow (trace_gym.trainers.loggers)
            cfg = self.config
            self._loggers = make_loggers(
                cfg.logging.active(cfg.tensorboard), self.out, cfg.logging, cfg.to_dict()
            )
        for logger in self._loggers:
            logger.log(scalars(m), m["step"])

    # ------------------------------------------------------------------ checkpoints
    @property
    def ckpt_root(self) -> Path:
        return self.out / "checkpoints"

    def save(self) -> Path:
        """Write a complete checkpoint for `self.step` atomically; prune old ones."""
        root = self.ckpt_root
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step_{self.step:06d}"
        tmp = root / f".tmp-{final.name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        weights = {n: p.detach().cpu() for n, p in self.model.named_parameters() if p.requires_grad}
        torch.save(
            {"weights": weights, "optimizer": self.optimizer.state_dict()}, tmp / "trainer.pt"
        )
        rng = {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        predictor = self.runner.predictor
        with open(tmp / "state.pkl", "wb") as f:
            pickle.dump(
                {
                    "step": self.step,
                    "rng": rng,
                    "predictor": None if predictor is None else predictor.state_dict(),
                    "history": dict(self.runner.history),
                    "config": self.config.to_dict(),
                    "rollout_costs": None
                    if self.runner.costs is None
                    else dict(self.runner.costs.mean),
                },
                f,
            )
        return publish_checkpoint(tmp, final, CHECKPOINT_FILES, self.config.keep_checkpoints)

    def _candidates(self) -> tuple[list[Path], list[str]]:
        """Checkpoint dirs to try, best first (the one `latest` names, then newest first), and
        what was wrong with the pointer."""
        root = self.ckpt_root
        found = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
        pointer = root / "latest"
        if not pointer.exists():
            return found, []
        named = root / pointer.read_text(errors="replace").strip()
        if named.is_dir():
            return [named] + [p for p in found if p != named], []
        problem = f"checkpoint pointer {pointer} names {named.name!r}, which is missing"
        warnings.warn(f"{problem}; looking for an older checkpoint", RuntimeWarning, stacklevel=3)
        return found, [problem]

    def load(self) -> bool:
        """Restore the newest valid checkpoint, if any; True when one was loaded.

        A checkpoint whose files are truncated or fail their checksum is skipped with a
        warning (the previous one is intact: checkpoints are written whole, then moved).
        """
        candidates, problems = self._candidates()
        for path in candidates:
            try:
                blob, state = _read_checkpoint(path)
            except _BadCheckpoint as e:
                problems.append(str(e))
                warnings.warn(f"skipping checkpoint {path}: {e}", RuntimeWarning, stacklevel=2)
                continue
            if problems:
                warnings.warn(
                    f"resuming from the older checkpoint {path} ({len(problems)} problem(s) with newer ones)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self._apply_checkpoint(path, blob, state)
            return True
        if problems:
            raise ConfigError(
                f"no usable checkpoint in {self.ckpt_root} ({'; '.join(problems)}); "
                "delete the directory to start over, or set resume = false"
            )
        return False

    def _apply_checkpoint(self, path: Path, blob: dict[str, Any], state: dict[str, Any]) -> None:
        missing = set(blob["weights"]) - {n for n, _ in self.model.named_parameters()}
        if missing:
            raise ConfigError(
                f"checkpoint {path} does not match the model (unknown weights {sorted(missing)[:3]}...)"
            )
        with torch.no_grad():
            params = dict(self.model.named_parameters())
            for n, w in blob["weights"].items():
                params[n].copy_(w)
        self.optimizer.load_state_dict(blob["optimizer"])
        self._restore_state(path, state)
        self._truncate_metrics()
        self._sync()
        log.info("resumed from %s (next step %d)", path, self.step)

    def _restore_state(self, path: Path, state: dict[str, Any]) -> None:
        """The non-tensor part of a checkpoint: step, predictor, visit histories, RNG states."""
        self.step = int(state["step"])
        if state["predictor"] is not None:
            if self.runner.predictor is None:
                raise ConfigError(
                    f"checkpoint {path} holds a predictor's state but this run has no predictor"
                )
            self.runner.predictor.load_state_dict(state["predictor"])
        self.runner.history.clear()
        self.runner.history.update(state["history"])
        if (
            self.runner.costs is not None and state.get("rollout_costs") is not None
        ):  # a mixture's measured costs
            self.runner.costs.mean = dict(state["rollout_costs"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])

    def _truncate_metrics(self) -> None:
        """Drop metric rows of steps after the checkpoint (they will be rerun) and torn lines."""
        path = self.out / "metrics.jsonl"
        if not path.exists():
            return
        rows, torn = [], 0
        for line in path.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                step = json.loads(line)["step"]
            except (json.JSONDecodeError, KeyError, TypeError):  # a kill while the row was written
                torn += 1
                continue
            if step < self.step:
                rows.append(line)
        if torn:
            warnings.warn(
                f"{path}: dropped {torn} unreadable row(s) (a run killed while logging)",
                RuntimeWarning,
                stacklevel=3,
            )
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(r + "\n" for r in rows))
        os.replace(tmp, path)


#: the files of a checkpoint dir, each with its sha256 in `CHECKSUMS`
CHECKPOINT_FILES = ("trainer.pt", "state.pkl")
CHECKSUMS = "checksums.json"


class _BadCheckpoint(TraceGymError):
    """A checkpoint dir that cannot be read (truncated, checksum mismatch, missing file)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def publish_checkpoint(tmp: Path, final: Path, files: Sequence[str], keep: int) -> Path:
    """Write the checksums of `files` in `tmp`, move `tmp` to `final`, point ``latest`` at it
    (both with ``os.replace``) and keep the newest `keep` checkpoints."""
    root = final.parent
    sums = {name: _sha256(tmp / name) for name in files}
    (tmp / CHECKSUMS).write_text(json.dumps(sums, indent=1) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer = root / f".latest-{os.getpid()}"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _read_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer blob, state) of a checkpoint dir, verified; raises `_BadCheckpoint`."""
    sums_path = path / CHECKSUMS
    try:
        sums = (
            json.loads(sums_path.read_text()) if sums_path.exists() else {}
        )  # older checkpoints have none
        for name in CHECKPOINT_FILES:
            if name in sums and _sha256(path / name) != sums[name]:
                raise _BadCheckpoint(f"{name} does not match its checksum (truncated or changed)")
        blob = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
        with open(path / "state.pkl", "rb") as f:
            state = pickle.load(f)
        if (
            not isinstance(blob, dict)
            or not isinstance(state, dict)
            or {"weights", "optimizer"} - set(blob)
        ):
            raise _BadCheckpoint("its files do not hold a trainer checkpoint")
    except _BadCheckpoint:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to read means: try the previous one
        raise _BadCheckpoint(f"unreadable ({type(e).__name__}: {str(e)[:120]})") from e
    return blob, state
