"""`trace-gym bench math-env`: interpreter throughput and fork vs replay restore, side by side.

Every figure is measured for the default configuration (bubblewrap with every layer on)
and, in the same run, for each layer switched off in turn (no seccomp; the first
version's namespace isolation; no isolation), so the cost of each layer is a ratio
measured under the same machine load.

Measures, in one run: cells per second for a trivial cell (``x += 1``); restore latency
from a fork snapshot against ledger replay in a fresh interpreter, interleaved, for a
realistic 5-cell history (import sympy, define a function, solve an equation, a loop, a
print) - both until `restore` returns (a fork restore hands over the snapshot's
pre-forked spare) and until a first cell has answered (which includes the copy-on-write
faults a fork pays later), plus the fork path without spares; and the memory a parked
snapshot holds privately (its unique set size, parked process plus its spare).

Also (issue 26): a hostile tree-search episode's peak memory against the sandbox's memory
total (a 250 MiB buffer rewritten after each checkpoint, then ten 250 MiB children), read
from the sandbox's memory cgroup, with the sampled sum of its processes' PSS beside it;
and how long an honest answer that needs math-verify waits while slow answers are in
flight, for the pool at its cap (4 workers) and at its default size.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from trace_gym.envs.math.sandbox import Sandbox, SandboxConfig
from trace_gym.envs.math.verify import VerifierPool, default_workers

from trace_gym.cli import Parser

HISTORY = (
    "import sympy as sp",
    "def f(n):\n    return n * (n + 1) // 2",
    "x = sp.symbols('x')\nsol = sp.solve(x**3 - 6*x**2 + 11*x - 6, x)",
    "total = 0\nfor k in range(1000):\n    total += f(k) % 7",
    "print(sol, total)",
)
#: issue 16's goals, for the default configuration (bwrap, every layer on)
GOALS = {
    "restore_fork_ms": ("<=", 1.0),
    "fork_speedup": (">=", 20.0),
    "restore_fork_then_cell_ms": ("<=", 3.0),
    "cells_per_s": (">=", 3000.0),
}


def _layers() -> dict[str, SandboxConfig]:
    """The configurations measured side by side: every layer on, then one layer off at a time."""
    layers = {"bwrap": SandboxConfig(), "bwrap_no_seccomp": SandboxConfig(seccomp=False)}
    if os.geteuid() == 0:
        layers["namespaces"] = SandboxConfig(
            isolation="namespaces"
        )  # the first version's isolation
    else:
        # no isolation only where this is not root: as root a cell of the unisolated host
        # process could reach every process of the machine (the bench's own cells would
        # not, but the bench does not make that a habit); root measures 'namespaces' instead
        layers["none"] = SandboxConfig(isolation="none", allow_unsafe_host=True)
    return layers


def _private_mb(pid: int) -> float:
    """Unique memory of a process (Private_Clean + Private_Dirty), in MiB."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total / 1024


def _restore_once(sb: Sandbox, name: str, handle: Any, out: dict[str, list[float]]) -> None:
    """One fork or replay restore plus one cell, recorded in ms."""
    t0 = time.perf_counter()
    assert sb.restore_snapshot(handle) if name == "fork" else sb.replay(HISTORY)
    t1 = time.perf_counter()
    assert sb.run("total").output == "2002\n"
    t2 = time.perf_counter()
    out[name].append((t1 - t0) * 1000)
    out[f"{name}_cell"].append((t2 - t0) * 1000)


def _cell_rate(sandboxes: dict[str, Sandbox], seconds: float) -> dict[str, float]:
    """Trivial cells per second of each sandbox, measured in alternating 50 ms slices."""
    counts = dict.fromkeys(sandboxes, 0)
    busy = dict.fromkeys(sandboxes, 0.0)
    for sb in sandboxes.values():
        sb.run("x = 0")
    slices = max(1, int(seconds / 0.05))
    for _ in range(slices):
        for name, sb in sandboxes.items():
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds / slices:
                sb.run("x += 1")
                counts[name] += 1
            busy[name] += time.perf_counter() - t0
    return {name: counts[name] / busy[name] for name in sandboxes}


