"""``policy.kind = "vllm"`` with ``rollout.ray_engines``: the engines build the vLLM engines,
the driver trains an HF copy and exports its weights (no vLLM in the driver: this runs in the
main venv, which has none). The real engines: tests/vllm/test_ray_engines.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_gym.trainers.builders import build_model, build_policy, engine_options  # noqa: E402
from trace_gym.trainers.config import TrainConfig  # noqa: E402

from trace_gym.distributed import WorkerPolicy  # noqa: E402
from trace_gym.errors import DependencyNotInstalled  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir():
    from trace_gym.agents.tiny import default_test_config, tiny_model_dir

    return str(tiny_model_dir(default_test_config(envs=("trace/Countdown-v0",), sft_steps=60)))


def _cfg(path, **rollout):
    return TrainConfig.from_dict(
        {
            "policy": {"kind": "vllm", "path": path, "max_new_tokens": 16, "vllm": {"seed": 3}},
            "rollout": {"ray_address": "local", "ray_engines": 2, **rollout},
        }
    )


def test_vllm_engines_build_their_own_engine_and_take_the_hf_copys_weights(tiny_dir):
    from trace_gym.agents.hf import HFPolicy

    cfg = _cfg(tiny_dir, ray_engine_gpus=1.0)
    parts = build_model(cfg)  # no vLLM here: the driver never builds an engine
    assert isinstance(parts.policy, HFPolicy) and parts.sync_mode == "shared"
    opts = engine_options(cfg.rollout, parts.policy, cfg.policy)
    made = opts["engine_policy"]
    assert isinstance(made, WorkerPolicy) and made.factory is build_policy
    assert made.args[0].kind == "vllm" and made.args[0].vllm == {"seed": 3}
    assert opts["engine_export"] == "trace_gym.trainers.sync:engine_weights"
    assert (opts["num_engines"], opts["engine_gpus"], opts["engine_batching"]) == (2, 1.0, "batch")
    with pytest.raises(DependencyNotInstalled, match="vLLM"):
        made.build()  # what each engine actor runs (vLLM is not installed in this venv)


def test_without_engines_kind_vllm_is_the_in_process_engine(tiny_dir):
    cfg = _cfg(tiny_dir, ray_engines=0)
    assert engine_options(cfg.rollout, None, cfg.policy) == {}
    with pytest.raises(DependencyNotInstalled, match="vLLM"):
        build_model(cfg)
    no_ray = replace(cfg, rollout=replace(cfg.rollout, ray_address=None, ray_engines=2))
    assert engine_options(no_ray.rollout, None, no_ray.policy) == {}


def test_ray_options_reach_the_ray_config_and_bad_keys_fail_early():
    from trace_gym.trainers.config import RolloutConfig

    from trace_gym.errors import ConfigError

    ok = RolloutConfig(ray_address="local", ray_options={"worker_cpus": 0.5, "engine_slots": 4})
    assert ok.ray_options == {"worker_cpus": 0.5, "engine_slots": 4}
    with pytest.raises(ConfigError, match="ray_options needs rollout.ray_address"):
        RolloutConfig(ray_options={"worker_cpus": 0.5})
    with pytest.raises(ConfigError, match="set it with rollout.ray_workers"):
        RolloutConfig(ray_address="local", ray_options={"num_workers": 3})
    with pytest.raises(ConfigError, match="set by the trainer"):
        RolloutConfig(ray_address="local", ray_options={"engine_policy": None})
    with pytest.raises(ConfigError, match="worker_cpu"):
        RolloutConfig(ray_address="local", ray_options={"worker_cpu": 1})
