"""`trace-gym bench retriever-server`: the /retrieve server under concurrent load, new vs old.

One run builds a BM25 index over a 100k-passage corpus (the real HotpotQA sample's
paragraphs plus generated ones, as `bench retrieval` does), then serves it on loopback
twice, each server in its own forked process: the FastAPI/uvicorn server of
`trace_gym.envs.hotpotqa.server` and the old threading server kept in
`server_legacy`. Against each, 64 clients in one asyncio process send one query per
request (top-10) over keep-alive connections for a bounded time and request count.
Reported per server: requests, errors (non-200 answers, resets, timeouts), q/s, p50/p99
latency; and the ratio of the new server's q/s to the old one's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.cli import Parser

__all__ = ["LoadResult", "main", "run_load"]

GOALS = {"errors": 0, "p99_ms": 250.0, "qps": 1500.0, "ratio_to_old": 2.0}


@dataclass
class LoadResult:
    """What the clients saw against one server."""

    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    error_kinds: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms) if self.latencies_ms else np.zeros(1)
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_kinds": self.error_kinds,
            "seconds": round(self.seconds, 2),
            "qps": round(self.requests / max(self.seconds, 1e-9), 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "max_ms": round(float(lat.max()), 2),
        }

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


def _request(body: bytes) -> bytes:
    head = f"POST /retrieve HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> int:
    writer.write(req)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next(
        int(h.split(":", 1)[1]) for h in lines[1:] if h.lower().startswith("content-length:")
    )
    await reader.readexactly(length)
    return status


async def _client(
    port: int,
    bodies: list[bytes],
    start: int,
    stop_at: float,
    budget: list[int],
    out: LoadResult,
    timeout: float,
) -> None:
    conn = None
    i = start
    while time.perf_counter() < stop_at and budget[0] > 0:
        budget[0] -= 1
        req = _request(bodies[i % len(bodies)])
        i += 1
        t0 = time.perf_counter()
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
            status = await asyncio.wait_for(_one(*conn, req), timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, StopIteration) as e:
            out.error(type(e).__name__)
            if conn is not None:
                conn[1].close()
            conn = None
            continue
        out.requests += 1
        out.latencies_ms.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            out.error(f"http_{status}")
    if conn is not None:
        conn[1].close()


async def _load(
    port: int, bodies: list[bytes], clients: int, seconds: float, max_requests: int, timeout: float
) -> LoadResult:
    out = LoadResult()
    budget = [max_requests]
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    await asyncio.gather(
        *(_client(port, bodies, c * 7, stop_at, budget, out, timeout) for c in range(clients))
    )
    out.seconds = time.perf_counter() - t0
    return out


def run_load(
    port: int,
    queries: list[str],
    *,
    clients: int = 64,
    seconds: float = 10.0,
    max_requests: int = 100_000,
    topk: int = 10,
    timeout: float = 10.0,
) -> LoadResult:
    """`clients` keep-alive clients, one query per request, until `seconds` or `max_requests`."""
    bodies = [
        json.dumps({"queries": [q], "topk": topk, "return_scores": True}).encode() for q in queries
    ]
    try:
        import uvloop

        return uvloop.run(_load(port, bodies, clients, seconds, max_requests, timeout))
    except ImportError:
        return asyncio.run(_load(port, bodies, clients, seconds, max_requests, timeout))


def _serve(kind: str, retriever: Any, conn: Any) -> None:
    """Child process: serve `retriever` with the `kind` server, send the port, serve until killed."""
    if kind == "new":
        from trace_gym.envs.hotpotqa.server import make_server

        server = make_server(retriever)
    else:
        from trace_gym.envs.hotpotqa.server_legacy import make_server

        server = make_server(retriever)
    if kind == "old":  # clients that give up (timeouts) make it print a traceback per broken pipe
        server.handle_error = lambda request, address: None
    conn.send(int(server.url.rsplit(":", 1)[1]))
    server.serve_forever()


def _measure(
    kind: str, retriever: Any, queries: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    ctx = mp.get_context("fork")  # the child shares the parent's built index
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(kind, retriever, child), daemon=True)
    proc.start()
    try:
        if not parent.poll(60):
            raise RuntimeError(f"the {kind} server did not start")
        port = parent.recv()
        run_load(
            port, queries, clients=args.clients, seconds=args.warmup, max_requests=10 * args.clients
        )
        res = run_load(
            port,
            queries,
            clients=args.clients,
            seconds=args.seconds,
            max_requests=args.max_requests,
        )
        summary = res.summary()
        if kind == "new":  # how well the micro-batcher gathered queries
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
                health = json.loads(r.read())
            summary["mean_batch_queries"] = round(health["queries"] / max(health["batches"], 1), 1)
    finally:
        proc.terminate()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return summary


def _corpus(args: argparse.Namespace) -> tuple[list[Any], list[str]]:
    from trace_gym.envs.hotpotqa.bench import default_real_path, pad_corpus
    from trace_gym.envs.hotpotqa.data import context_passages, load_hotpotqa

    real_path = args.real or default_real_path()
    tasks = load_hotpotqa(real_path) if real_path.exists() else []
    corpus = pad_corpus(context_passages(tasks), args.passages, args.seed)[: args.passages]
    queries = [t.question for t in tasks] or [p.title for p in corpus[:2000]]
    return corpus, queries


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="trace-gym bench retriever-server", description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument(
        "--seconds", type=float, default=10.0, help="measured seconds per server (default 10)"
    )
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per server first")
    ap.add_argument("--max-requests", type=int, default=60_000, help="request cap per server")
    ap.add_argument(
        "--real", type=Path, default=None, help="HotpotQA sample for the corpus and the queries"
    )
    ap.add_argument("--skip-old", action="store_true", help="measure the new server only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--json", type=Path, default=None, help="also write the results to this JSON file"
    )
    return ap


def main(argv: list[str]) -> int:
    """Measure the new and the old retrieval server side by side (see the module docstring)."""
    args = _parser().parse_args(argv)
    if min(args.passages, args.clients, args.max_requests) < 1 or not args.seconds > 0:
        print(
            "trace-gym bench retriever-server: --passages, --clients, --max-requests and --seconds must be positive",
            file=sys.stderr,
        )
        return 2
    from trace_gym.envs.hotpotqa.retrievers import BM25Retriever

    print(f"[retriever-server] indexing {args.passages:,} passages...", file=sys.stderr)
    corpus, queries = _corpus(args)
    t0 = time.perf_counter()
    retriever = BM25Retriever(corpus)
    build_s = time.perf_counter() - t0
    retriever.warm_up()  # before forking: both servers inherit the compiled kernels
    report: dict[str, Any] = {
        "passages": len(corpus),
        "build_s": round(build_s, 2),
        "clients": args.clients,
        "topk": 10,
        "queries_per_request": 1,
    }
    for kind in ("new", "old")[: 1 if args.skip_old else 2]:
        print(
            f"[retriever-server] {kind} server: {args.clients} clients for {args.seconds:g} s...",
            file=sys.stderr,
        )
        report[kind] = _measure(kind, retriever, queries, args)
    if "old" in report:
        report["ratio_to_old"] = round(report["new"]["qps"] / max(report["old"]["qps"], 1e-9), 2)
    new = report["new"]
    report["goals_met"] = {
        "errors": new["errors"] == GOALS["errors"],
        "p99_ms": new["p99_ms"] <= GOALS["p99_ms"],
        "qps": new["qps"] >= GOALS["qps"],
        "ratio_to_old": report.get("ratio_to_old", 0) >= GOALS["ratio_to_old"],
    }
    for k, v in report.items():
        print(f"{k:<20} {json.dumps(v)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