def _interleaved(
    sandboxes: dict[str, Sandbox], seconds: float, repeats: int
) -> dict[str, dict[str, Any]]:
    """Cells/s and restores of every configuration, round-robin.

    Each configuration gets the same slices of wall time in turn, and fork and replay
    restores alternate, so a load spike on a shared machine hits all of them alike.
    """
    rates = _cell_rate(sandboxes, seconds)
    handles = {}
    for name, sb in sandboxes.items():
        sb.fresh()
        for code in HISTORY:
            assert sb.run(code).status == "ok", code
        handles[name] = sb.snapshot()
    timing = {
        name: {"fork": [], "fork_cell": [], "replay": [], "replay_cell": []} for name in sandboxes
    }
    for _ in range(repeats):
        for name, sb in sandboxes.items():
            for kind in ("fork", "replay"):
                _restore_once(sb, kind, handles[name], timing[name])
    out = {}
    for name, sb in sandboxes.items():
        med = {k: statistics.median(v) for k, v in timing[name].items()}
        out[name] = {
            "mode": sb.isolation.get("mode"),
            "seccomp": sb.isolation.get("seccomp"),
            "cells_per_s": round(rates[name], 1),
            "restore_fork_ms": round(med["fork"], 3),
            "restore_replay_ms": round(med["replay"], 3),
            "fork_speedup": round(med["replay"] / med["fork"], 1),
            "restore_fork_then_cell_ms": round(med["fork_cell"], 3),
            "restore_replay_then_cell_ms": round(med["replay_cell"], 3),
            "restore_fork_min_ms": round(min(timing[name]["fork"]), 3),
            "restore_fork_then_cell_min_ms": round(min(timing[name]["fork_cell"]), 3),
            "restored_output": sb.run("print(sol, total, f(10))").output.strip(),
        }
    return out


def _measure_all(seconds: float, repeats: int) -> dict[str, dict[str, Any]]:
    """Start every configuration (timed, one at a time), then measure them interleaved."""
    sandboxes, starts = {}, {}
    try:
        for name, cfg in _layers().items():
            sb = sandboxes[name] = Sandbox(cfg)
            t0 = time.perf_counter()
            sb.start()
            starts[name] = round(time.perf_counter() - t0, 3)
        figures = _interleaved(sandboxes, seconds, repeats)
        return {name: {"sandbox_start_s": starts[name], **fig} for name, fig in figures.items()}
    finally:
        for sb in sandboxes.values():
            sb.close()


def _snapshot_memory(snapshots: int) -> dict[str, Any]:
    """Private memory of parked snapshots and their spares (default configuration)."""
    sb = Sandbox(SandboxConfig(max_snapshots=max(snapshots, 4) + 2))
    try:
        for code in HISTORY:
            sb.run(code)
        handles = [h for h in (sb.snapshot() for _ in range(snapshots)) if h is not None]
        parked = [_private_mb(sb._snaps[h.sid].pid) for h in handles]  # noqa: SLF001 - diagnostics
        spares = []
        for h in handles:
            spare = sb._spares.get(h.sid)  # noqa: SLF001
            if spare is not None and spare.ready(time.monotonic() + 10):
                spares.append(_private_mb(spare.pid))
        parked_mb = statistics.mean(parked) if parked else float("nan")
        spare_mb = statistics.mean(spares) if spares else 0.0
        return {
            "snapshot_rss_mb": round(parked_mb + spare_mb, 2),
            "snapshot_parked_mb": round(parked_mb, 2),
            "snapshot_spare_mb": round(spare_mb, 2),
            "zygote_private_mb": round(_private_mb(sb._zygote.pid), 1) if sb._zygote else None,  # noqa: SLF001
        }
    finally:
        sb.close()


