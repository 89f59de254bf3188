"""FSDP2 sharded training (`trace_gym.trainers.sharding`) against the single-process trainer.

Fast: one rank in this process (a private gloo group), on the char-level Qwen3 - the sharded
code path (fully_shard, gathered generator copy, DCP checkpoints) gives the plain trainer's
losses and weights, and resumes from its sharded checkpoint. Slow: 2 ranks under torchrun
(gloo) on the tiny Qwen3 - equal to one process within `TOLERANCE`, a SUM/AVG mix-up in the
gradient reduction is caught, and a job killed after a checkpoint resumes on 1 and on 2
ranks and ends where the uninterrupted job ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from trace_gym.bench.train import (  # noqa: E402
    DEFAULT_CONFIG,
    TOLERANCE,
    launch_command,
    run_bench,
    run_launch,
    write_config,
)
from trace_gym.trainers.config import TrainConfig  # noqa: E402
from trace_gym.trainers.loop import Trainer  # noqa: E402
from trace_gym.trainers.sharding import (  # noqa: E402
    FAULT_ENV,
    DistEnv,
    ShardedTrainer,
    full_state,
    merged_lora_state,
    wants_sharding,
)
from trace_gym.trainers.sync import export_weights  # noqa: E402

from trace_gym.errors import ConfigError  # noqa: E402


def tiny_config(tmp_path, name="run", **over) -> TrainConfig:
    d = {
        "steps": 2,
        "seed": 3,
        "out_dir": str(tmp_path / name),
        "tensorboard": False,
        "progress": False,
        "policy": {"kind": "custom"},
        "rollout": {
            "allocator": "trace",
            "predictor": "empirical",
            "root_budget": 6,
            "replays_per_root": 1.0,
            "candidates_per_step": 3,
            "group_size": 2,
        },
        "algo": {"name": "treerpo", "kl_coef": 0.05},
        "optim": {"lr": 1e-3, "micro_batch_size": 2, "mini_batch_size": 8},
        "dist": {"strategy": "fsdp"},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    return TrainConfig.from_dict(d)


@pytest.fixture
def one_rank():
    """Leave no process group behind (each ShardedTrainer here makes a one-rank group)."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _weights(tr) -> dict[str, torch.Tensor]:
    if isinstance(tr, ShardedTrainer):
        return full_state(tr.model, True, None)
    return {n: t.detach() for n, t in tr.model.state_dict().items()}


def _max_diff(a, b) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_one_rank_sharded_equals_plain_and_resumes(
    tmp_path, policy_factory, guess_env_factory, one_rank
):
    plain = Trainer(
        tiny_config(tmp_path, "plain", dist={"strategy": "none"}),
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    ph = plain.run()
    cfg = tiny_config(tmp_path, "sharded", steps=1)
    first = ShardedTrainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)
    assert (
        first.ref_model is not None
        and first.generator is not None
        and first.policy.model is first.generator
    )
    first.run()
    ckpt = tmp_path / "sharded" / "checkpoints" / "step_000001"
    assert (ckpt / "dcp" / ".metadata").exists() and (ckpt / "checksums.json").exists()
    resumed = ShardedTrainer(
        tiny_config(tmp_path, "sharded", steps=2),
        env=first.dist,
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    sh = resumed.run()
    assert [m["step"] for m in sh] == [1]  # nothing rerun, nothing skipped
    assert ph[1]["samples"] == sh[0]["samples"] > 0
    assert (
        abs(ph[1]["loss"] - sh[0]["loss"]) < 1e-6
        and abs(ph[1]["grad_norm"] - sh[0]["grad_norm"]) < 1e-6
    )
    assert _max_diff(_weights(plain), _weights(resumed)) < 1e-6
    # the generator copy holds the trained weights
    gen = dict(resumed.generator.named_parameters())
    assert (
        max(
            float((gen[n] - t).abs().max())
            for n, t in full_state(resumed.model, True, None).items()
            if n in gen
        )
        == 0.0
    )


def test_damaged_sharded_checkpoint_is_skipped(
    tmp_path, policy_factory, guess_env_factory, one_rank
):
    cfg = tiny_config(tmp_path, steps=2, algo={"kl_coef": 0.0})
    tr = ShardedTrainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)
    tr.run()
    newest = tmp_path / "run" / "checkpoints" / "step_000002"
    shard = next((newest / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-8])
    again = ShardedTrainer(cfg, env=tr.dist, policy=policy_factory(), env_factory=guess_env_factory)
    with pytest.warns(RuntimeWarning, match="checksum"):
        assert again.load()
    assert again.step == 1


