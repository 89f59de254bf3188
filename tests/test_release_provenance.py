"""Run provenance: provenance.json in training and benchmark output directories."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from trace_gym.provenance import PROVENANCE_FILE, collect, git_state, write_provenance

ROOT = Path(__file__).resolve().parent.parent


def _git(cwd, *args):
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_git_state_commit_and_dirty_flag(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "f.txt").write_text("a")
    _git(tmp_path, "add", "f.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    state = git_state(tmp_path)
    assert state["commit"] == _git(tmp_path, "rev-parse", "HEAD") and state["dirty"] is False
    (tmp_path / "f.txt").write_text("b")
    assert git_state(tmp_path)["dirty"] is True


def test_outside_a_checkout_the_commit_is_none(tmp_path):
    assert git_state(tmp_path) == {"commit": None, "dirty": None, "root": None}


def test_record_fields_and_config_forms(tmp_path):
    @dataclass
    class Cfg:
        lr: float = 0.1

    rec = collect(Cfg(), argv=["trace-gym", "train", "--x"])
    assert rec["config"] == {"lr": 0.1} and rec["command"] == ["trace-gym", "train", "--x"]
    assert rec["git"]["commit"] == _git(ROOT, "rev-parse", "HEAD")
    assert {"trace-gym", "numpy", "gymnasium"} <= set(rec["packages"])
    assert rec["python"] == sys.version.split()[0]
    path = write_provenance(tmp_path / "d", {"a": 1})
    assert json.loads(path.read_text())["config"] == {"a": 1}
    with pytest.raises(TypeError, match="dataclass, dict or Namespace"):
        collect(object())


def test_bench_alloc_out_dir_holds_provenance(tmp_path):
    out = tmp_path / "bench"
    cmd = [
        sys.executable,
        "-m",
        "trace_gym.cli",
        "bench",
        "alloc",
        "--steps",
        "1",
        "--roots",
        "8",
        "--policies",
        "grpo",
        "--no-progress",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    rec = json.loads((out / PROVENANCE_FILE).read_text())
    assert rec["command"][1:] == cmd[3:]  # argv after `-m trace_gym.cli`
    assert rec["config"]["roots"] == 8 and rec["git"]["commit"]


def test_bench_wrap_restore_out_dir_holds_provenance(tmp_path):
    from trace_gym.bench.wrap_restore import main

    assert main(["--depths", "0,2", "--reps", "2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "wrap_restore.json").read_text())["rows"]
    assert [r["depth"] for r in rows] == [0, 2] and all(r["replay_ms"] > 0 for r in rows)
    assert json.loads((tmp_path / PROVENANCE_FILE).read_text())["config"]["depths"] == "0,2"


def test_trainer_run_dir_holds_provenance(tmp_path):
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location(
        "trainers_conftest", ROOT / "tests/trainers/conftest.py"
    )
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    from trace_gym.trainers.config import TrainConfig
    from trace_gym.trainers.loop import Trainer

    cfg = TrainConfig.from_dict(
        {
            "steps": 1,
            "out_dir": str(tmp_path / "run"),
            "tensorboard": False,
            "progress": False,
            "policy": {"kind": "custom"},
        }
    )
    Trainer(cfg, policy=helpers.CharPolicy(helpers.tiny_qwen3()), env_factory=helpers.GuessEnv)
    rec = json.loads((tmp_path / "run" / PROVENANCE_FILE).read_text())
    assert rec["config"]["out_dir"] == str(tmp_path / "run") and rec["config"]["steps"] == 1