#: a tree-search episode that tries to take the sandbox past its memory total: a buffer
#: rewritten after every checkpoint (each parked snapshot keeps the old pages, copy-on-write)
HOSTILE_BUFFER = "import numpy as np\nbuf = np.ones({mb} << 20, dtype=np.uint8)"
HOSTILE_REWRITE = "buf[:] = (int(buf[0]) + 1) % 250"
#: ten children that each stay under RLIMIT_AS; their sum does not
HOSTILE_CHILDREN = (
    "import os, time\nkids = []\nfor _ in range(10):\n    pid = os.fork()\n"
    "    if pid == 0:\n        b = b'x' * ({mb} << 20)\n        time.sleep(2)\n        os._exit(0)\n"
    "    kids.append(pid)\nfor p in kids:\n    os.waitpid(p, 0)"
)
#: an answer math-verify cannot finish (it overruns any deadline), and one it decides at once
SLOW_ANSWER, HONEST = ("9^{9^{9^{9^{9}}}}", "3"), ("\\frac{1}{2}", "0.5")


def _pss_mb(pids: list[int]) -> float:
    """Proportional set size summed over `pids` (shared pages split between their users)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
            total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    return total / 1024


def hostile_memory(checkpoints: int = 16, buffer_mb: int = 250) -> dict[str, Any]:
    """Peak memory of a hostile tree-search episode, against the sandbox's memory total."""
    sb = Sandbox(SandboxConfig())
    try:
        sb.run(HOSTILE_BUFFER.format(mb=buffer_mb))
        pss = [_pss_mb(sb.pids())]
        handles = []
        for _ in range(checkpoints):
            handles.append(sb.snapshot())
            sb.run(HOSTILE_REWRITE)
            pss.append(_pss_mb(sb.pids()))
        children = sb.run(HOSTILE_CHILDREN.format(mb=buffer_mb))
        use = sb.memory()
        return {
            "memory_total_mb": sb.config.memory_total_mb,
            "memory_cgroup": sb.isolation.get("memory_cgroup"),
            "peak_mb": round(use.peak_mb, 1) if use else None,
            "pss_peak_mb": round(max(pss), 1),
            "checkpoints": checkpoints,
            "buffer_mb": buffer_mb,
            "snapshots_parked": sb.num_snapshots,
            "snapshots_evicted": sb.evicted_for_memory,
            "oom_kills": use.oom_kills if use else None,
            "children_cell": children.status,
        }
    finally:
        sb.close()


