"""The training loop end to end on a tiny char-level Qwen3: metrics, checkpoints, resume."""

from __future__ import annotations

import json
import os
import signal

import pytest

pytest.importorskip("transformers")

from trace_gym.trainers.config import TrainConfig  # noqa: E402
from trace_gym.trainers.loop import Trainer  # noqa: E402

from trace_gym.errors import ConfigError, UnknownNameError  # noqa: E402
from trace_gym.tree import load_trees  # noqa: E402


def tiny_config(tmp_path, name="run", **over) -> TrainConfig:
    d = {
        "steps": 2,
        "seed": 3,
        "out_dir": str(tmp_path / name),
        "save_trees": True,
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
        "algo": {"name": "treerpo"},
        "optim": {"lr": 1e-3, "micro_batch_size": 3, "mini_batch_size": 8},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    return TrainConfig.from_dict(d)


def test_two_steps_write_metrics_trees_and_checkpoint(tmp_path, policy_factory, guess_env_factory):
    cfg = tiny_config(tmp_path, tensorboard=True, eval_every=2, eval_tasks=2, eval_samples=2)
    hist = Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory).run()
    assert [m["step"] for m in hist] == [0, 1]
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [0, 1]
    for key in (
        "reward",
        "effective_ratio",
        "mixed_groups",
        "contrastive_pairs",
        "kl",
        "entropy",
        "clip_frac",
        "gen_tokens_per_s",
        "time_rollout_s",
        "time_train_s",
        "eval_success",
        "prompts",  # distinct prompts this step
        "health_d0_gain_rank",  # predictor health (docs/alloc.md "Predictor health")
        "health_d0_ece",
        "health_d0_distinct",
    ):
        assert key in rows[-1], key
    assert rows[0]["samples"] > 0 and rows[0]["trained_tokens"] > 0
    assert rows[0]["logprob_mismatch"] < 1e-4  # trainer recomputation == generator logprobs
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step_000002"
    assert list((tmp_path / "run" / "tb").iterdir())
    trees = load_trees(tmp_path / "run" / "trees" / "step_000000.jsonl.gz")
    assert sum(len(t.root.children) for t in trees) == 6


def test_update_changes_weights_and_generator_shares_them(
    tmp_path, policy_factory, guess_env_factory
):
    import torch

    tr = Trainer(
        tiny_config(tmp_path, steps=1), policy=policy_factory(), env_factory=guess_env_factory
    )
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.run()
    assert tr.sync_mode == "shared" and tr.policy.model is tr.model
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))


def _trees_tokens(path):
    return [
        [(n.id, n.parent, None if n.turn is None else n.turn.token_ids, n.reward) for n in t.nodes]
        for t in load_trees(path)
    ]


def test_resume_after_kill_replays_identical_data(
    tmp_path, policy_factory, guess_env_factory, monkeypatch
):
    full = Trainer(
        tiny_config(tmp_path, "full", steps=3),
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    full.run()

    cfg = tiny_config(tmp_path, "killed", steps=3)
    tr = Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)
    original = Trainer.update

    def dies_in_step_2(self, samples, step):
        if step == 2:
            raise KeyboardInterrupt("killed mid-step")
        return original(self, samples, step)

    monkeypatch.setattr(Trainer, "update", dies_in_step_2)
    with pytest.raises(KeyboardInterrupt):
        tr.run()
    monkeypatch.setattr(Trainer, "update", original)
    assert (tmp_path / "killed" / "checkpoints" / "latest").read_text() == "step_000002"

    resumed = Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)
    hist = resumed.run()
    assert [m["step"] for m in hist] == [2]
    assert _trees_tokens(tmp_path / "full" / "trees" / "step_000002.jsonl.gz") == _trees_tokens(
        tmp_path / "killed" / "trees" / "step_000002.jsonl.gz"
    )
    import torch

    for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    rows = [
        json.loads(x)["step"]
        for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows == [0, 1, 2]


def test_resume_loads_state_into_the_configured_predictor(
    tmp_path, policy_factory, guess_env_factory
):
    """The checkpoint holds the predictor's state_dict; resuming loads it into the predictor
    and visit table the new run built, rather than swapping in unpickled objects."""
    cfg = tiny_config(tmp_path, steps=1)
    first = Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)
    first.run()
    assert first.runner.predictor.prompts and first.runner.history
    second = Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)
    predictor, history = second.runner.predictor, second.runner.history
    assert not predictor.prompts and not history
    assert second.load()
    assert second.runner.predictor is predictor and second.runner.history is history
    assert predictor.state_dict() == first.runner.predictor.state_dict()
    assert history == first.runner.history


