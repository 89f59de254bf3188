"""`trace-gym train --check` on broken files and bad values: one line, exit code 2, at start-up."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from trace_gym.trainers.config import TrainConfig, load_config

from trace_gym import cli
from trace_gym.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "configs" / "cpu_tiny_sim.toml"


def _check(capsys, config: Path, *sets: str) -> str:
    argv = ["train", "--config", str(config), "--check"]
    for s in sets:
        argv += ["--set", s]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"steps = = 3\n", "is not valid TOML"),
        (b"[policy\nkind = 'tiny'\n", "is not valid TOML"),
        (b"out_dir = 'caf\xe9'\n", "is not UTF-8 text"),
        (b"rollout = 5\n", "rollout must be a table"),
        (b"steps = 2.5\n", "steps must be of type int"),
        (b"[optim]\nlr = nan\n", "optim.lr must be of type float"),
        (b"[rollout]\nenv_id = 'trace/Nope-v0'\n", "unknown env id 'trace/Nope-v0'"),
        (b"[rollout]\nm_max = 0\n", "rollout.m_max must be >= 2"),
        (b"[rollout]\ngroup_size = 0\n", "group_size must be >= 2"),
        (b"[optim]\nbetas = [0.9]\n", "optim.betas must be of type tuple"),
        (b"[policy]\ngen_batch = true\n", "policy.gen_batch must be of type int"),
    ],
)
def test_bad_files_fail_the_check_with_one_line(tmp_path, capsys, body, match):
    path = tmp_path / "c.toml"
    path.write_bytes(body)
    assert match in _check(capsys, path)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("steps=abc", "steps must be of type int, got 'abc'"),
        ("steps.x=1", "cannot set 'steps.x': steps is a value, not a table"),
        ("steps=2.5", "steps must be of type int"),
        ("optim.lr=NaN", "optim.lr must be of type float"),
        ("rollout=5", "rollout must be a table"),
        ("rollout.m_max=0", "rollout.m_max"),
        ("rollout.env_id=nope", "unknown env id 'nope'"),
    ],
)
def test_bad_overrides_fail_the_check_with_one_line(capsys, override, match):
    assert match in _check(capsys, PRESET, override)


def test_json_and_yaml_syntax_errors_and_non_tables(tmp_path):
    j = tmp_path / "c.json"
    j.write_text('{"steps": ')
    with pytest.raises(ConfigError, match="c.json is not valid JSON"):
        load_config(j)
    j.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a table of settings, got list"):
        load_config(j)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path)


def test_good_values_still_load():
    cfg = load_config(PRESET, {"optim.lr": 1, "steps": 0, "rollout.env_id": "trace/Sim-v0"})
    assert cfg.optim.lr == 1 and cfg.steps == 0 and math.isfinite(cfg.optim.betas[0])
    assert TrainConfig().rollout.env_id == "trace/Sim-v0"  # the defaults pass their own checks


@pytest.mark.parametrize(
    ("body", "match"),
    [  # a typo inside a kwargs table: found by --check, not after the first rollouts
        (
            '[rollout]\nenv_id = "trace/Math-v0"\n[rollout.env_kwargs]\ndatset = "x"\n',
            "rollout.env_kwargs: MathEnv takes no option 'datset' (did you mean 'dataset'?)",
        ),
        (
            '[rollout]\nenv_id = "trace/HotpotQA-v0"\n[rollout.env_kwargs]\nretreiver = "x"\n',
            "HotpotQAEnv takes no option 'retreiver' (did you mean 'retriever'",
        ),
        (
            "[rollout.allocator_kwargs]\npool_factr = 2\n",
            "rollout.allocator_kwargs option(s) ['pool_factr'] are not known to any policy",
        ),
        (
            '[rollout]\npredictor = "clue"\n[rollout.predictor_kwargs]\nlrr = 1\n',
            "rollout.predictor_kwargs: CluePredictor takes no option 'lrr'",
        ),
        ("[policy.tiny]\nhiden = 8\n", "policy.tiny: TinyConfig takes no option 'hiden'"),
    ],
)
def test_kwargs_typos_fail_the_check_with_one_line(tmp_path, capsys, body, match):
    path = tmp_path / "c.toml"
    path.write_text("steps = 1\n" + body)
    assert match in _check(capsys, path)
    with pytest.raises(ConfigError, match="takes no option|not known to any policy"):
        load_config(path)  # the trainer's start-up reads the same config


def test_an_unknown_config_key_gets_a_close_match(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("stpes = 1\n")
    assert "unknown key(s) ['stpes'] in [config] (did you mean 'steps'?)" in _check(capsys, path)