def _in_flight(pool: VerifierPool, slow: int) -> float:
    """Seconds an honest answer waits with `slow` overrunning answers already in flight."""
    threads = [threading.Thread(target=pool.check, args=SLOW_ANSWER) for _ in range(slow)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # let them reach their workers
    t0 = time.perf_counter()
    assert pool.check(*HONEST).get("math_verify") is True
    wait = time.perf_counter() - t0
    for t in threads:
        t.join()
    return wait


def verifier_waits(deadline_s: float = 3.0, slow: int = 4) -> dict[str, Any]:
    """How long an honest answer that needs math-verify waits behind `slow` overrunning ones."""
    out: dict[str, Any] = {"deadline_s": deadline_s, "slow_in_flight": slow}
    for name, workers in (("cap", 4), ("default", default_workers())):
        pool = VerifierPool(workers=workers, timeout_s=deadline_s)
        try:
            warm = [threading.Thread(target=pool.check, args=HONEST) for _ in range(workers)]
            for t in warm:
                t.start()
            for t in warm:
                t.join()
            for t in list(pool._threads):  # noqa: SLF001 - the standby is up before timing
                t.join()
            out[f"honest_wait_s_{name}_{workers}_workers"] = round(_in_flight(pool, slow), 2)
        finally:
            pool.close()
    return out


def run_bench(
    seconds: float = 2.0,
    repeats: int = 20,
    snapshots: int = 8,
    hostile_checkpoints: int = 16,
    slow_answers: int = 4,
    verifier_deadline_s: float = 3.0,
) -> dict[str, Any]:
    """The benchmark figures as a dict: the default configuration's, then every layer's.

    All configurations run at once in one process and are measured round-robin
    (`_interleaved`), so they see the same machine load;
    ``layers`` holds each one's figures and ``layer_cost`` the ratio of each figure to the
    first version's isolation ('namespaces' as root; 'none', measured only where this is not
    root).
    """
    layers = _measure_all(seconds, repeats)
    main = layers["bwrap"] if layers["bwrap"]["mode"] == "bwrap" else next(iter(layers.values()))
    base = layers.get("namespaces") or layers["none"]
    cost = {
        name: {
            k: round(fig[k] / base[k], 2)
            for k in (
                "sandbox_start_s",
                "cells_per_s",
                "restore_fork_ms",
                "restore_fork_then_cell_ms",
            )
            if base[k]
        }
        for name, fig in layers.items()
    }
    return {
        **{k: v for k, v in main.items() if k not in ("mode", "seccomp")},
        **_snapshot_memory(snapshots),
        "isolation": main["mode"],
        "history_cells": len(HISTORY),
        "repeats": repeats,
        "layers": layers,
        "layer_cost_vs": "namespaces" if "namespaces" in layers else "none",
        "layer_cost": cost,
        "hostile_memory": hostile_memory(hostile_checkpoints) if hostile_checkpoints else {},
        "verifier": verifier_waits(verifier_deadline_s, slow_answers) if slow_answers else {},
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count(),
    }


def main(argv: list[str]) -> int:
    p = Parser(prog="trace-gym bench math-env", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    p.add_argument("--seconds", type=float, default=2.0, help="duration of the cells/s measurement")
    p.add_argument("--repeats", type=int, default=20, help="restores measured per method")
    p.add_argument(
        "--hostile-checkpoints",
        type=int,
        default=16,
        help="checkpoints of the hostile memory episode (0 skips it)",
    )
    p.add_argument(
        "--slow-answers",
        type=int,
        default=4,
        help="overrunning answers in flight while an honest one is timed (0 skips it)",
    )
    p.add_argument(
        "--verifier-deadline", type=float, default=3.0, help="verifier deadline (s) for that test"
    )
    args = p.parse_args(argv)
    extras = (args.hostile_checkpoints, args.slow_answers, args.verifier_deadline)
    res = run_bench(args.seconds, args.repeats, 8, *extras)
    for key, value in res.items():
        if key in ("layers", "layer_cost"):
            continue
        if key in ("hostile_memory", "verifier"):
            print(f"{key:>28}: " + ", ".join(f"{k}={v}" for k, v in value.items()))
            continue
        goal = GOALS.get(key)
        mark = ""
        if goal is not None:
            op, target = goal
            ok = value <= target if op == "<=" else value >= target
            mark = f"   (goal {op} {target:g}: {'met' if ok else 'MISSED'})"
        print(f"{key:>28}: {value}{mark}")
    keys = (
        "sandbox_start_s",
        "cells_per_s",
        "restore_fork_ms",
        "restore_replay_ms",
        "fork_speedup",
        "restore_fork_then_cell_ms",
    )
    print(f"\n{'layers side by side':>28}: " + "  ".join(f"{k:>14}" for k in keys))
    for name, fig in res["layers"].items():
        print(f"{name:>28}: " + "  ".join(f"{fig[k]:>14}" for k in keys))
    print(
        f"\n{'cost vs ' + res['layer_cost_vs']:>28}: "
        + "  ".join(f"{k:>14}" for k in keys if k in next(iter(res["layer_cost"].values())))
    )
    for name, ratios in res["layer_cost"].items():
        print(f"{name:>28}: " + "  ".join(f"{ratios[k]:>13}x" for k in ratios))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0