@pytest.mark.parametrize(
    "section,key,value,err",
    [
        ("algo", "name", "ppo", UnknownNameError),
        ("rollout", "allocator", "nope", UnknownNameError),
        ("rollout", "predictor", "nope", UnknownNameError),
        ("algo", "aggregation", "median", UnknownNameError),
        ("algo", "dual_clip", 0.5, ConfigError),
        ("optim", "bogus", 1, ConfigError),
    ],
)
def test_bad_config_fails_at_construction(tmp_path, section, key, value, err):
    with pytest.raises(err):
        tiny_config(tmp_path, **{section: {key: value}})


@pytest.mark.parametrize(
    "algo,allocator", [("grpo", "grpo"), ("tree_grpo", "treepo"), ("treepo", "trace")]
)
def test_every_optimiser_runs_a_step(tmp_path, policy_factory, guess_env_factory, algo, allocator):
    cfg = tiny_config(
        tmp_path,
        steps=1,
        save_every=0,
        algo={"name": algo, "aggregation": "seq_mean", "kl_coef": 0.01},
        rollout={"allocator": allocator},
    )
    hist = Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory).run()
    assert hist[0]["samples"] > 0 and hist[0]["kl"] >= 0.0


def test_lora_trains_only_adapters(tmp_path, policy_factory, guess_env_factory):
    pytest.importorskip("peft")
    cfg = tiny_config(
        tmp_path,
        steps=1,
        policy={
            "lora": True,
            "lora_r": 4,
            "lora_targets": ["q_proj", "v_proj"],
            "gradient_checkpointing": True,
        },
        algo={"kl_coef": 0.01},
    )
    tr = Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)
    trainable = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    hist = tr.run()
    assert tr.policy.model is tr.model and hist[0]["samples"] > 0


def test_positive_advantage_raises_logprob_negative_lowers_it(
    tmp_path, policy_factory, guess_env_factory
):
    import torch
    from trace_gym.trainers.data import Sample, collate

    tr = Trainer(
        tiny_config(tmp_path, steps=1, optim={"lr": 1e-2}),
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    ids = [5, 6, 7, 8, 9, 10]
    good = Sample(ids, [0, 0, 0, 1, 1, 1], 1.0, 1.0, [0.0] * 6)
    bad = Sample(ids[::-1], [0, 0, 0, 1, 1, 1], -1.0, 1.0, [0.0] * 6)

    def trained_logp(s):
        with torch.no_grad():
            lp, _ = tr._forward(tr.model, collate([s]))
        return float((lp[0] * torch.tensor(s.loss_mask)).sum())

    g0, b0 = trained_logp(good), trained_logp(bad)
    tr.update([good, bad], step=0)
    assert trained_logp(good) > g0 and trained_logp(bad) < b0


def test_near_certain_generator_logprobs_count_as_known(
    tmp_path, policy_factory, guess_env_factory
):
    """Generator logprobs of 0.0 that were recorded enter the mismatch diagnostic and the
    truncated importance weight; unrecorded ones (no mask) do not."""
    import torch
    from trace_gym.trainers.data import Sample

    tr = Trainer(
        tiny_config(tmp_path, steps=1, algo={"tis_cap": 2.0}),
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )
    ids, mask = [5, 6, 7, 8, 9, 10], [0, 0, 0, 1, 1, 1]
    state = {k: v.clone() for k, v in tr.model.state_dict().items()}
    old = tr._old_logprobs([Sample(ids, mask, 1.0, 1.0, [0.0] * 6)]).old[0]
    expected = float(old[3:].abs().mean())  # |trainer - generator| on the trained tokens
    assert expected > 0.1  # a random-init model is far from certain
    known = tr.update([Sample(ids, mask, 1.0, 1.0, [0.0] * 6, gen_known=[1] * 6)], step=0)
    assert known["logprob_mismatch"] == pytest.approx(expected, rel=1e-5)
    tr.model.load_state_dict(state)
    unknown = tr.update([Sample(ids, mask, 1.0, 1.0, [0.0] * 6)], step=0)
    assert unknown["logprob_mismatch"] == 0.0
    assert (
        torch.isfinite(torch.tensor(known["loss"])) and known["loss"] != unknown["loss"]
    )  # TIS weights differ


class _FakeVLLMPolicy:
    """A generator with its own weights behind a vLLM-like engine path (llm...model.load_weights)."""

    def __init__(self, inner):
        from types import SimpleNamespace

        self.inner = inner  # a CharPolicy around a separate model copy
        self.loads = 0
        self.resets = 0

        def load_weights(weights):
            self.loads += 1
            state = dict(weights)
            missing, unexpected = inner.model.load_state_dict(state, strict=False)
            assert not unexpected, unexpected

        def reset_prefix_cache():
            self.resets += 1

        runner = SimpleNamespace(model=SimpleNamespace(load_weights=load_weights))
        self.llm = SimpleNamespace(
            llm_engine=SimpleNamespace(
                model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner))
            ),
            reset_prefix_cache=reset_prefix_cache,
        )

    def generate(self, conversations):
        return self.inner.generate(conversations)