def test_strategy_checks(tmp_path, monkeypatch, policy_factory, guess_env_factory):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="strategy = 'none'"):
        wants_sharding(tiny_config(tmp_path, dist={"strategy": "none"}))
    assert wants_sharding(tiny_config(tmp_path, dist={"strategy": "auto"}))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not wants_sharding(tiny_config(tmp_path, dist={"strategy": "auto"}))
    two = DistEnv(rank=0, world_size=2, local_rank=0, device="cpu", backend="gloo")
    for dist in ({"rollouts": "rank0"}, {"rollouts": "all"}):
        rollout = {} if dist["rollouts"] == "rank0" else {"ray_address": "local"}
        cfg = tiny_config(
            tmp_path, policy={"kind": "vllm", "path": str(tmp_path)}, dist=dist, rollout=rollout
        )
        # an engine on rank 0 alone would wait forever for the others in vLLM's start-up
        with pytest.raises(ConfigError, match="every rank to generate"):
            ShardedTrainer(cfg, env=two, env_factory=guess_env_factory)
    with pytest.raises(ConfigError, match="dist strategy"):
        tiny_config(tmp_path, dist={"strategy": "ddp"})
    with pytest.raises(ConfigError, match="param_dtype"):
        tiny_config(tmp_path, dist={"param_dtype": "fp8"})


# ---------------------------------------------------------------------- 2 ranks (torchrun, gloo)
def _config(steps: int, **sections) -> dict:
    d = json.loads(json.dumps(DEFAULT_CONFIG))
    d["steps"] = steps
    d["algo"]["kl_coef"] = 0.05  # the reference model is sharded too
    for name, values in sections.items():
        d.setdefault(name, {}).update(values)
    return d


@pytest.mark.slow
def test_two_ranks_equal_one_process_and_catch_sum_avg_mixup(tmp_path, monkeypatch):
    rep = run_bench(_config(2), [2], tmp_path)
    two = rep["world_sizes"]["2"]
    assert two["same_samples"], two
    for key, tol in TOLERANCE.items():
        assert two[key] is not None and two[key] <= tol, (key, two[key])
    assert two["within_tolerance"]
    # the same run with the gradients averaged over ranks instead of summed
    monkeypatch.setenv(FAULT_ENV, "avg")
    bad = run_launch(_config(2), tmp_path / "avg", 2)
    from trace_gym.bench.train import compare

    diff = compare(
        tmp_path / "ref",
        tmp_path / "avg",
        [json.loads((tmp_path / "ref" / "rank0.json").read_text())],
        bad,
    )
    assert diff["max_abs_grad_diff"] > 100 * TOLERANCE["max_abs_grad_diff"]
    assert diff["grad_norm_diff"] > 0.3 * two["grad_norm"][0]  # halved with 2 ranks


