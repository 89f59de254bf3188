"""`trace-gym bench math-env`: interpreter throughput and fork vs replay restore, side by side.

Every figure is measured for the default configuration (bubblewrap with every layer on)
and, in the same run, for each layer switched off in turn (no seccomp; the first
version's namespace isolation; no isolation where this is not root), so the
cost of each layer is a ratio measured under the same machine load. With ``--busy 0,1``
the whole measurement runs once per level of load, with that many busy-loop processes the
bench starts and stops itself, so idle and loaded figures come from one run;
``--profile`` adds a per-phase breakdown of a restore plus its first cell (`profile`).

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

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
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
#: issue 16's goals, for the default configuration (bwrap, every layer on): (op, target,
#: the busy processes it is judged at - issue 28: cells/s with one busy process beside it)
GOALS = {
    "restore_fork_ms": ("<=", 1.0, 0),
    "fork_speedup": (">=", 20.0, 0),
    "restore_fork_then_cell_ms": ("<=", 3.0, 0),
    "cells_per_s": (">=", 3000.0, 1),
}
#: a profiled cell: it reads the monotonic clock (the host's too: no time namespace) at its
#: start and end, so the host can split a round trip into its parts
PROFILE_CELL = "import time as _t\n_a = _t.monotonic()\n_b = total\n(_a, _t.monotonic())"


def _layers() -> dict[str, SandboxConfig]:
    """The configurations measured side by side: every layer on, then one layer off at a time."""
    layers = {
        "bwrap": SandboxConfig(),
        "bwrap_no_seccomp": SandboxConfig(seccomp=False),
    }
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
        sb.release(handles[name])
    return out


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[list[subprocess.Popen]]:
    """`n` busy-loop processes (the bench's own children), stopped and reaped on exit."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]
    try:
        time.sleep(0.3 if n else 0.0)  # let them reach the scheduler's steady state
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def _phases(marks: dict[str, float], t0: float, a: float, b: float, t2: float) -> dict[str, float]:
    """One profiled restore + cell split into its parts (ms); see `profile`."""
    return {
        # the snapshot's spare: adopt it if its hello is unread, continue it and the parked
        # process (a cell may have stopped them), check neither is stopped or dying
        "spare": marks["spare"] - t0,
        # stop (and renice) the replaced interpreter, make the spare the live one
        "handover": marks["handover"] - marks["spare"],
        # OOM score (unless set at adoption), queue the next spare's request
        "bookkeeping": marks["bookkeeping"] - marks["handover"],
        # the host's write of the request (a woken interpreter may take this CPU meanwhile)
        "request_write": marks["request"] - marks["bookkeeping"],
        # from the request until the cell's first line (`request_write` included): the
        # interpreter's wake-up, its restore of the snapshot's files and limits check, the
        # cell's parse and compile
        "to_cell_start": a - marks["bookkeeping"],
        "cell_exec": b - a,
        # the reply's encoding and write, the host's wake-up, decode and checks
        "reply": marks["reply"] - b,
        # kill the replaced interpreter, send the next spare's fork request, adopt spares
        "after_reply": marks["after"] - marks["reply"],
        "total": t2 - t0,
    }


def profile(sandboxes: dict[str, Sandbox], repeats: int) -> dict[str, dict[str, Any]]:
    """Median per-phase times (ms) of a fork restore plus its first cell, per configuration.

    Round-robin over the configurations, like `_interleaved`; ``mean_ms`` holds the means
    (which, but for ``request_write`` that ``to_cell_start`` includes, add up to the mean
    total). Beside the phases: the same
    cell's request-to-start in an interpreter that is not freshly restored
    (``steady_to_cell_start``: the difference is the file restore and copy-on-write faults),
    how long the parked snapshot takes to fork the next spare (off the critical path), and a
    restore of the same snapshot right after the first cell, before that spare is ready
    (``again_restore_then_cell``: tree search often branches twice from one node).
    """
    handles, samples = {}, {name: [] for name in sandboxes}
    for name, sb in sandboxes.items():
        sb.fresh()
        for code in HISTORY:
            assert sb.run(code).status == "ok", code
        handles[name] = sb.snapshot()
    for _ in range(repeats):
        for name, sb in sandboxes.items():
            sb.marks = []
            t0 = time.monotonic()
            assert sb.restore_snapshot(handles[name])
            first = sb.run(PROFILE_CELL)
            t2 = time.monotonic()
            marks, sb.marks = dict(sb.marks), None
            a, b = (float(v) for v in first.output.strip("()\n").split(","))
            row = _phases(marks, t0, a, b, t2)
            spare = sb._spares.get(handles[name].sid)  # noqa: SLF001 - diagnostics
            if spare is not None and spare.ready(time.monotonic() + 10):
                row["spare_fork_off_path"] = time.monotonic() - marks["after"]
            sb.marks = []
            second = sb.run(PROFILE_CELL)
            steady, sb.marks = dict(sb.marks), None
            row["steady_to_cell_start"] = float(second.output.strip("()\n").split(",")[0]) - (
                steady["request"] if "request" in steady else t2
            )
            # the same snapshot restored again at once: its next spare is still being forked
            t3 = time.monotonic()
            assert sb.restore_snapshot(handles[name]) and sb.run("total").output == "2002\n"
            row["again_restore_then_cell"] = time.monotonic() - t3
            spare = sb._spares.get(handles[name].sid)  # noqa: SLF001
            if spare is not None:
                spare.ready(time.monotonic() + 10)  # the next round starts with a ready spare
            samples[name].append(row)
    out: dict[str, dict[str, Any]] = {}
    for name, rows in samples.items():
        keys = [k for k in rows[0] if all(k in r for r in rows)]
        out[name] = {
            f"{k}_ms": round(statistics.median(r[k] for r in rows) * 1000, 3) for k in keys
        }
        # medians of the parts do not add up to the median total when the tail is heavy
        # (a loaded machine); the means do (see above)
        out[name]["mean_ms"] = {
            k: round(statistics.mean(r[k] for r in rows) * 1000, 3) for k in keys
        }
        sandboxes[name].release(handles[name])
    return out


def _start_all() -> tuple[dict[str, Sandbox], dict[str, float]]:
    """Every configuration's sandbox, started one at a time (timed)."""
    sandboxes, starts = {}, {}
    try:
        for name, cfg in _layers().items():
            sb = sandboxes[name] = Sandbox(cfg)
            t0 = time.perf_counter()
            sb.start()
            starts[name] = round(time.perf_counter() - t0, 3)
    except BaseException:
        for sb in sandboxes.values():
            sb.close()
        raise
    return sandboxes, starts


def _measure_levels(
    seconds: float, repeats: int, busy: tuple[int, ...], with_profile: bool
) -> dict[str, dict[str, Any]]:
    """Every configuration interleaved (and profiled), once per level of busy processes."""
    sandboxes, starts = _start_all()
    levels: dict[str, dict[str, Any]] = {}
    try:
        for n in busy:
            with busy_processes(n):
                load0 = os.getloadavg()[0]
                figures = _interleaved(sandboxes, seconds, repeats)
                prof = profile(sandboxes, repeats) if with_profile else None
                load1 = os.getloadavg()[0]
            levels[f"busy_{n}"] = {
                "busy_processes": n,
                "load_average_1m": [round(load0, 2), round(load1, 2)],
                "layers": {
                    name: {"sandbox_start_s": starts[name], **fig} for name, fig in figures.items()
                },
                **({"profile": prof} if prof is not None else {}),
            }
        return levels
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


def _layer_cost(layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each figure over the first version's isolation's ('namespaces' as root, else 'none')."""
    base = layers.get("namespaces") or layers["none"]
    keys = ("sandbox_start_s", "cells_per_s", "restore_fork_ms", "restore_fork_then_cell_ms")
    return {
        name: {k: round(fig[k] / base[k], 2) for k in keys if base[k]}
        for name, fig in layers.items()
    }


def goals(levels: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each goal of `GOALS` against the default configuration at its level of busy processes."""
    out = {}
    for key, (op, target, n) in GOALS.items():
        level = levels.get(f"busy_{n}")
        if level is None:
            out[key] = {"goal": f"{op} {target:g}", "busy_processes": n, "value": None}
            continue
        value = level["layers"]["bwrap"][key]
        met = value <= target if op == "<=" else value >= target
        out[key] = {
            "goal": f"{op} {target:g}",
            "busy_processes": n,
            "value": value,
            "met": met,
            "load_average_1m": level["load_average_1m"],
        }
    return out


def run_bench(
    seconds: float = 2.0,
    repeats: int = 20,
    snapshots: int = 8,
    hostile_checkpoints: int = 16,
    slow_answers: int = 4,
    verifier_deadline_s: float = 3.0,
    busy: tuple[int, ...] = (0,),
    with_profile: bool = False,
) -> dict[str, Any]:
    """The benchmark figures as a dict: the default configuration's, then every layer's.

    All configurations run at once in one process and are measured round-robin
    (`_interleaved`), so they see the same machine load, once per level of `busy`
    processes (``busy_levels``); ``layers`` holds each one's figures at the first level and
    ``layer_cost`` the ratio of each figure to the first version's isolation ('namespaces'
    as root; 'none', measured only where this is not root).
    """
    levels = _measure_levels(seconds, repeats, busy, with_profile)
    for level in levels.values():
        level["layer_cost"] = _layer_cost(level["layers"])
    layers = levels[f"busy_{busy[0]}"]["layers"]
    main = layers["bwrap"] if layers["bwrap"]["mode"] == "bwrap" else next(iter(layers.values()))
    return {
        **{k: v for k, v in main.items() if k not in ("mode", "seccomp")},
        **_snapshot_memory(snapshots),
        "isolation": main["mode"],
        "history_cells": len(HISTORY),
        "repeats": repeats,
        "busy_first": busy[0],
        "layers": layers,
        "layer_cost_vs": "namespaces" if "namespaces" in layers else "none",
        "layer_cost": levels[f"busy_{busy[0]}"]["layer_cost"],
        "busy_levels": levels,
        "goals": goals(levels),
        "hostile_memory": hostile_memory(hostile_checkpoints) if hostile_checkpoints else {},
        "verifier": verifier_waits(verifier_deadline_s, slow_answers) if slow_answers else {},
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count(),
    }


def _busy_levels(text: str) -> tuple[int, ...]:
    """``--busy 0,1``: levels of busy processes, each in [0, 64]."""
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 0,1, got {text!r}") from None
    if not levels or not all(0 <= n <= 64 for n in levels):
        raise argparse.ArgumentTypeError(f"each count must be in [0, 64], got {text!r}")
    if len(set(levels)) < len(levels):
        raise argparse.ArgumentTypeError(f"each count once, got {text!r}")
    return levels


_TABLE = (
    "sandbox_start_s",
    "cells_per_s",
    "restore_fork_ms",
    "restore_replay_ms",
    "fork_speedup",
    "restore_fork_then_cell_ms",
)


def _print_level(name: str, level: dict[str, Any]) -> None:
    print(
        f"\n{name} ({level['busy_processes']} busy processes, load average "
        f"{level['load_average_1m'][0]} -> {level['load_average_1m'][1]})"
    )
    print(f"{'layers side by side':>28}: " + "  ".join(f"{k:>14}" for k in _TABLE))
    for layer, fig in level["layers"].items():
        print(f"{layer:>28}: " + "  ".join(f"{fig[k]:>14}" for k in _TABLE))
    costs = level["layer_cost"]
    print(
        f"{'cost vs ' + ('namespaces' if 'namespaces' in costs else 'none'):>28}: "
        + "  ".join(f"{k:>14}" for k in next(iter(costs.values())))
    )
    for layer, ratios in costs.items():
        print(f"{layer:>28}: " + "  ".join(f"{ratios[k]:>13}x" for k in ratios))
    prof = level.get("profile")
    if prof:
        keys = [k for k in next(iter(prof.values())) if k != "mean_ms"]
        print(f"{'restore + cell, ms':>28}: " + "  ".join(f"{k[:-3]:>13}" for k in keys))
        for layer, phases in prof.items():
            print(f"{layer:>28}: " + "  ".join(f"{phases.get(k, ''):>13}" for k in keys))


def main(argv: list[str]) -> int:
    p = Parser(prog="trace-gym bench math-env", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    p.add_argument("--seconds", type=float, default=2.0, help="duration of the cells/s measurement")
    p.add_argument("--repeats", type=int, default=20, help="restores measured per method")
    p.add_argument(
        "--busy",
        type=_busy_levels,
        default=(0,),
        help="busy-loop processes the bench runs beside the measurement, one level after "
        "another (e.g. 0,1: idle, then one busy process)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also split a restore plus its first cell into phases, per configuration",
    )
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
    if args.repeats < 1 or args.seconds <= 0:
        p.error("--repeats must be >= 1 and --seconds > 0")
    extras = (args.hostile_checkpoints, args.slow_answers, args.verifier_deadline)
    res = run_bench(args.seconds, args.repeats, 8, *extras, args.busy, args.profile)
    for key, value in res.items():
        if key in ("layers", "layer_cost", "busy_levels", "goals"):
            continue
        if key in ("hostile_memory", "verifier"):
            print(f"{key:>28}: " + ", ".join(f"{k}={v}" for k, v in value.items()))
            continue
        print(f"{key:>28}: {value}")
    for name, level in res["busy_levels"].items():
        _print_level(name, level)
    print(f"\n{'goals (bwrap, every layer)':>28}:")
    for key, g in res["goals"].items():
        where = f"{g['busy_processes']} busy"
        if g["value"] is None:
            print(f"{key:>28}: not measured ({where}; add it to --busy)")
            continue
        verdict = "met" if g["met"] else "NOT MET"
        print(
            f"{key:>28}: {g['value']} (goal {g['goal']}, {where}, load "
            f"{g['load_average_1m'][0]}): {verdict}"
        )
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0
