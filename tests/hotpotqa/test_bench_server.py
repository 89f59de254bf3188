"""`trace-gym bench retriever-server` runs end to end on a tiny corpus (figures are not asserted)."""

from __future__ import annotations

import json
import multiprocessing
import os
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
            "--workers",
            "1,2",
            "--stacks",
            "none",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRACE_GYM_BM25_BACKEND": "numpy"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    for run in (report["old"], report["new"]["1"], report["new"]["2"], report["load_generator"]):
        assert run["requests"] + run["errors"] > 0 and run["requests"] <= 200
    assert report["new"]["2"]["orphans_after_sigkill"] == 0
    assert len(report["new"]["2"]["queries_per_worker"]) == 2
    assert report["ceiling"]["batched_qps"] > 0 and report["ceiling"]["batch"] == 4
    assert report["passages"] == 3000 and set(report["goals_met"]) == {
        "errors",
        "p99_ms",
        "of_ceiling",
        "ratio_to_old",
        "orphans",
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
