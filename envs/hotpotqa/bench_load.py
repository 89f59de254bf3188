"""The load generator of `bench retriever-server`: keep-alive HTTP clients in processes of their own.

`run_load` forks ``procs`` processes, each running its share of the clients on one event
loop (uvloop when installed); every client sends one request at a time over one
keep-alive connection until the deadline or the shared request budget runs out, and the
processes send back their counts and latencies. `TrivialServer` answers every request
with one canned response in a process of its own: the generator's rate against it,
reported beside the servers', shows the generator is not what limits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["LoadResult", "TrivialServer", "run_load"]


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

    def error(self, kind: str, n: int = 1) -> None:
        self.errors += n
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + n

    def merge(self, other: LoadResult) -> None:
        self.requests += other.requests
        self.latencies_ms += other.latencies_ms
        self.seconds = max(self.seconds, other.seconds)
        for kind, n in other.error_kinds.items():
            self.error(kind, n)


def _request(body: bytes, path: str = "/retrieve") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
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


@dataclass
class _Plan:
    port: int
    requests: list[bytes]
    start_at: float  # time.monotonic() of the start, the same clock in every process
    seconds: float
    budget: Any  # a shared counter: requests left to send, across processes
    timeout: float


def _take(budget: Any) -> bool:
    with budget.get_lock():
        if budget.value <= 0:
            return False
        budget.value -= 1
        return True


async def _client(plan: _Plan, start: int, out: LoadResult) -> None:
    conn = None
    i = start
    stop_at = plan.start_at + plan.seconds
    while time.monotonic() < stop_at and _take(plan.budget):
        req = plan.requests[i % len(plan.requests)]
        i += 1
        t0 = time.perf_counter()
        try:
            if conn is None:
                conn = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", plan.port), plan.timeout
                )
            status = await asyncio.wait_for(_one(*conn, req), plan.timeout)
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


async def _clients(plan: _Plan, first: int, n: int) -> LoadResult:
    out = LoadResult()
    await asyncio.sleep(max(plan.start_at - time.monotonic(), 0))
    await asyncio.gather(*(_client(plan, c * 7, out) for c in range(first, first + n)))
    out.seconds = time.monotonic() - plan.start_at
    return out


def _load_process(plan: _Plan, first: int, n: int, conn: Any) -> None:
    try:
        from uvloop import run as run_loop
    except ImportError:
        run_loop = asyncio.run
    out = run_loop(_clients(plan, first, n))
    conn.send(out)
    conn.close()


def run_load(
    port: int,
    bodies: list[bytes],
    *,
    clients: int = 64,
    seconds: float = 10.0,
    max_requests: int = 100_000,
    procs: int = 2,
    timeout: float = 10.0,
    path: str = "/retrieve",
) -> LoadResult:
    """`clients` keep-alive clients over `procs` processes, until `seconds` or `max_requests`."""
    ctx = mp.get_context("fork")
    procs = max(1, min(procs, clients))
    plan = _Plan(
        port,
        [_request(b, path) for b in bodies],
        time.monotonic() + 0.2 + 0.05 * procs,  # every process is up before the start
        seconds,
        ctx.Value("q", max_requests),
        timeout,
    )
    share = [clients // procs + (1 if p < clients % procs else 0) for p in range(procs)]
    workers = []
    for p in range(procs):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_load_process, args=(plan, sum(share[:p]), share[p], child), daemon=True
        )
        proc.start()
        child.close()
        workers.append((proc, parent))
    total = LoadResult()
    try:
        for _proc, parent in workers:
            if not parent.poll(seconds + 4 * timeout + 30):
                raise RuntimeError("a load-generator process did not report")
            total.merge(parent.recv())
    finally:
        for proc, _ in workers:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return total


class _Canned(asyncio.Protocol):
    response = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            self.transport.write(self.response)


def _serve_canned(sock: socket.socket, response: bytes) -> None:
    _Canned.response = response
    try:
        from uvloop import run as run_loop
    except ImportError:
        run_loop = asyncio.run

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Canned, sock=sock)
        await server.serve_forever()

    run_loop(serve())


class TrivialServer:
    """A process answering every request with `body` (HTTP 200): the load generator's yardstick."""

    def __init__(self, body: bytes):
        self.socket = socket.create_server(("127.0.0.1", 0), backlog=2048)
        self.port = self.socket.getsockname()[1]
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        self._proc = mp.get_context("fork").Process(
            target=_serve_canned, args=(self.socket, head.encode() + body), daemon=True
        )

    def __enter__(self) -> TrivialServer:
        self._proc.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGKILL)
        self._proc.join(10)
        self.socket.close()
