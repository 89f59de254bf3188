"""`trace-gym bench retriever-server`: the /retrieve server under concurrent load, in one run.

One run builds a BM25 index over a 100k-passage corpus (the real HotpotQA sample's
paragraphs plus generated ones, as `bench retrieval` does), saves it and reopens it
memory-mapped, as `serve-retriever --index DIR` does, then measures on loopback:

- ``ceiling``: batched search in this process, batches of ``--clients`` queries (what 64
  clients of one query each can at most give a batcher), before and after the servers;
  also one query at a time;
- ``load_generator``: the load generator against a trivial endpoint (one canned response,
  its own process), so its own limit shows beside the servers';
- ``old``: the old threading server (`server_legacy`);
- ``new``: `serve-retriever`'s supervisor at each ``--workers`` count (default 1, 2 and the
  CPU count), with each worker's share of the requests and mean batch, and how many
  workers outlived a SIGKILL of the supervisor (must be 0);
- ``stacks``: the same app under other servers at the largest worker count (``gunicorn``
  with uvicorn workers and ``--preload``; ``granian``), with their orphans after a SIGKILL
  of the master.

The load: ``--clients`` keep-alive clients split over ``--load-procs`` processes, one query
per request (top-10), ``--warmup`` unmeasured seconds, then ``--seconds`` or
``--max-requests``. Goals are judged on the largest worker count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from trace_gym.envs.hotpotqa.bench_load import TrivialServer, run_load

from trace_gym.cli import Parser

__all__ = ["GOALS", "main"]

#: goals for the largest worker count (of_ceiling: its q/s over the in-process batched q/s)
GOALS = {"errors": 0, "p99_ms": 250.0, "of_ceiling": 0.70, "ratio_to_old": 2.0, "orphans": 0}
STACKS = ("gunicorn", "granian")


# --------------------------------------------------------------------------- processes
def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited: only its exit status is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (Linux /proc)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        frontier += kids
    return [p for p in found if _alive(p)]


def _orphans_after_sigkill(pid: int, workers: list[int]) -> int:
    """SIGKILL `pid`, give its workers 3 s to follow, count those still running, kill them."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.05)
    left = [w for w in workers if _alive(w)]
    for w in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(w, signal.SIGKILL)
    return len(left)


