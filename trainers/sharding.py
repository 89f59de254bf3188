"""FSDP2 sharded training: the policy (and reference model) split over the ranks of a torchrun job.

`ShardedTrainer` is a `trace_gym.trainers.loop.Trainer` whose trainable model and frozen
reference are sharded with torch's own ``torch.distributed.fsdp.fully_shard`` (one FSDP
unit per decoder layer plus the root), whose optimiser holds only this rank's shards, and
whose checkpoints are sharded ``torch.distributed.checkpoint`` directories
(`trace_gym.trainers.dist_ckpt`) that resume on any world size. ``trace-gym train
--config ...`` uses it when launched by torchrun with ``WORLD_SIZE > 1`` (or with
``dist.strategy = "fsdp"``).

How a step runs with W ranks (docs/distributed.md, "Sharded training"):

1. **Every rank grows its share of the trees** (``dist.rollouts = "all"``,
   `trace_gym.trainers.rank_rollouts.RankRunner`) with its own full, unsharded *generator
   copy* of the policy: every rank plans the step alike (same runner state), grows the
   prompts the cost-balanced split gives it, and the trees are all-gathered, so every rank
   holds the whole step's trees, turns them into the same samples and gives its predictor
   the same update. With ``dist.rollouts = "rank0"`` rank 0 alone grows the trees (the
   other ranks wait) and **broadcasts** the samples (token ids, masks, advantages,
   generator logprobs: kilobytes to megabytes).
2. **Old logprobs**: each rank scores samples ``r, r + W, ...`` and the rows are
   all-gathered, so every rank holds the whole batch's old (and reference) logprobs.
3. **Updates**: the mini-batch order is drawn from (seed, step) on every rank alike; rank
   r trains on the mini-batch's samples ``r, r + W, ...`` in micro-batches. The loss is
   normalised by the **whole mini-batch's** token (or sequence) count, so each rank's
   loss is its share of the single-process loss, and the gradients are **summed** over
   ranks (FSDP's reduce-scatter with ``force_sum_reduction`` and divide factor 1, not its
   default average): the sharded gradient equals the single-process one. A rank with
   fewer micro-batches than another runs zero-weight forward/backward passes, because
   every forward and backward of an FSDP module is a collective.
4. **Weight sync**: the sharded weights are all-gathered one parameter at a time into
   every generating rank's copy (or pushed to a ``sync_weights(model)`` generator, or a
   vLLM engine on rank 0, through a full-weights view).

Rank 0 alone logs, evaluates and writes the checkpoint's non-tensor state.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from trace_gym.trainers.builders import new_optimizer, vllm_engines
from trace_gym.trainers.config import DistConfig, TrainConfig
from trace_gym.trainers.data import Sample, collate
from trace_gym.trainers.loop import OldLogprobs, Trainer, UpdateStats
from trace_gym.trainers.sync import base_name, sync_weights

from trace_gym.errors import ConfigError
from trace_gym.optional import require

torch = require("torch", "train")

__all__ = [
    "DistEnv",
    "ShardedTrainer",
    "full_state",
    "init_distributed",
    "lora_config",
    "make_trainer",
    "merged_lora_state",
    "shard_model",
    "wants_sharding",
]

log = logging.getLogger(__name__)

#: fault injection for the tests (tests/trainers/test_sharding.py): "avg" makes the gradient
#: reduction average over ranks instead of summing, the SUM/AVG mix-up the comparison must catch
FAULT_ENV = "TRACE_GYM_FSDP_FAULT"


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    #: "cpu" or "cuda:<local_rank>"
    device: str
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_world_size() -> int:
    """WORLD_SIZE as torchrun sets it (1 outside torchrun)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as e:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer") from e


def wants_sharding(cfg: TrainConfig) -> bool:
    """Whether `cfg` runs sharded in this process (torchrun's environment and ``dist.strategy``)."""
    world = launched_world_size()
    if cfg.dist.strategy == "none" and world > 1:
        raise ConfigError(
            f"launched with WORLD_SIZE={world} but dist.strategy = 'none'; "
            "set dist.strategy = 'auto' (or 'fsdp') or launch one process"
        )
    return cfg.dist.strategy == "fsdp" or (cfg.dist.strategy == "auto" and world > 1)


