"""`trace-gym bench retriever-server` runs end to end on a tiny corpus (figures are not asserted)."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys


def test_bench_retriever_server_smoke(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "bench",
            "retriever-server",
            "--passages",
            "3000",
            "--clients",
            "4",
            "--seconds",
            "0.5",
            "--warmup",
            "0.2",
            "--max-requests",
            "200",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    for kind in ("new", "old"):
        assert (
            report[kind]["requests"] + report[kind]["errors"] > 0
            and report[kind]["requests"] <= 200
        )
    assert report["passages"] == 3000 and set(report["goals_met"]) == {
        "errors",
        "p99_ms",
        "qps",
        "ratio_to_old",
    }
    assert not multiprocessing.active_children()


def test_bench_retriever_server_bad_flags_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "bench", "retriever-server", "--clients", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
