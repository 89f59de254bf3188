"""`trace-gym bench math-env`: interpreter throughput and fork vs replay restore, side by side.

Measures, in one run: cells per second for a trivial cell (``x += 1``); restore latency
from a fork snapshot against ledger replay in a fresh interpreter, interleaved, for a
realistic 5-cell history (import sympy, define a function, solve an equation, a loop, a
print) - both until `restore` returns (a fork restore hands over the snapshot's
pre-forked spare) and until a first cell has answered (which includes the copy-on-write
faults a fork pays later), plus the fork path without spares; and the memory a parked
snapshot holds privately (its unique set size, parked process plus its spare).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from trace_gym.envs.math.sandbox import Sandbox, SandboxConfig

HISTORY = (
    "import sympy as sp",
    "def f(n):\n    return n * (n + 1) // 2",
    "x = sp.symbols('x')\nsol = sp.solve(x**3 - 6*x**2 + 11*x - 6, x)",
    "total = 0\nfor k in range(1000):\n    total += f(k) % 7",
    "print(sol, total)",
)
GOALS = {"restore_fork_ms": 5.0, "fork_speedup": 10.0, "cells_per_s": 100.0}


def _private_mb(pid: int) -> float:
    """Unique memory of a process (Private_Clean + Private_Dirty), in MiB."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total / 1024


def _restores(sb: Sandbox, repeats: int) -> dict[str, list[float]]:
    """Interleaved fork and replay restores (so both see the same machine load), in ms."""
    for code in HISTORY:
        assert sb.run(code).status == "ok", code
    handle = sb.snapshot()
    out: dict[str, list[float]] = {"fork": [], "fork_cell": [], "replay": [], "replay_cell": []}
    for _ in range(repeats):
        for name, restore in (("fork", lambda: sb.restore_snapshot(handle)), ("replay", lambda: sb.replay(HISTORY))):
            t0 = time.perf_counter()
            assert restore()
            t1 = time.perf_counter()
            assert sb.run("total").output == "2002\n"
            t2 = time.perf_counter()
            out[name].append((t1 - t0) * 1000)
            out[f"{name}_cell"].append((t2 - t0) * 1000)
    return out


def run_bench(seconds: float = 2.0, repeats: int = 20, snapshots: int = 8) -> dict[str, Any]:
    """The benchmark figures as a dict (see the module docstring)."""
    sb = Sandbox(SandboxConfig(max_snapshots=max(snapshots, 4) + 2))
    plain = Sandbox(SandboxConfig(max_snapshots=4, spares=False))
    try:
        t0 = time.perf_counter()
        sb.start()
        start_s = time.perf_counter() - t0
        sb.run("x = 0")
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sb.run("x += 1")
            n += 1
        cells_per_s = n / (time.perf_counter() - t0)

        sb.fresh()
        timing = _restores(sb, repeats)
        check = sb.run("print(sol, total, f(10))").output.strip()
        plain_timing = _restores(plain, max(2, repeats // 2))

        handles = [h for h in (sb.snapshot() for _ in range(snapshots)) if h is not None]
        parked = [_private_mb(sb._snaps[h.sid].pid) for h in handles]  # noqa: SLF001 - diagnostics
        spares = []
        for h in handles:
            spare = sb._spares.get(h.sid)  # noqa: SLF001
            if spare is not None and spare.ready(time.monotonic() + 10):
                spares.append(_private_mb(spare.pid))
        parked_mb = statistics.mean(parked) if parked else float("nan")
        spare_mb = statistics.mean(spares) if spares else 0.0
        zygote_mb = _private_mb(sb._zygote.pid) if sb._zygote else float("nan")  # noqa: SLF001
        med = {k: statistics.median(v) for k, v in timing.items()}
        return {
            "cells_per_s": round(cells_per_s, 1),
            "restore_fork_ms": round(med["fork"], 3),
            "restore_replay_ms": round(med["replay"], 3),
            "fork_speedup": round(med["replay"] / med["fork"], 1),
            "restore_fork_then_cell_ms": round(med["fork_cell"], 3),
            "restore_replay_then_cell_ms": round(med["replay_cell"], 3),
            "restore_fork_no_spare_ms": round(statistics.median(plain_timing["fork"]), 3),
            "restore_fork_min_ms": round(min(timing["fork"]), 3),
            "restore_replay_min_ms": round(min(timing["replay"]), 3),
            "snapshot_rss_mb": round(parked_mb + spare_mb, 2),
            "snapshot_parked_mb": round(parked_mb, 2),
            "snapshot_spare_mb": round(spare_mb, 2),
            "zygote_private_mb": round(zygote_mb, 1),
            "sandbox_start_s": round(start_s, 3),
            "history_cells": len(HISTORY),
            "repeats": repeats,
            "restored_output": check,
            "isolation": sb.isolation,
            "load_average_1m": round(os.getloadavg()[0], 2),
            "cpu_count": os.cpu_count(),
        }
    finally:
        sb.close()
        plain.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="trace-gym bench math-env", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    p.add_argument("--seconds", type=float, default=2.0, help="duration of the cells/s measurement")
    p.add_argument("--repeats", type=int, default=20, help="restores measured per method")
    args = p.parse_args(argv)
    res = run_bench(seconds=args.seconds, repeats=args.repeats)
    for key, value in res.items():
        goal = GOALS.get(key)
        mark = ""
        if goal is not None:
            ok = value <= goal if key == "restore_fork_ms" else value >= goal
            mark = f"   (goal {'<=' if key == 'restore_fork_ms' else '>='} {goal:g}: {'met' if ok else 'MISSED'})"
        print(f"{key:>28}: {value}{mark}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0
