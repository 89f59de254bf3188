"""A three-env mixture on the tiny model, end to end on CPU, with per-env figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_three_env_mixture_trains_and_reports_per_env(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "trace_gym.cli", "train", "--config", str(REPO / "configs" / "cpu_tiny_mixture.toml"),
           "--out-dir", str(out), "--set", "steps=3"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    envs = {k.split("/")[1] + "/" + k.split("/")[2] for r in rows for k in r if k.startswith("env/")}
    assert envs == {"trace/Sim-v0", "trace/Math-v0", "trace/BFCL-v0"}
    for r in rows:
        assert sum(r[k] for k in r if k.endswith("/prompts")) == r["prompts"]
        assert all(0.0 <= r[k] <= 1.0 for k in r if k.endswith("/success"))
    assert '"env/' in proc.stdout  # the CLI's summary shows the last step per env
