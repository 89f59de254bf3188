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

A first Ctrl-C (SIGINT) lets the current step finish, writes a checkpoint and stops;
`Trainer.interrupted` says what was kept (the CLI prints it with the resume command).
A second Ctrl-C raises ``KeyboardInterrupt`` at once.

The parts a step runs are built from the config by `trace_gym.trainers.builders`
(re-exported here); checkpoints (``out_dir/checkpoints/step_NNNNNN``: weights,
optimiser, predictor, visit histories, RNG states, step; written atomically, verified on
resume) are `trace_gym.trainers.checkpoint`'s, which the sharded trainer shares. This
module is the `Trainer`: the step, the update, evaluation and logging.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from trace_gym.trainers.advantages import compute_advantages
from trace_gym.trainers.builders import TrainerParts, build_parts, build_policy, load_trainer_model
from trace_gym.trainers.builders import apply_lora as apply_lora  # re-exported: lived here
from trace_gym.trainers.builders import trainable_model as trainable_model
from trace_gym.trainers.checkpoint import CHECKPOINT_FILES as CHECKPOINT_FILES
from trace_gym.trainers.checkpoint import CHECKSUMS as CHECKSUMS
from trace_gym.trainers.checkpoint import (
    clear_run,
    load_checkpoint,
    refuse_used_run,
    save_checkpoint,
)
from trace_gym.trainers.checkpoint import publish_checkpoint as publish_checkpoint
from trace_gym.trainers.config import TrainConfig
from trace_gym.trainers.data import Sample, collate, sample_from_unit
from trace_gym.trainers.loggers import check_backends, make_loggers, scalars
from trace_gym.trainers.losses import LossOutput, entropy_from_logits, policy_loss, token_logprobs
from trace_gym.trainers.predictor_metrics import predictor_metrics
from trace_gym.trainers.sync import sync_weights

from trace_gym.async_rollouts import AsyncRollouts, policy_snapshot, unit_staleness
from trace_gym.budget import StepReport
from trace_gym.mixture import flat_env_metrics, mixture_candidates, per_member
from trace_gym.optional import require
from trace_gym.policy import policy_version
from trace_gym.predict.health import health_metrics
from trace_gym.provenance import write_provenance
from trace_gym.seeding import stable_seed
from trace_gym.tree import RolloutTree, batch_metrics, save_trees

torch = require("torch", "train")

log = logging.getLogger(__name__)

__all__ = [
    "REPORT_METRICS",
    "Interrupted",
    "Trainer",
    "TrainerParts",
    "build_parts",
    "build_policy",
    "load_trainer_model",
    "step_metrics",
]

MIXTURE = "trace/Mixture-v0"

