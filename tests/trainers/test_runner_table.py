"""One home for the step's settings: `[rollout.runner]`, the runner's bounds, the CLI helpers."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from trace_gym.trainers.config import FLAT_RUNNER_KEYS, TrainConfig, load_config

from trace_gym.budget import DEFAULT_REPLAY_COST, Budget, StepReport
from trace_gym.compat import old_names, renamed_fields
from trace_gym.errors import ConfigError
from trace_gym.runner import RUNNER_FLAGS, RunnerConfig, add_runner_args, runner_config

REPO = Path(__file__).resolve().parents[2]


def _cfg(rollout: dict, **top) -> TrainConfig:
    return TrainConfig.from_dict({**top, "rollout": rollout})


def test_flat_and_nested_keys_make_the_same_runner_and_new_settings_are_settable():
    flat = _cfg({"root_budget": 6, "replays_per_root": 1.0, "m_max": 4, "replay_cost": 0.25})
    nested = _cfg(
        {"runner": {"root_budget": 6, "replays_per_root": 1.0, "m_max": 4, "replay_cost": 0.25}}
    )
    assert flat.rollout.runner == nested.rollout.runner
    assert flat.rollout.root_budget == 6 and flat.rollout.replay_cost == 0.25  # read back flat
    new = {
        "expansion": "global",
        "policy_retries": 2,
        "reseed_replays": False,
        "prefix_share": 0.5,
        "raise_on_failures": True,
        "update_predictor": False,
    }
    r = _cfg({"runner": new}).rollout.runner
    assert {k: getattr(r, k) for k in new} == new
    assert r.root_budget == 16 and r.replay_cost == DEFAULT_REPLAY_COST  # the table's defaults


def test_the_runner_seed_is_the_runs_and_to_dict_round_trips_with_the_old_keys():
    cfg = _cfg({"root_budget": 6, "runner": {"expansion": "global"}}, seed=7)
    assert cfg.rollout.runner.seed == 7
    d = cfg.to_dict()
    assert all(k in d["rollout"] for k in FLAT_RUNNER_KEYS)  # provenance/checkpoint keys
    assert set(d["rollout"]["runner"]).isdisjoint(FLAT_RUNNER_KEYS)
    assert TrainConfig.from_dict(d) == cfg
    with pytest.raises(ConfigError, match="rollout.runner.seed .5. differs from the run's seed"):
        _cfg({"runner": {"seed": 5}}, seed=2)


@pytest.mark.parametrize(
    ("rollout", "match"),
    [
        ({"root_budget": 1}, "rollout.root_budget must be >= 2"),
        ({"runner": {"root_budget": 1}}, "rollout.root_budget must be >= 2"),
        ({"root_budget": 2.5}, "rollout.root_budget must be of type int"),
        ({"replay_cost": -1}, "rollout.replay_cost must be a finite number >= 0"),
        ({"runner": {"expansion": "x"}}, "rollout.runner.expansion must be one of"),
        ({"runner": {"policy_retries": "2"}}, "rollout.runner.policy_retries must be of type int"),
        ({"runner": {"nope": 1}}, r"unknown key\(s\) \['nope'\] in \[rollout.runner\]"),
        ({"root_budget": 4, "runner": {"root_budget": 5}}, "set both in"),
        ({"runner": 3}, "rollout.runner must be a table"),
    ],
)
def test_bad_runner_settings_fail_with_the_runners_rule(rollout, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(rollout)


def test_every_config_file_loads_and_an_override_replaces_the_flat_key():
    for path in sorted((REPO / "configs").glob("*.toml")):
        cfg = load_config(path)
        assert cfg.rollout.runner.seed == cfg.seed and cfg.rollout.runner.root_budget >= 2
    path = REPO / "configs" / "cpu_tiny_sim.toml"  # root_budget = 16, flat
    assert load_config(path, {"rollout.runner.root_budget": 4}).rollout.root_budget == 4
    assert load_config(path, {"rollout.root_budget": 6}).rollout.runner.root_budget == 6


def test_runner_bounds_are_one_rule():
    RunnerConfig(root_budget=2, replays_per_root=0.0, replay_cost=0.0)  # free replays are fine
    for bad in (
        {"root_budget": 1},
        {"root_budget": 2, "replays_per_root": float("inf")},
        {"root_budget": 2, "replay_cost": float("nan")},
    ):
        with pytest.raises(ConfigError):
            RunnerConfig(**bad)
    assert Budget(4).replay_cost == RunnerConfig(root_budget=4).replay_cost == DEFAULT_REPLAY_COST


def test_add_runner_args_keeps_the_flags_and_runner_config_names_them():
    p = argparse.ArgumentParser()
    add_runner_args(p, root_budget=32, replays_per_root=2.0, m_max=16, max_batch=None)
    args = p.parse_args(["--roots", "8", "--replays", "1", "--m-max", "4"])
    rc = runner_config(args, seed=3)
    assert (rc.root_budget, rc.replays_per_root, rc.m_max, rc.max_batch, rc.seed) == (
        8,
        1,
        4,
        None,
        3,
    )
    assert runner_config(p.parse_args([])).root_budget == 32  # the tool's own default
    with pytest.raises(ConfigError, match="^--roots must be >= 2"):
        runner_config(p.parse_args(["--roots", "1"]))
    with pytest.raises(ConfigError, match="^--replays must be"):
        runner_config(p.parse_args(["--replays", "-1"]))
    assert set(RUNNER_FLAGS) <= {f for f in RunnerConfig.__dataclass_fields__}


def test_renamed_fields_keep_the_old_keyword_attribute_and_json_key():
    from dataclasses import dataclass

    @renamed_fields(roots="root_budget")
    @dataclass
    class Cfg:
        root_budget: int = 1
        steps: int = 2

    c = Cfg(roots=5)
    assert c.root_budget == c.roots == 5
    c.roots = 6
    assert c.root_budget == 6 and old_names(c) == {"roots": 6, "steps": 2}
    with pytest.raises(TypeError, match="both"):
        Cfg(roots=1, root_budget=2)


def test_bench_configs_take_the_runners_names_and_the_old_ones():
    from trace_gym.bench.alloc import BenchConfig
    from trace_gym.bench.distributed import RayBenchConfig
    from trace_gym.bench.learn import LearnConfig

    a = BenchConfig(roots=32, replays=1.0)
    assert (a.root_budget, a.replays_per_root, a.roots) == (32, 1.0, 32)
    assert RayBenchConfig(roots=8).root_budget == 8
    assert LearnConfig(root_budget=8).roots == 8


def test_trl_takes_the_same_table():
    pytest.importorskip("torch")
    from trace_gym.trainers.trl_adapter import TRLRolloutConfig

    cfg = TRLRolloutConfig(runner={"root_budget": 8, "expansion": "global"}, seed=4)
    assert cfg.runner_config() == RunnerConfig(root_budget=8, expansion="global", seed=4)
    assert TRLRolloutConfig(root_budget=8, m_max=4).m_max == 4


def test_step_metrics_read_the_report():
    pytest.importorskip("torch")
    from trace_gym.trainers.loop import REPORT_METRICS, step_metrics

    rep = StepReport(step=3, roots=4, replays=2, accounted_cost=5.0, generated_tokens=10)
    rep.predictor_update = {"loss": 0.5}
    m = step_metrics([], rep, {"units": 0}, {}, (2.0, 1.0))
    assert m["step"] == 3 and {k: m[k] for k in REPORT_METRICS}["replays"] == 2
    assert m["gen_tokens_per_s"] == 5.0 and m["predictor_loss"] == 0.5
    assert "time_rollout_policy_s" in m