def _final_weights(run_dir) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    out = run_dir.parent / f"final-{latest}.pt"
    dcp_to_torch_save(run_dir / "checkpoints" / latest / "dcp", out)
    return torch.load(out, weights_only=False)["model"]


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun's workers run in their own process groups)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _kill_after_first_checkpoint(out, world: int) -> int:
    """Start the job, SIGKILL it the moment its first checkpoint is in place; metric rows logged by then."""
    proc = subprocess.Popen(
        launch_command(out, world),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    latest = out / "run" / "checkpoints" / "latest"
    deadline = time.monotonic() + 900
    while not (latest.exists() and latest.read_text().strip() == "step_000001"):
        assert proc.poll() is None and time.monotonic() < deadline, (
            "the job ended before its first checkpoint"
        )
        time.sleep(0.05)
    for pid in [
        *_descendants(proc.pid),
        proc.pid,
    ]:  # the workers first, or torchrun would restart none
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    metrics = out / "run" / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


@pytest.mark.slow
def test_kill_and_resume_on_one_and_two_ranks(tmp_path):
    cfg = _config(3)
    run_launch(cfg, tmp_path / "full", 2)
    want = _final_weights(tmp_path / "full" / "run")
    write_config(cfg, tmp_path / "killed", 2, resume=True)
    logged = _kill_after_first_checkpoint(tmp_path / "killed", 2)
    shutil.copytree(tmp_path / "killed", tmp_path / "killed2")
    for out, world in ((tmp_path / "killed", 1), (tmp_path / "killed2", 2)):
        res = run_launch(cfg, out, world, resume=True)
        steps = [r["step"] for r in res[0]["history"]]
        # resumed from the checkpoint after step 0 (or a later one): only the step in flight was lost
        assert steps == list(range(steps[0], 3)) and steps[0] >= max(logged, 1), (steps, logged)
        got = _final_weights(out / "run")
        diff = max(float((got[k] - want[k]).abs().max()) for k in want)
        assert diff <= TOLERANCE["max_abs_weight_diff"], (world, diff)
        rows = [
            json.loads(x)["step"] for x in (out / "run" / "metrics.jsonl").read_text().splitlines()
        ]
        assert rows == [0, 1, 2]


@pytest.mark.slow
def test_two_ranks_checkpointing_unsharded_accumulation_and_bf16(tmp_path):
    """Activation checkpointing and accumulating unsharded gradients change no number (fp32
    tolerance); bf16 compute with fp32 reduction (and an fp32 generator, so the trees are the
    same) stays within bf16 rounding of the fp32 single process."""
    from trace_gym.bench.train import compare

    ref = run_launch(_config(1), tmp_path / "ref", None)
    exact = run_launch(
        _config(1, policy={"gradient_checkpointing": True}, dist={"accumulate_unsharded": True}),
        tmp_path / "exact",
        2,
    )
    d = compare(tmp_path / "ref", tmp_path / "exact", ref, exact)
    assert d["same_samples"] and all(d[k] <= tol for k, tol in TOLERANCE.items()), d
    mixed = {"param_dtype": "bfloat16", "reduce_dtype": "float32", "generator_dtype": "float32"}
    bf16 = run_launch(_config(1, dist=mixed), tmp_path / "bf16", 2)
    d = compare(tmp_path / "ref", tmp_path / "bf16", ref, bf16)
    assert d["same_samples"] and d["loss_diff"] < 1e-2, d
    assert d["grad_norm_diff"] < 0.05 * ref[0]["history"][0]["grad_norm"], d
    assert d["max_abs_grad_diff"] > TOLERANCE["max_abs_grad_diff"]  # bf16 really was used


class _OwnWeights:
    """A generator with its own model that takes pushed weights (``sync_weights(model)``)."""

    def __init__(self, inner):
        self.inner, self.version, self.pushes = inner, 0, 0

    def sync_weights(self, model) -> None:
        self.pushes += 1
        self.inner.model.load_state_dict(dict(model.state_dict()))

    def generate(self, conversations):
        return self.inner.generate(conversations)


def test_one_rank_pushes_full_weights_to_a_generator_with_its_own(
    tmp_path, policy_factory, guess_env_factory, one_rank
):
    policy_factory().model.save_pretrained(
        tmp_path / "model"
    )  # the trainer's copy is loaded from here
    gen = _OwnWeights(policy_factory())
    cfg = tiny_config(
        tmp_path, steps=1, policy={"path": str(tmp_path / "model")}, algo={"kl_coef": 0.0}
    )
    tr = ShardedTrainer(cfg, policy=gen, env_factory=guess_env_factory)
    assert tr.generator is None and tr.model is not gen.inner.model
    hist = tr.run()
    assert (
        hist[0]["samples"] > 0 and gen.pushes == 2 and gen.version == 2
    )  # build_parts, then after the step
    full = full_state(tr.model, True, None)
    assert _max_diff(full, dict(gen.inner.model.state_dict())) == 0.0


def test_a_checkpoint_before_the_first_update_leaves_adam_fresh(
    tmp_path, policy_factory, guess_env_factory, one_rank
):
    """DCP's state dict of an optimizer without state initialises it by a zero-gradient,
    lr-0 step: Adam's step count would be 1, and the first real update 0.74x a fresh one's
    (a run whose first step had no samples diverged from one process by 0.26 lr)."""
    from trace_gym.trainers.dist_ckpt import save_sharded

    plain = Trainer(
        tiny_config(tmp_path, "plain", steps=1, dist={"strategy": "none"}),
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    ph = plain.run()
    tr = ShardedTrainer(
        tiny_config(tmp_path, "sh", steps=1), policy=policy_factory(), env_factory=guess_env_factory
    )
    save_sharded(tr)  # step 0, nothing trained yet
    assert tr.optimizer.state and all(int(s["step"]) == 0 for s in tr.optimizer.state.values())
    sh = tr.run()  # resumes from that checkpoint, then trains step 0
    assert ph[0]["samples"] == sh[0]["samples"] > 0
    assert _max_diff(_weights(plain), _weights(tr)) < 1e-6


# ---------------------------------------------------------------------- LoRA
LORA = {"lora": True, "lora_r": 4, "lora_alpha": 8}


def test_one_rank_lora_sharded_equals_plain_and_resumes(
    tmp_path, policy_factory, guess_env_factory, one_rank
):
    """A LoRA-wrapped model sharded (frozen base and adapters in the same FSDP units, an
    adapter-only optimiser): the plain trainer's losses and weights, the base model as the
    KL reference, a peft generator copy holding the trained adapters, and a resume."""
    plain = Trainer(
        tiny_config(tmp_path, "plain", dist={"strategy": "none"}, policy=LORA),
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    ph = plain.run()
    first = ShardedTrainer(
        tiny_config(tmp_path, "sharded", steps=1, policy=LORA),
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    assert first.ref_model is None and hasattr(first.generator, "peft_config")
    trained = {id(p) for g in first.optimizer.param_groups for p in g["params"]}
    named = dict(first.model.named_parameters())
    assert trained == {id(p) for n, p in named.items() if "lora_" in n}  # adapters only
    first.run()
    resumed = ShardedTrainer(
        tiny_config(tmp_path, "sharded", steps=2, policy=LORA),
        env=first.dist,
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    sh = resumed.run()
    assert [m["step"] for m in sh] == [1]
    assert ph[1]["samples"] == sh[0]["samples"] > 0
    assert abs(ph[1]["loss"] - sh[0]["loss"]) < 1e-6
    assert abs(ph[1]["grad_norm"] - sh[0]["grad_norm"]) < 1e-6
    final = _weights(resumed)
    assert _max_diff(_weights(plain), final) < 1e-6
    assert any(float(final[n].abs().max()) > 0 for n in final if "lora_B" in n)  # B moved off 0
    gen = dict(resumed.generator.named_parameters())
    assert set(gen) == {n for n, _ in resumed.model.named_parameters()}
    assert max(float((gen[n] - final[n]).abs().max()) for n in gen) == 0.0


class _MergedWeights(_OwnWeights):
    """A generator on the base architecture that takes merged full weights."""

    def sync_weights(self, model) -> None:
        self.pushes += 1
        self.inner.model.load_state_dict(dict(export_weights(model)), strict=True)


def test_one_rank_lora_pushes_merged_weights_to_a_generator_with_its_own(
    tmp_path, policy_factory, guess_env_factory, one_rank
):
    policy_factory().model.save_pretrained(tmp_path / "model")
    over = {"path": str(tmp_path / "model"), **LORA}
    plain = Trainer(
        tiny_config(tmp_path, "plain", steps=1, policy=over, dist={"strategy": "none"}),
        policy=_MergedWeights(policy_factory()),
        env_factory=guess_env_factory,
    )
    plain.run()
    gen = _MergedWeights(policy_factory())
    tr = ShardedTrainer(
        tiny_config(tmp_path, "sh", steps=1, policy=over), policy=gen, env_factory=guess_env_factory
    )
    assert tr.generator is None
    hist = tr.run()
    assert hist[0]["samples"] > 0 and gen.pushes == 2
    want = dict(export_weights(plain.model))  # peft's own merge of the one-process model
    got = dict(gen.inner.model.state_dict())
    assert _max_diff(want, got) < 1e-6
    assert _max_diff(want, merged_lora_state(tr.model, full_state(tr.model, True, None))) < 1e-6


@pytest.mark.slow
def test_two_ranks_lora_equal_one_process(tmp_path):
    """LoRA on 2 gloo ranks under torchrun (the base model as the KL reference) against one
    process: the same samples, gradients, losses and weights (Adam's eps is the bench
    config's 1e-6: docs/distributed.md, "LoRA with FSDP")."""
    from trace_gym.bench.train import compare

    lora = {"lora": True, "lora_r": 4, "lora_alpha": 8}
    cfg = _config(2, policy=lora)
    ref = run_launch(cfg, tmp_path / "ref", None)
    two = run_launch(cfg, tmp_path / "two", 2)
    d = compare(tmp_path / "ref", tmp_path / "two", ref, two)
    assert d["same_samples"] and all(d[k] <= tol for k, tol in TOLERANCE.items()), d
    final = torch.load(tmp_path / "two" / "final.pt", weights_only=False)
    assert final["grads"] and all("lora_" in n for n in final["grads"])  # adapters alone train
    # activation checkpointing with LoRA (inputs made to require grad) changes no number
    ckpt = run_launch(
        _config(1, policy={**lora, "gradient_checkpointing": True}),
        tmp_path / "ckpt",
        2,
    )
    one = run_launch(_config(1, policy=lora), tmp_path / "one", None)
    d = compare(tmp_path / "one", tmp_path / "ckpt", one, ckpt)
    assert d["same_samples"] and all(d[k] <= tol for k, tol in TOLERANCE.items()), d