def _get(port: int, path: str = "/health", timeout: float = 10) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return json.loads(r.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- measurements
def _ceiling(retriever: Any, queries: list[str], batch: int, seconds: float) -> dict[str, Any]:
    """In-process q/s: batches of `batch` queries, and one query at a time (top-10)."""
    out = {}
    for name, size in (("batched", batch), ("single", 1)):
        n, i, t0 = 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or n < 3 * size:
            retriever.search([queries[(i + j) % len(queries)] for j in range(size)], 10)
            i += size
            n += size
        out[f"{name}_qps"] = round(n / (time.perf_counter() - t0), 1)
    out["batch"] = batch
    return out


def _load(port: int, bodies: list[bytes], args: argparse.Namespace, **kw: Any) -> dict[str, Any]:
    common = {"clients": args.clients, "procs": args.load_procs, **kw}
    run_load(port, bodies, seconds=args.warmup, max_requests=10 * args.clients, **common)
    res = run_load(port, bodies, seconds=args.seconds, max_requests=args.max_requests, **common)
    return res.summary()


def _serve_old(retriever: Any, conn: Any) -> None:
    from trace_gym.envs.hotpotqa.server_legacy import make_server

    server = make_server(retriever)
    # clients that give up (timeouts) make it print a traceback per broken pipe
    server.handle_error = lambda request, address: None  # type: ignore[method-assign]
    conn.send(int(server.url.rsplit(":", 1)[1]))
    server.serve_forever()


def _supervise(retriever: Any, workers: int, conn: Any) -> None:
    from trace_gym.envs.hotpotqa.supervisor import Supervisor, SupervisorOptions

    sup = Supervisor(retriever, port=0, options=SupervisorOptions(workers=workers))
    sup.start()
    conn.send((sup.socket.getsockname()[1], sup.status()["workers"]))
    sup.serve_forever()


def _forked(target: Any, *args: Any) -> tuple[Any, Any]:
    """Run `target(*args, conn)` in a forked process (sharing this one's index); its first message."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    if not parent.poll(300):
        proc.kill()
        raise RuntimeError(f"{target.__name__} did not start")
    return proc, parent.recv()


def _stop(proc: Any) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(15)
    if proc.is_alive():
        proc.kill()
    proc.join()


def _measure_old(retriever: Any, bodies: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    proc, port = _forked(_serve_old, retriever)
    try:
        return _load(port, bodies, args)
    finally:
        _stop(proc)


def _measure_new(
    retriever: Any, workers: int, bodies: list[bytes], args: argparse.Namespace
) -> dict[str, Any]:
    proc, (port, slots) = _forked(_supervise, retriever, workers)
    try:
        summary = _load(port, bodies, args)
        per = [_get(w["port"]) for w in slots.values()]
        summary["workers"] = workers
        summary["queries_per_worker"] = [h["queries"] for h in per]
        summary["mean_batch_queries"] = round(
            sum(h["queries"] for h in per) / max(sum(h["batches"] for h in per), 1), 1
        )
        summary["orphans_after_sigkill"] = _orphans_after_sigkill(
            proc.pid, [w["pid"] for w in slots.values()]
        )
    finally:
        _stop(proc)
    return summary


def _stack_command(stack: str, port: int, workers: int) -> list[str]:
    target = "trace_gym.envs.hotpotqa.server:app_from_environ"
    if stack == "gunicorn":
        return [
            *(sys.executable, "-m", "gunicorn", "-w", str(workers), "--preload"),
            *("-k", "uvicorn_worker.UvicornWorker", "-b", f"127.0.0.1:{port}"),
            *("--log-level", "warning", "--keep-alive", "5", target + "()"),
        ]
    return [
        *(sys.executable, "-m", "granian", "--interface", "asgi", "--factory"),
        *("--workers", str(workers), "--host", "127.0.0.1", "--port", str(port)),
        *("--log-level", "warning", "--backlog", "2048", target),
    ]


def _wait_for_workers(proc: subprocess.Popen, port: int, workers: int, timeout: float) -> None:
    pids: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(pids) < workers:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{workers} workers did not answer /health (exit {proc.poll()})")
        with contextlib.suppress(OSError, ValueError):
            pids.add(_get(port, timeout=2)["pid"])
        time.sleep(0.05)


def _measure_stack(
    stack: str, index: Path, workers: int, bodies: list[bytes], args: argparse.Namespace
) -> dict[str, Any]:
    """Another server running `server.app_from_environ` over `index`, at `workers` workers."""
    module = {"gunicorn": "uvicorn_worker", "granian": "granian"}[stack]
    try:
        __import__(module)
    except ImportError:
        return {"skipped": f"{module} is not installed (pip install 'trace-gym[dev]')"}
    port = _free_port()
    env = {**os.environ, "TRACE_GYM_RETRIEVER_INDEX": str(index)}
    proc = subprocess.Popen(
        _stack_command(stack, port, workers),
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait_for_workers(proc, port, workers, timeout=600)
        summary = _load(port, bodies, args)
        summary["workers"] = workers
        kids = _descendants(proc.pid)
        summary["orphans_after_sigkill"] = _orphans_after_sigkill(proc.pid, kids)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return summary


# --------------------------------------------------------------------------- the run
def _corpus(args: argparse.Namespace) -> tuple[list[Any], list[str]]:
    from trace_gym.envs.hotpotqa.bench import default_real_path, pad_corpus
    from trace_gym.envs.hotpotqa.data import context_passages, load_hotpotqa

    real_path = args.real or default_real_path()
    tasks = load_hotpotqa(real_path) if real_path.exists() else []
    corpus = pad_corpus(context_passages(tasks), args.passages, args.seed)[: args.passages]
    queries = [t.question for t in tasks] or [p.title for p in corpus[:2000]]
    return corpus, queries


def _int_list(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,2,4, got {text!r}")
    return values


def _stack_list(text: str) -> list[str]:
    names = [s for s in text.split(",") if s.strip() and s != "none"]
    bad = [s for s in names if s not in STACKS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown stack {bad[0]!r}; use {', '.join(STACKS)} or none"
        )
    return names


def _parser() -> argparse.ArgumentParser:
    cpus = os.cpu_count() or 1
    ap = Parser(prog="trace-gym bench retriever-server", description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument(
        "--seconds", type=float, default=10.0, help="measured seconds per server (default 10)"
    )
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per server first")
    ap.add_argument("--max-requests", type=int, default=60_000, help="request cap per server")
    ap.add_argument(
        "--workers",
        type=_int_list,
        default=_int_list(f"1,2,{cpus}"),
        help=f"worker counts of the new server (default 1,2,{cpus}: 1, 2 and the CPU count)",
    )
    ap.add_argument(
        "--stacks",
        type=_stack_list,
        default=list(STACKS),
        help="other servers to measure at the largest worker count (default gunicorn,granian; none)",
    )
    ap.add_argument(
        "--load-procs", type=int, default=2, help="load-generator processes (default 2)"
    )
    ap.add_argument(
        "--real", type=Path, default=None, help="HotpotQA sample for the corpus and the queries"
    )
    ap.add_argument("--skip-old", action="store_true", help="do not measure the old server")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--json", type=Path, default=None, help="also write the results to this JSON file"
    )
    return ap


def _goals(report: dict[str, Any]) -> dict[str, bool]:
    best = report["new"][str(max(int(w) for w in report["new"]))]
    ceiling = report["ceiling"]["batched_qps"]
    report["of_ceiling"] = round(best["qps"] / max(ceiling, 1e-9), 2)
    if "old" in report:
        report["ratio_to_old"] = round(best["qps"] / max(report["old"]["qps"], 1e-9), 2)
    return {
        "errors": best["errors"] == GOALS["errors"],
        "p99_ms": best["p99_ms"] <= GOALS["p99_ms"],
        "of_ceiling": report["of_ceiling"] >= GOALS["of_ceiling"],
        "ratio_to_old": report.get("ratio_to_old", 0) >= GOALS["ratio_to_old"],
        "orphans": all(r["orphans_after_sigkill"] == 0 for r in report["new"].values()),
    }


def _say(message: str) -> None:
    print(f"[retriever-server] {message}", file=sys.stderr, flush=True)


def _measure_all(
    served: Any, index: Path, queries: list[str], args: argparse.Namespace, report: dict[str, Any]
) -> None:
    from trace_gym.envs.hotpotqa.server import payload

    bodies = [
        json.dumps({"queries": [q], "topk": 10, "return_scores": True}).encode() for q in queries
    ]
    _say(f"in-process ceiling ({args.clients}-query batches)...")
    before = _ceiling(served, queries, args.clients, min(args.seconds, 5.0))
    canned = json.dumps({"result": payload(served.search(queries[:1], 10), True)}).encode()
    _say("load generator against a trivial endpoint...")
    with TrivialServer(canned) as trivial:
        report["load_generator"] = _load(trivial.port, bodies, args)
    if not args.skip_old:
        _say("old threading server...")
        report["old"] = _measure_old(served, bodies, args)
    report["new"] = {}
    for w in args.workers:
        _say(f"new server, {w} worker{'s' if w > 1 else ''}...")
        report["new"][str(w)] = _measure_new(served, w, bodies, args)
    report["stacks"] = {}
    for stack in args.stacks:
        _say(f"{stack}, {max(args.workers)} workers...")
        report["stacks"][stack] = _measure_stack(stack, index, max(args.workers), bodies, args)
    after = _ceiling(served, queries, args.clients, min(args.seconds, 5.0))
    report["ceiling"] = {
        "batched_qps": round((before["batched_qps"] + after["batched_qps"]) / 2, 1),
        "single_qps": round((before["single_qps"] + after["single_qps"]) / 2, 1),
        "batch": args.clients,
        "before": before,
        "after": after,
    }


def main(argv: list[str]) -> int:
    """Measure the old server, the new one at several worker counts, and the ceilings."""
    args = _parser().parse_args(argv)
    if (
        min(args.passages, args.clients, args.max_requests, args.load_procs) < 1
        or not args.seconds > 0
    ):
        print(
            "trace-gym bench retriever-server: --passages, --clients, --max-requests, "
            "--load-procs and --seconds must be positive",
            file=sys.stderr,
        )
        return 2
    from trace_gym.envs.hotpotqa.retrievers import BM25Retriever, load_retriever

    _say(f"indexing {args.passages:,} passages...")
    corpus, queries = _corpus(args)
    t0 = time.perf_counter()
    built = BM25Retriever(corpus)
    report: dict[str, Any] = {
        "passages": len(corpus),
        "build_s": round(time.perf_counter() - t0, 2),
        "clients": args.clients,
        "load_procs": args.load_procs,
        "topk": 10,
        "queries_per_request": 1,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory(prefix="trace-gym-bench-index-") as tmp:
        built.save(tmp)
        del built
        served = load_retriever(tmp, mmap=True)  # as `serve-retriever --index DIR` opens it
        served.warm_up()  # before forking: every server inherits the compiled kernels
        _measure_all(served, Path(tmp), queries, args, report)
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report["goals"] = GOALS
    report["goals_met"] = _goals(report)
    for k, v in report.items():
        print(f"{k:<20} {json.dumps(v)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        _say(f"wrote {args.json}")
    return 0