#: the `StepReport` fields a step's metrics row carries under their own names
REPORT_METRICS = (
    "roots",
    "replays",
    "accounted_cost",
    "measured_turns",
    "generated_tokens",
    "failed_branches",
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
class UpdateStats:
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


_UpdateStats = UpdateStats  # the old private name


@dataclass(frozen=True)
class Interrupted:
    """What a run stopped by Ctrl-C kept."""

    #: the next step to run (steps 0 .. step - 1 are done and checkpointed)
    step: int
    #: the checkpoint written for `step`
    checkpoint: Path


class StopOnSigint:
    """A context in which the first SIGINT only sets `requested` (the loop stops after the
    step) and restores Python's handler, so a second one raises ``KeyboardInterrupt``.

    Outside the main thread signals cannot be caught: it does nothing there.
    """

    def __init__(self) -> None:
        self.requested = False
        self._installed = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log.warning(
            "interrupted: finishing this step and writing a checkpoint (Ctrl-C again quits now)"
        )

    def __enter__(self) -> StopOnSigint:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:  # None: a handler not set from Python; the default stands in
            signal.signal(
                signal.SIGINT, signal.SIG_DFL if self._previous is None else self._previous
            )


def step_metrics(
    trees: Sequence[RolloutTree],
    report: StepReport,
    counts: dict[str, float],
    update: dict[str, float],
    times: tuple[float, float],
) -> dict[str, Any]:
    """One step's metrics row: batch metrics of the trees, the report's counts and times
    (`StepReport.to_dict`), the sample counts and update statistics, throughput.

    `times` is (rollout, train) wall seconds; the keys are the ones docs/trainers.md lists.
    """
    t_roll, t_train = times
    rep = report.to_dict()
    bm = batch_metrics(trees)
    return {
        "step": rep["step"],
        "reward": bm["success_rate"],
        "effective_ratio": bm["effective_ratio"],
        "mixed_groups": bm["mixed_groups"],
        "mixed_anchors": bm["mixed_anchors"],
        "contrastive_pairs": bm["contrastive_pairs"],
        "prompts": bm["prompts"],
        "leaves": bm["leaves"],
        **{k: rep[k] for k in REPORT_METRICS},
        **counts,
        **update,
        "gen_tokens_per_s": rep["generated_tokens"] / t_roll if t_roll > 0 else 0.0,
        "train_tokens_per_s": update.get("trained_tokens", 0.0) / t_train if t_train > 0 else 0.0,
        "time_rollout_s": t_roll,
        "time_train_s": t_train,
        **{f"time_rollout_{k}_s": v for k, v in rep["time_s"].items()},
        **{f"predictor_{k}": v for k, v in rep["predictor_update"].items()},
        **flat_env_metrics(trees),  # a mixture: effective ratio, success, tokens per env
        **health_metrics(trees),  # predictor health by depth (docs/alloc.md)
        **predictor_metrics(trees, rep["time_s"].get("predictor", 0.0), t_roll + t_train),
    }


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
        #: the metrics row of the last finished step (saved in its checkpoint)
        self.last_metrics: dict[str, Any] | None = None
        #: set when a Ctrl-C stopped `run` early
        self.interrupted: Interrupted | None = None
        #: the rollout producer of an asynchronous `run` (`rollout.max_staleness` > 0)
        self._rollouts: AsyncRollouts | None = None

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

    def samples(
        self, trees: Sequence[RolloutTree], lag: int = 0
    ) -> tuple[list[Sample], dict[str, float]]:
        """Advantages -> samples; drops zero-advantage units, over-long samples and samples
        staler than `rollout.max_staleness` (counted).

        A sample's staleness is the trainer's policy version minus the oldest version its
        nodes record; `lag` (the producer's) stands in where versions are not ints.
        """
        a = self.config.algo
        units = compute_advantages(
            a.name, trees, std=a.std, eps=a.eps, prompt_weight=a.prompt_weight
        )
        n_units = len(units)
        if a.skip_zero_advantage:
            units = [u for u in units if abs(u.advantage) > 1e-8]
        out, too_long, no_tokens, stale, ages = [], 0, 0, 0, []
        # synchronous: generated by these very weights (staleness 0, nothing dropped)
        version = policy_version(self.policy) if self._rollouts is not None else None
        for u in units:
            age = unit_staleness(trees[u.tree], u.nodes, version)
            age = lag if age is None else age
            s = sample_from_unit(trees[u.tree], u)
            s.staleness = age
            if age > self.config.rollout.max_staleness:
                stale += 1
            elif len(s.input_ids) > self.config.optim.max_seq_len:
                too_long += 1
            elif s.num_trained == 0:
                no_tokens += 1
            else:
                out.append(s)
                ages.append(age)
        counts = {
            "units": n_units,
            "samples": len(out),
            "dropped_too_long": too_long,
            "dropped_no_tokens": no_tokens,
        }
        if self._rollouts is not None:
            counts["dropped_stale"] = stale
            counts["staleness_mean"] = float(np.mean(ages)) if ages else 0.0
            counts["staleness_max"] = float(max(ages, default=0))
        return out, counts

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
        is_w = self._is_weights(chunk, old_lp, gen, known)
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

    def _is_weights(self, chunk: list[Sample], old_lp: Any, gen: Any, known: Any) -> Any:
        """Truncated importance weights exp(old - generator) [B, T] on tokens with a known
        generator logprob: every row with `algo.tis_cap`, stale rows (generated by an older
        policy) with `algo.stale_is_cap` (the smaller cap where both apply); None: none."""
        a = self.config.algo
        stale = [s.staleness > 0 for s in chunk]
        if not any(stale):
            if a.tis_cap is None:
                return None
            return torch.where(
                known > 0, torch.clamp(torch.exp(old_lp - gen), max=a.tis_cap), torch.ones_like(gen)
            )
        inf = float("inf")
        caps = [
            min(a.tis_cap if a.tis_cap is not None else inf, a.stale_is_cap if st else inf)
            for st in stale
        ]
        cap = torch.tensor(caps, dtype=gen.dtype, device=gen.device)[:, None]  # [B, 1]
        w = torch.minimum(torch.exp(old_lp - gen), cap)
        return torch.where((known > 0) & torch.isfinite(cap), w, torch.ones_like(gen))

    def _optimizer_step(
        self, samples: list[Sample], idx: Sequence[int], old: OldLogprobs, stats: UpdateStats
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
        stats = UpdateStats()
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
        """Collect (or take the producer's trees of an asynchronous run), update, sync;
        returns the step's metrics."""
        t0 = time.perf_counter()
        lag, timing = 0, {}
        if self._rollouts is not None:
            got = self._rollouts.get(step)
            trees, rep, t_roll, lag = got.trees, got.report, got.wall_s, got.lag
            timing = {"time_rollout_wait_s": got.wait_s, "policy_lag": float(lag)}
        else:
            result = self.runner.run_step(step, self.candidates(step))
            trees, rep = result.trees, result.report
            t_roll = time.perf_counter() - t0
        if self.config.save_trees:
            save_trees(trees, self.out / "trees" / f"step_{step:06d}.jsonl.gz")
        t1 = time.perf_counter()
        samples, counts = self.samples(trees, lag)
        upd = self.update(samples, step) if samples else {}
        self.sync_mode = self._sync()
        t_train = time.perf_counter() - t1
        return {**step_metrics(trees, rep, counts, upd, (t_roll, t_train)), **timing}

    def _rollout_snapshot(self, policy: Any) -> Any:
        """The frozen policy an asynchronous run's producer generates with (a copy)."""
        return policy_snapshot(policy)

    def _open_rollouts(self) -> None:
        """Start the producer of an asynchronous run (`rollout.max_staleness` > 0)."""
        k = self.config.rollout.max_staleness
        if k > 0 and self.step < self.config.steps:
            self._rollouts = AsyncRollouts(
                self.runner,
                self.candidates,
                max_staleness=k,
                start=self.step,
                stop=self.config.steps,
                snapshot=self._rollout_snapshot,
                record_state=True,
                policy=self.policy,
            )

    def checkpoint_runner(self) -> Any:
        """What a checkpoint reads the predictor, histories and costs from: the runner, or
        (asynchronous) a copy of its state right after the last trained step was produced."""
        if self._rollouts is None:
            return self.runner
        from types import SimpleNamespace

        return SimpleNamespace(**self._rollouts.state_after(self.step - 1))

    def run(self) -> list[dict[str, Any]]:
        """Train from the latest checkpoint (or from scratch) to `config.steps`.

        A first Ctrl-C stops after the current step with a checkpoint (`interrupted`).
        """
        from tqdm.auto import tqdm

        cfg = self.config
        self._start()
        bar = tqdm(total=cfg.steps, initial=self.step, disable=not cfg.progress, desc="train")
        self._open_rollouts()
        try:
            with StopOnSigint() as stop:
                while self.step < cfg.steps:
                    m = self._run_one(stop)
                    bar.update(1)
                    bar.set_postfix(reward=f"{m['reward']:.3f}", eff=f"{m['effective_ratio']:.2f}")
                    if self.interrupted is not None:
                        break
        finally:
            bar.close()
            if self._rollouts is not None:
                self._rollouts.close()
                self._rollouts = None
            for logger in self._loggers or []:
                logger.close()
            self._loggers = None
        return self.history

    def _start(self) -> None:
        """Resume, or check that out_dir holds no earlier run (`overwrite` clears it)."""
        cfg = self.config
        if cfg.overwrite and getattr(getattr(self, "dist", None), "is_main", True):
            clear_run(self.out)
        loaded = self.load() if cfg.resume else False
        if not loaded and not cfg.overwrite:
            refuse_used_run(self.out, cfg.resume)

    def _run_one(self, stop: StopOnSigint) -> dict[str, Any]:
        """Run step `self.step`: train, evaluate, checkpoint (always when `stop` was
        requested during the step), log."""
        cfg = self.config
        step = self.step
        m = self.train_step(step)
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            t = time.perf_counter()
            m.update({f"eval_{k}": v for k, v in self.evaluate().items()})
            m["time_eval_s"] = time.perf_counter() - t
        self.step = step + 1
        stopping = self._agree_stop(stop.requested)
        self.last_metrics = m  # in the checkpoint: a resume rewrites a lost or torn row
        if (
            stopping
            or (cfg.save_every and self.step % cfg.save_every == 0)
            or self.step == cfg.steps
        ):
            t = time.perf_counter()
            path = self.save()
            m["time_checkpoint_s"] = time.perf_counter() - t
            if stopping and self.step < cfg.steps:  # at the last step there is nothing to resume
                self.interrupted = Interrupted(self.step, Path(path))
        self._log(m)
        if self._rollouts is not None:  # these weights may now generate a later step
            self._rollouts.publish()
        return m

    def _agree_stop(self, requested: bool) -> bool:
        """Whether to stop after this step (the sharded trainer agrees over its ranks)."""
        return requested

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
        """Write a complete checkpoint for `self.step` atomically; prune old ones
        (`trace_gym.trainers.checkpoint`)."""
        return save_checkpoint(self)

    def load(self) -> bool:
        """Restore the newest valid checkpoint, if any; True when one was loaded."""
        return load_checkpoint(self)
