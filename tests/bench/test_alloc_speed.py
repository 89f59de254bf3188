"""`trace-gym bench alloc-speed` runs and reports the figures the issue names (small sizes)."""

from __future__ import annotations

import json
import subprocess
import sys

from trace_gym.bench.alloc_speed import run

KEYS = {"root_fast_ms", "root_reference_ms", "speedup", "prefix_us", "objective_equal"}


def test_run_reports_figures():
    r = run(candidates=64, budget=150, m_max=8, repeats=3, reference_repeats=1, prefix_repeats=5)
    assert KEYS <= set(r)
    assert r["objective_equal"] is True
    assert r["root_fast_ms"] > 0 and r["prefix_us"] > 0 and r["speedup"] > 0


def test_cli_writes_json(tmp_path):
    out = tmp_path / "alloc.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "bench",
            "alloc-speed",
            "--candidates",
            "32",
            "--budget",
            "64",
            "--repeats",
            "3",
            "--reference-repeats",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "speedup" in proc.stdout
    data = json.loads(out.read_text())
    assert KEYS <= set(data) and data["objective_equal"] is True