@pytest.mark.parametrize("lora", [False, True])
def test_generator_with_own_weights_gets_them_pushed(
    tmp_path, policy_factory, guess_env_factory, lora
):
    import torch

    policy_factory().model.save_pretrained(
        tmp_path / "model"
    )  # the trainer's copy is loaded from here
    gen = _FakeVLLMPolicy(policy_factory())
    policy = {
        "path": str(tmp_path / "model"),
        "lora": lora,
        "lora_r": 4,
        "lora_targets": ["q_proj", "v_proj"],
    }
    tr = Trainer(
        tiny_config(tmp_path, steps=1, policy=policy), policy=gen, env_factory=guess_env_factory
    )
    assert tr.sync_mode == "vllm" and tr.model is not gen.inner.model
    hist = tr.run()
    assert (
        hist[0]["samples"] > 0 and gen.loads == 2 and gen.resets == 2
    )  # at start-up and after the step
    import copy

    # peft's own merge, on a copy (the engine must get the adapters merged in, not the base)
    trained = copy.deepcopy(tr.model)
    trained = (trained.merge_and_unload() if lora else trained).state_dict()
    for name, w in gen.inner.model.state_dict().items():
        assert torch.allclose(w, trained[name], atol=1e-6), name
    if lora:
        base = policy_factory().model.state_dict()
        assert max(float((w - base[n]).abs().max()) for n, w in trained.items()) > 1e-5


# ---------------------------------------------------------------------- damaged checkpoints
_RUNS: dict[str, object] = {}


@pytest.fixture
def two_checkpoints(tmp_path_factory, policy_factory, guess_env_factory):
    """A run dir after 2 steps with checkpoints step_000001 and step_000002 (made once, copied per test)."""
    if "run" not in _RUNS:
        base = tmp_path_factory.mktemp("ckpts")
        Trainer(
            tiny_config(base, keep_checkpoints=3),
            policy=policy_factory(),
            env_factory=guess_env_factory,
        ).run()
        _RUNS["run"] = base / "run"
    return _RUNS["run"]