def init_distributed(dcfg: DistConfig, device: str = "cpu") -> DistEnv:
    """Join (or, outside torchrun, create a one-rank) process group; returns this rank's `DistEnv`."""
    dist = torch.distributed
    cuda = device.startswith("cuda")
    backend = dcfg.backend if dcfg.backend != "auto" else ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError("dist.backend = 'nccl' needs policy.device = 'cuda'")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        if not torch.cuda.is_available():
            raise ConfigError("policy.device is CUDA but no CUDA device is available")
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, timeout=timedelta(minutes=30))
        else:  # one process without torchrun: a private one-rank group
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    dev = f"cuda:{local_rank}" if cuda else "cpu"
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, dev, backend)


def _dtype(name: str | None) -> Any:
    return None if name is None else getattr(torch, name)


def _layers(model: Any) -> list[Any]:
    """The repeated blocks to shard one by one: the classes HF names in ``_no_split_modules``
    (decoder layers), else the children of the model's largest ``ModuleList``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = [m for m in model.modules() if type(m).__name__ in names]
    if found:
        return found
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def _units(model: Any) -> list[Any]:
    """The FSDP units below the root: the decoder layers, and the input and output embeddings
    when they are not tied (tied ones stay in the root unit: both modules use the one weight)."""
    units = _layers(model)
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is not None and out is not None and emb.weight is not out.weight:
        units += [emb, out]
    return units


def shard_model(model: Any, dcfg: DistConfig, mesh: Any, *, frozen: bool = False) -> Any:
    """Shard `model` in place with ``fully_shard``: each decoder layer (and untied embeddings), then the root.

    Gradients are summed over ranks (no division by the world size): the trainer's loss on
    each rank is already that rank's share of the whole batch's normalised loss.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=_dtype(dcfg.param_dtype),
        reduce_dtype=_dtype(dcfg.reduce_dtype or dcfg.param_dtype),
    )
    kw = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": dcfg.reshard_after_forward}
    for unit in _units(model):
        fully_shard(unit, **kw)
    fully_shard(model, **kw)
    average = os.environ.get(FAULT_ENV) == "avg"
    for m in model.modules():
        if isinstance(m, FSDPModule) and not frozen:
            m.set_force_sum_reduction_for_comms(
                True
            )  # SUM, then divide by the factor (1): gloo and NCCL alike
            m.set_gradient_divide_factor(float(mesh.size()) if average else 1.0)
    return model