def _resume_copy(tmp_path, source, policy_factory, guess_env_factory, damage):
    import shutil

    shutil.copytree(source, tmp_path / "run")
    damage(tmp_path / "run")
    return Trainer(
        tiny_config(tmp_path, steps=3, keep_checkpoints=3),
        policy=policy_factory(),
        env_factory=guess_env_factory,
    )


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (
            lambda run: _truncate(run / "checkpoints" / "step_000002" / "trainer.safetensors"),
            "trainer.safetensors does not match its checksum",
        ),
        (
            lambda run: _truncate(run / "checkpoints" / "step_000002" / "state.json"),
            "state.json does not match its checksum",
        ),
        (
            lambda run: _flip_byte(run / "checkpoints" / "step_000002" / "trainer.safetensors"),
            "trainer.safetensors does not match its checksum",
        ),
        (
            lambda run: (run / "checkpoints" / "step_000002" / "state.json").unlink(),
            "state.json is missing",
        ),
        (
            lambda run: __import__("shutil").rmtree(run / "checkpoints" / "step_000002"),
            "names 'step_000002', which is missing",
        ),
    ],
    ids=[
        "trainer-cut",
        "state-cut",
        "trainer-bitflip",
        "state-gone",
        "latest-missing",
    ],
)
def test_resume_falls_back_to_the_newest_valid_checkpoint(
    tmp_path, two_checkpoints, policy_factory, guess_env_factory, damage, why
):
    tr = _resume_copy(tmp_path, two_checkpoints, policy_factory, guess_env_factory, damage)
    with pytest.warns(RuntimeWarning) as caught:
        assert tr.load()
    messages = " | ".join(str(w.message) for w in caught)
    assert why in messages and "step_000001" in messages
    assert tr.step == 1
    rows = [
        json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows == [0]  # step 1's row is rerun


def test_checkpoints_without_checksums_still_load(
    tmp_path, two_checkpoints, policy_factory, guess_env_factory
):
    tr = _resume_copy(
        tmp_path,
        two_checkpoints,
        policy_factory,
        guess_env_factory,
        lambda run: (run / "checkpoints" / "step_000002" / "checksums.json").unlink(),
    )
    assert tr.load() and tr.step == 2


def test_no_valid_checkpoint_is_a_config_error(
    tmp_path, two_checkpoints, policy_factory, guess_env_factory
):
    def damage_all(run):
        for p in (run / "checkpoints").glob("step_*/trainer.safetensors"):
            _truncate(p)

    tr = _resume_copy(tmp_path, two_checkpoints, policy_factory, guess_env_factory, damage_all)
    with pytest.warns(RuntimeWarning), pytest.raises(ConfigError, match="no usable checkpoint"):
        tr.load()


def test_a_torn_last_metrics_row_does_not_stop_resume(
    tmp_path, two_checkpoints, policy_factory, guess_env_factory
):
    def tear(run):
        with open(run / "metrics.jsonl", "a") as f:
            f.write('{"step": 2, "rew')  # killed while logging step 2

    tr = _resume_copy(tmp_path, two_checkpoints, policy_factory, guess_env_factory, tear)
    with pytest.warns(RuntimeWarning, match="dropped 1 unreadable row"):
        hist = tr.run()
    assert [m["step"] for m in hist] == [2]
    rows = [
        json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows == [0, 1, 2]


# ---------------------------------------------------------------------- issues 26.8, 27.4, 27.5
def _touch(path):
    with open(path, "w") as f:
        f.write("ran")
    return {}


class Marker:
    """A pickle that writes a file when it is loaded (what a hostile checkpoint would do)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (_touch, (self.path,))


def _rows(run):
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _train(cfg, policy_factory, guess_env_factory):
    return Trainer(cfg, policy=policy_factory(), env_factory=guess_env_factory)


def _to_legacy(ckpt, marker):
    """Rewrite a checkpoint dir in the old pickle format, with a marker pickle in it and
    checksums that match (its author writes those too)."""
    import pickle

    import torch
    from trace_gym.trainers.checkpoint import CHECKSUMS, sha256_file
    from trace_gym.trainers.state_io import load_state

    blob, state = load_state(ckpt, "trainer"), load_state(ckpt, "state")
    for name in ("trainer.safetensors", "trainer.json", "state.safetensors", "state.json"):
        (ckpt / name).unlink()
    torch.save({**blob, "extra": Marker(marker)}, ckpt / "trainer.pt")
    (ckpt / "state.pkl").write_bytes(pickle.dumps({**state, "extra": Marker(marker)}))
    sums = {n: sha256_file(ckpt / n) for n in ("trainer.pt", "state.pkl")}
    (ckpt / CHECKSUMS).write_text(json.dumps(sums))


# ---------------------------------------------------------------------- 26.8: no pickles
def test_a_checkpoint_holds_no_pickle(tmp_path, policy_factory, guess_env_factory):
    _train(tiny_config(tmp_path, steps=1), policy_factory, guess_env_factory).run()
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == [
        "checksums.json",
        "state.json",
        "state.safetensors",
        "trainer.json",
        "trainer.safetensors",
    ]
    from safetensors import safe_open

    for p in ckpt.iterdir():  # each file is what its name says: data, no pickle
        if p.suffix == ".safetensors":
            safe_open(str(p), "pt").keys()
        else:
            json.loads(p.read_text())


def test_an_old_pickle_checkpoint_runs_no_code_unless_trusted(
    tmp_path, policy_factory, guess_env_factory
):
    cfg = tiny_config(tmp_path, steps=1)
    _train(cfg, policy_factory, guess_env_factory).run()
    marker = tmp_path / "marker"
    _to_legacy(tmp_path / "run" / "checkpoints" / "step_000001", marker)

    tr = _train(cfg, policy_factory, guess_env_factory)
    with pytest.raises(ConfigError, match="holds pickles.*--trust-checkpoint"):
        tr.load()
    assert not marker.exists()

    trusted = tiny_config(tmp_path, steps=1, trust_checkpoint=True)
    tr = _train(trusted, policy_factory, guess_env_factory)
    assert tr.load() and tr.step == 1
    assert marker.exists()  # trusted: the old format loads (and its pickle ran)


# ---------------------------------------------------------------------- 27.4: run folders
def _killed_before_a_checkpoint(tmp_path, policy_factory, guess_env_factory, monkeypatch):
    """A run with save_every = 0 killed in step 2: rows 0 and 1, no checkpoint."""
    cfg = tiny_config(tmp_path, steps=3, save_every=0)
    original = Trainer.update

    def dies_in_step_2(self, samples, step):
        if step == 2:
            raise KeyboardInterrupt("killed")
        return original(self, samples, step)

    monkeypatch.setattr(Trainer, "update", dies_in_step_2)
    with pytest.raises(KeyboardInterrupt):
        _train(cfg, policy_factory, guess_env_factory).run()
    monkeypatch.setattr(Trainer, "update", original)
    assert _rows(tmp_path / "run") == [0, 1]
    assert not list((tmp_path / "run" / "checkpoints").glob("step_*"))
    return cfg


def test_rows_without_a_checkpoint_are_refused_not_appended_to(
    tmp_path, policy_factory, guess_env_factory, monkeypatch
):
    cfg = _killed_before_a_checkpoint(tmp_path, policy_factory, guess_env_factory, monkeypatch)
    with pytest.raises(ConfigError, match="2 metric row.*no checkpoint.*--overwrite"):
        _train(cfg, policy_factory, guess_env_factory).run()
    assert _rows(tmp_path / "run") == [0, 1]

    over = tiny_config(tmp_path, steps=3, save_every=0, overwrite=True)
    _train(over, policy_factory, guess_env_factory).run()
    assert _rows(tmp_path / "run") == [0, 1, 2]


def test_a_rerun_with_resume_false_into_a_used_folder_is_refused(
    tmp_path, policy_factory, guess_env_factory
):
    _train(tiny_config(tmp_path, steps=1), policy_factory, guess_env_factory).run()
    again = tiny_config(tmp_path, steps=1, resume=False)
    with pytest.raises(ConfigError, match="resume = false"):
        _train(again, policy_factory, guess_env_factory).run()
    assert _rows(tmp_path / "run") == [0]


def test_a_torn_last_row_is_rewritten_from_the_checkpoint(
    tmp_path, policy_factory, guess_env_factory
):
    cfg = tiny_config(tmp_path, steps=2)
    _train(cfg, policy_factory, guess_env_factory).run()
    path = tmp_path / "run" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # killed mid-row
    with pytest.warns(RuntimeWarning, match="dropped 1 unreadable row"):
        assert _train(cfg, policy_factory, guess_env_factory).run() == []
    assert _rows(tmp_path / "run") == [0, 1]


# ---------------------------------------------------------------------- 27.5: Ctrl-C
def _sigint_in_step(monkeypatch, at, times=1):
    original = Trainer.update

    def update(self, samples, step):
        if step == at:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
        return original(self, samples, step)

    monkeypatch.setattr(Trainer, "update", update)
    return original


def test_first_ctrl_c_finishes_the_step_and_checkpoints(
    tmp_path, policy_factory, guess_env_factory, monkeypatch
):
    cfg = tiny_config(tmp_path, steps=10, save_every=5)
    original = _sigint_in_step(monkeypatch, at=3)
    before = signal.getsignal(signal.SIGINT)
    tr = _train(cfg, policy_factory, guess_env_factory)
    hist = tr.run()
    assert [m["step"] for m in hist] == [0, 1, 2, 3]
    assert tr.interrupted is not None and tr.interrupted.step == 4
    assert tr.interrupted.checkpoint.name == "step_000004"
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step_000004"
    assert signal.getsignal(signal.SIGINT) is before

    monkeypatch.setattr(Trainer, "update", original)
    resumed = _train(
        tiny_config(tmp_path, steps=5, save_every=5), policy_factory, guess_env_factory
    )
    assert [m["step"] for m in resumed.run()] == [4]
    assert _rows(tmp_path / "run") == [0, 1, 2, 3, 4]


def test_a_second_ctrl_c_exits_at_once(tmp_path, policy_factory, guess_env_factory, monkeypatch):
    cfg = tiny_config(tmp_path, steps=10, save_every=5)
    _sigint_in_step(monkeypatch, at=1, times=2)
    with pytest.raises(KeyboardInterrupt):
        _train(cfg, policy_factory, guess_env_factory).run()
    assert _rows(tmp_path / "run") == [0]
    assert not (tmp_path / "run" / "checkpoints" / "latest").exists()


def test_the_interrupt_message_names_what_was_kept_and_the_resume_command(tmp_path):
    from pathlib import Path

    from trace_gym.trainers.cli import interrupted_message
    from trace_gym.trainers.loop import Interrupted

    argv = ["--config", "c.toml", "--out-dir", "runs/x", "--overwrite", "--set", "resume=false"]
    msg = interrupted_message(Interrupted(4, Path("runs/x/checkpoints/step_000004")), argv)
    assert "steps 0-3" in msg and "runs/x/checkpoints/step_000004" in msg
    assert msg.endswith("trace-gym train --config c.toml --out-dir runs/x --set resume=true"), msg
    assert "\n" not in msg