def lora_config(model: Any) -> Any:
    """The peft LoRA config of a LoRA-wrapped `model` (None for a plain model); one adapter only."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    if len(configs) != 1:
        raise ConfigError(
            f"dist: a peft model with {len(configs)} adapters cannot be sharded; keep one"
        )
    return next(iter(configs.values()))


class _Skeleton:
    """What a generating rank needs to rebuild an unsharded copy of a model after it is sharded:
    its class, config and buffers (non-persistent buffers such as RoPE's are in no state dict),
    and for a LoRA-wrapped model the adapter config, so the copy is the same peft model (it
    generates with the adapters unmerged, as the one-process trainer's shared model does)."""

    def __init__(self, model: Any):
        self.lora = lora_config(model)
        base = model.get_base_model() if self.lora is not None else model
        self.cls = type(base)
        self.config = getattr(base, "config", None)
        self.adapter = next(iter(model.peft_config)) if self.lora is not None else None
        self.buffers = {n: b.detach().cpu().clone() for n, b in model.named_buffers()}

    def build(self, device: str, dtype: Any) -> Any:
        if self.config is None:
            raise ConfigError(
                f"cannot rebuild an unsharded copy of {self.cls.__name__} (no .config)"
            )
        with torch.device("meta"):
            gen = self.cls(self.config)
        gen = (
            gen.to_empty(device=device).to(dtype)
            if dtype is not None
            else gen.to_empty(device=device)
        )
        if hasattr(gen, "tie_weights"):
            gen.tie_weights()
        if self.lora is not None:  # the adapters' values come with the first push
            import peft

            gen = peft.get_peft_model(gen, copy.deepcopy(self.lora), adapter_name=self.adapter)
            if dtype is not None:
                gen = gen.to(dtype)
        with torch.no_grad():
            own = dict(gen.named_buffers())
            for n, b in self.buffers.items():
                own[n].copy_(b)
        return gen.eval().requires_grad_(False)


def full_parameters(model: Any) -> Iterator[tuple[str, Any]]:
    """(name, full tensor) of every parameter, gathered one at a time; a collective on every rank."""
    from torch.distributed.tensor import DTensor

    for name, p in model.named_parameters():
        yield name, (p.full_tensor() if isinstance(p, DTensor) else p).detach()


class _FullWeights:
    """A full-weights view for `trace_gym.trainers.sync.sync_weights` (vLLM push, ``sync_weights(model)``)."""

    def __init__(self, state: dict[str, Any]):
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        return iter(self._state.items())


def full_state(model: Any, keep: bool, dtype: Any) -> dict[str, Any]:
    """The full state dict (tied weights under every name), kept on the ranks where `keep`;
    every rank gathers the same parameters in the same order."""
    alias: dict[str, str] = {}
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        alias[name] = first.setdefault(id(p), name)
    full: dict[str, Any] = {}
    for name, t in full_parameters(model):
        if keep:
            full[name] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
    if not keep:
        return {}
    out = {}
    for name, t in model.state_dict().items():
        out[name] = full[alias[name]] if name in alias else t.detach()
    return out


def merged_lora_state(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """A LoRA-wrapped `model`'s full `state` (peft names) as the base model's weights, adapters
    merged in (``W + scaling * B @ A``), under the base architecture's names: what a generator
    with weights of its own is pushed. Only peft's LoRA ``Linear`` layers can be merged here."""
    from peft.tuners.lora import Linear as LoraLinear

    out = {k: v for k, v in state.items() if ".lora_" not in k}
    for name, mod in model.named_modules():
        if not hasattr(mod, "lora_A"):
            continue
        if not isinstance(mod, LoraLinear) or any(mod.use_dora.values()):
            raise ConfigError(
                f"dist: cannot merge the LoRA layer {name!r} ({type(mod).__name__}) into pushed "
                "weights; target linear layers only, without DoRA"
            )
        key = f"{name}.base_layer.weight"
        merged = out[key].float()
        for adapter in mod.active_adapters:
            a = state[f"{name}.lora_A.{adapter}.weight"].float()
            b = state[f"{name}.lora_B.{adapter}.weight"].float()
            delta = (b @ a) * mod.scaling[adapter]
            merged = merged + (delta.T if mod.fan_in_fan_out else delta)
        out[key] = merged.to(state[key].dtype)
    return {base_name(k): v for k, v in out.items()}


def _micro_count(n: int, world: int, mbs: int) -> int:
    """Micro-batches every rank runs for `n` samples dealt round-robin (the busiest rank's)."""
    return math.ceil(math.ceil(n / world) / mbs) if n else 0


class ShardedTrainer(Trainer):
    """A `Trainer` on W ranks with the policy (and reference) sharded by FSDP2; see the module doc."""

    def __init__(self, config: TrainConfig, *, env: DistEnv | None = None, **parts: Any):
        self.dist = env or init_distributed(config.dist, config.policy.device)
        # vLLM on Ray engine actors: no rank holds an engine, each trains an HF copy
        on_engines = vllm_engines(config.policy, config.rollout)
        own_engines = config.policy.kind == "vllm" and not on_engines
        if (
            own_engines
            and self.dist.world_size > 1
            and (config.dist.rollouts != "all" or config.rollout.ray_address)
        ):
            raise ConfigError(
                "dist: policy.kind = 'vllm' in the trainer's processes needs every rank to "
                "generate (dist.rollouts = 'all', no rollout.ray_address): each rank starts its "
                "own engine, and vLLM's engine start runs collectives over the whole torchrun "
                "world, so an engine on rank 0 alone waits for the other ranks forever; or use "
                "vLLM engine actors (rollout.ray_address with rollout.ray_engines)"
            )
        if config.rollout.max_staleness and self.dist.world_size > 1:
            raise ConfigError(
                "dist: asynchronous rollouts (rollout.max_staleness > 0) are not supported "
                "with FSDP over several ranks; set rollout.max_staleness = 0"
            )
        #: every rank grows its share of the trees (else rank 0 grows them all, or has its
        #: Ray workers grow them: with rollout.ray_address the ranks never generate)
        self.all_generate = (
            config.dist.rollouts == "all"
            and self.dist.world_size > 1
            and not config.rollout.ray_address
        )
        if config.policy.kind == "tiny" and parts.get("policy") is None:
            self._build_tiny_on_rank0(config)
        if not self.dist.is_main:
            config = copy.deepcopy(config)
            config.progress = False
            config.tensorboard = False
            config.save_trees = False  # rank 0 writes the step's (whole) trees
            config.rollout.ray_address = None  # rank 0 alone drives the Ray workers
            if on_engines:  # ... and its engines: the other ranks need only the HF copy
                config.policy = replace(config.policy, kind="hf")
        super().__init__(config, **parts)
        if self.all_generate:
            from trace_gym.trainers.rank_rollouts import RankRunner

            self.runner = RankRunner.adopt(
                self.runner,
                rank=self.dist.rank,
                world_size=self.dist.world_size,
                gather=self._gather,
            )
        self._shard()

    def _build_tiny_on_rank0(self, config: TrainConfig) -> None:
        """Rank 0 builds (or finds) the cached tiny model before any rank loads it: under a
        process group transformers saves on rank 0 only, so a model another rank built
        would lack its weights."""
        if self.dist.world_size == 1:
            return
        if self.dist.is_main:
            from trace_gym.agents.tiny import tiny_model_dir
            from trace_gym.trainers.builders import tiny_config

            tiny_model_dir(tiny_config(config.policy))
        torch.distributed.barrier()

    @property
    def generates(self) -> bool:
        """Whether this rank grows trees (and so holds a generator)."""
        return self.dist.is_main or self.all_generate

    def _shard(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        d, cfg = self.dist, self.config
        mesh = init_device_mesh(d.device.split(":")[0], (d.world_size,))
        shared = getattr(self.policy, "model", None) is self.model
        skeleton = _Skeleton(self.model) if shared and self.generates else None
        self.model = shard_model(self.model, cfg.dist, mesh)
        if self.ref_model is not None:
            self.ref_model = shard_model(self.ref_model, cfg.dist, mesh, frozen=True)
        self.optimizer = new_optimizer(self.model, cfg.optim)  # this rank's shards
        self.generator = None
        self._gen_dtype = _dtype(cfg.dist.generator_dtype or cfg.dist.param_dtype)
        if skeleton is not None:  # a generating rank's full copy, refreshed every step
            self.generator = skeleton.build(d.device, self._gen_dtype)
            self.policy.model = self.generator
        elif shared:
            self.policy.model = None  # this rank never generates
        #: "copy" (rank 0's generator copy) or "view" (a full state dict pushed through sync_weights)
        self._mode = self._broadcast("copy" if skeleton is not None else "view")
        self._lora = lora_config(self.model) is not None
        if self._lora and self._mode == "view" and getattr(self.policy, "lora_enabled", False):
            raise ConfigError(
                "dist: a vLLM engine that serves LoRA adapters cannot follow a sharded LoRA "
                "model (the ranks push merged full weights); build the engine without lora"
            )
        if self._mode == "copy":
            self._push(bump=False)

    # ------------------------------------------------------------------ collectives
    def _broadcast(self, obj: Any = None) -> Any:
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def _gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.dist.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def _push(self, bump: bool) -> str:
        """Gather the sharded weights to the generators (every rank takes part in the gathers)."""
        main = self.generates
        if self._mode == "view":
            state = full_state(self.model, main, self._gen_dtype)
            if not main:
                return "gathered"
            if self._lora:  # the generator has its own base-architecture weights
                state = merged_lora_state(self.model, state)
            return sync_weights(self.policy, _FullWeights(state))
        own = dict(self.generator.named_parameters()) if self.generator is not None else {}
        with torch.no_grad():
            for name, full in full_parameters(self.model):
                if name in own:
                    own[name].copy_(full)
        version = getattr(self.policy, "version", None)
        if bump and main and isinstance(version, int) and not isinstance(version, bool):
            self.policy.version = version + 1
        return "gathered"

    def _sync(self) -> str:
        return self._push(bump=True)

    # ------------------------------------------------------------------ step
    def samples(self, trees: Sequence[Any], lag: int = 0) -> tuple[list[Sample], dict[str, float]]:
        """The samples of the step's trees: built on every rank from the gathered trees
        (``dist.rollouts = "all"``), else built on rank 0 and broadcast."""
        if self.all_generate:
            return super().samples(trees, lag)
        return self._broadcast(super().samples(trees, lag))

    def train_step(self, step: int) -> dict[str, Any]:
        if self.dist.is_main or self.all_generate:
            # kept for the checkpoint: a kill between the checkpoint and the metrics row loses no row
            self.last_metrics = super().train_step(step)
            return self.last_metrics
        samples, counts = self._broadcast()
        upd = self.update(samples, step) if samples else {}
        self._sync()
        return {"step": step, "reward": 0.0, "effective_ratio": 0.0, **counts, **upd}

    def evaluate(self) -> dict[str, float]:
        return super().evaluate() if self.dist.is_main else {}

    def _log(self, m: dict[str, Any]) -> None:
        if self.dist.is_main:
            super()._log(m)
        else:
            self.history.append(m)

    # ------------------------------------------------------------------ update
    def _mine(self, idx: Sequence[int]) -> list[int]:
        return [int(i) for i in idx[self.dist.rank :: self.dist.world_size]]

    def _idle_forward(self, sample: Sample, backward: bool, reference: bool = False) -> None:
        """A zero-weight pass: keeps this rank in step with the collectives of busier ranks."""
        model = self.ref_model if reference else self.model
        with torch.set_grad_enabled(backward):
            logp, _ = self._forward(model, collate([sample], self._pad_id()))
            if backward:
                (logp.sum() * 0.0).backward()

    def _scored(self, samples: list[Sample], reference: bool) -> list[Any]:
        mine = self._mine(range(len(samples)))
        rows = self._logprobs_no_grad([samples[i] for i in mine], reference=reference)
        mbs = self.config.optim.micro_batch_size
        for _ in range(
            _micro_count(len(samples), self.dist.world_size, mbs) - math.ceil(len(mine) / mbs)
        ):
            self._idle_forward(
                samples[0], backward=False, reference=reference and self.ref_model is not None
            )
        merged: dict[int, Any] = {}
        for part in self._gather(dict(zip(mine, rows, strict=True))):
            merged.update(part)
        return [merged[i] for i in range(len(samples))]

    def _old_logprobs(self, samples: list[Sample]) -> OldLogprobs:
        """Each rank scores its share of the samples; every rank gets all rows."""
        self.model.eval()
        old = self._scored(samples, reference=False)
        ref = self._scored(samples, reference=True) if self.config.algo.kl_coef > 0 else None
        return OldLogprobs(old, ref)

    def _optimizer_step(
        self, samples: list[Sample], idx: Sequence[int], old: OldLogprobs, stats: UpdateStats
    ) -> None:
        """One AdamW step on the mini-batch `samples[idx]`: this rank's share, the whole batch's normaliser."""
        a, o = self.config.algo, self.config.optim
        tokens = float(sum(samples[i].num_trained for i in idx))
        norm = {
            "tokens": tokens,
            "seqs": float(len(idx)),
            "constant": float(len(idx) * a.dr_grpo_len),
        }
        mine, mbs = self._mine(idx), o.micro_batch_size
        n_micro = _micro_count(len(idx), self.dist.world_size, mbs)
        self.optimizer.zero_grad(set_to_none=True)
        local = UpdateStats()
        for k in range(n_micro):
            if self.config.dist.accumulate_unsharded:
                self.model.set_requires_gradient_sync(k == n_micro - 1)
            mid = mine[k * mbs : (k + 1) * mbs]
            if not mid:
                self._idle_forward(samples[int(idx[0])], backward=True)
                continue
            rows = OldLogprobs(
                [old.old[i] for i in mid], None if old.ref is None else [old.ref[i] for i in mid]
            )
            local.add_micro(*self._micro_step([samples[i] for i in mid], rows, norm))
        _merge_stats(stats, self._gather((local.values, local.mismatch, local.mismatch_n)))
        stats.add_step(self._clip(o.grad_clip))
        self.optimizer.step()

    def _clip(self, max_norm: float) -> float:
        """Clip the (sharded) gradients to `max_norm` over the whole model; the total norm before clipping."""
        if max_norm <= 0:
            return 0.0
        params = [p for p in self.model.parameters() if p.requires_grad]
        gn = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)

    def _agree_stop(self, requested: bool) -> bool:
        """Stop when any rank saw Ctrl-C, so every rank writes the same checkpoint."""
        flag = torch.tensor([1.0 if requested else 0.0], device=self.dist.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item() > 0)

    # ------------------------------------------------------------------ checkpoints
    def save(self):
        from trace_gym.trainers.dist_ckpt import save_sharded

        return save_sharded(self)

    def load(self) -> bool:
        from trace_gym.trainers.dist_ckpt import load_sharded

        return load_sharded(self)

    def close(self) -> None:
        """Leave the process group."""
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _merge_stats(
    stats: UpdateStats, parts: list[tuple[dict[str, list[tuple[float, float]]], float, float]]
) -> None:
    """Add every rank's micro-batch statistics of one optimiser step to `stats` (sums over ranks:
    each micro-batch loss is a share of the whole mini-batch's loss)."""
    for values, mismatch, mismatch_n in parts:
        for k, vals in values.items():
            if k != "grad_norm":
                stats.values[k].extend(vals)
        stats.mismatch += mismatch
        stats.mismatch_n += mismatch_n


def make_trainer(cfg: TrainConfig, **parts: Any) -> Trainer:
    """A `ShardedTrainer` when `cfg` runs sharded in this process (`wants_sharding`), else a `Trainer`."""
    return ShardedTrainer(cfg, **parts) if wants_sharding(cfg) else Trainer(cfg, **parts)
