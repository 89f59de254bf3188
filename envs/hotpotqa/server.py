"""`trace-gym serve-retriever`: an index over HTTP with Search-R1's `/retrieve` shape.

Request (``POST /retrieve``, JSON)::

    {"queries": ["who directed ..."], "topk": 3, "return_scores": true}

Response::

    {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...]]}

(without ``return_scores`` each hit is the bare document, as in Search-R1).
``GET /health`` reports the index. Errors are ``{"error": "..."}`` with a 4xx/5xx code.

Built on FastAPI/Starlette under uvicorn (the ``retrieval`` extra). Limits
(`ServerLimits`, each a command-line flag):

- body size (413), queries per request (413), topk and query length (422);
- nesting depth: bodies nested deeper than a request can be are refused (400) before
  any JSON parsing;
- timeouts: reading the request head (closed) and body (408), the search itself (504),
  idle connections, new ones included (closed);
- connections: at most ``max_connections_per_client`` per client address and
  ``max_connections`` in all, per process; past either the least recently active idle
  connection is closed to make room, and where none is idle the newcomer gets 503
  (`trace_gym.envs.hotpotqa.server_conn`, which also replies to half-closed clients).

Concurrent requests are micro-batched (`MicroBatcher`): one batched BM25/dense search
runs at a time on a worker thread, and the requests that arrive meanwhile (or within
``batch_wait_ms`` of an idle index) are searched together next, so the event loop keeps
accepting while the index works and batches grow with the load.

`RetrievalServer` serves in this process; `trace_gym.envs.hotpotqa.supervisor` runs
several worker processes over one socket (`trace-gym serve-retriever --workers N`, in
`trace_gym.envs.hotpotqa.serve`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from trace_gym.envs.hotpotqa.retrievers import Hit, Retriever
from trace_gym.envs.hotpotqa.server_conn import connection_protocol

from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.optional import require

__all__ = [
    "MicroBatcher",
    "RetrievalServer",
    "ServerLimits",
    "make_app",
    "app_from_environ",
    "make_server",
    "parse_request",
    "payload",
    "uvicorn_config",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for, and how long the server waits."""

    #: largest request body in bytes (413 above)
    max_body_bytes: int = 1 << 20
    #: queries per request (413 above)
    max_queries: int = 512
    #: largest topk (422 above)
    max_topk: int = 100
    #: characters per query (422 above)
    max_query_chars: int = 4096
    #: JSON nesting depth; a valid request needs 2 (400 above, checked before parsing)
    max_depth: int = 8
    #: seconds to receive the whole body (408 after)
    read_timeout_s: float = 10.0
    #: seconds a search may take, queueing included (504 after)
    search_timeout_s: float = 30.0
    #: seconds an idle connection (a new one too) stays open; a request head has read_timeout_s
    keep_alive_s: float = 5.0
    #: open connections at once, per process (idle ones are closed first; then 503)
    max_connections: int = 1024
    #: open connections per client address, per process (idle ones are closed first; then 503)
    max_connections_per_client: int = 256
    #: how long the first request of a batch waits for others to join (milliseconds)
    batch_wait_ms: float = 2.0
    #: most queries searched in one batch
    max_batch_queries: int = 256

    def __post_init__(self):
        for name in (
            "max_body_bytes",
            "max_queries",
            "max_topk",
            "max_query_chars",
            "max_depth",
            "max_connections",
            "max_connections_per_client",
            "max_batch_queries",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("read_timeout_s", "search_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.batch_wait_ms <= 1000:
            raise ConfigError(f"batch_wait_ms must be in [0, 1000], got {self.batch_wait_ms}")


class BadRequest(TraceGymError):
    """A request the server refuses; `status` is the HTTP code."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


_USAGE = 'send {"queries": ["..."], "topk": 3, "return_scores": true}'


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_STRUCTURE = bytes(c for c in range(256) if chr(c) not in "[]{}")


def _check_depth(body: bytes, limit: int) -> None:
    """Refuse nesting deeper than `limit` before parsing (json.loads recurses per level)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return
    depth = 0
    for ch in _STRING.sub(b"", body).translate(
        None, _STRUCTURE
    ):  # only brackets outside strings remain
        depth += 1 if ch in b"[{" else -1
        if depth > limit:
            raise BadRequest(400, f"JSON nested deeper than {limit} levels; {_USAGE}")


def parse_request(
    body: bytes, limits: ServerLimits = ServerLimits()
) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body; raise `BadRequest` with a message saying what to send."""
    _check_depth(body, limits.max_depth)
    try:
        req = json.loads(body)
    except (
        ValueError,
        RecursionError,
    ) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BadRequest(400, f"body is not JSON ({e}); {_USAGE}") from e
    if not isinstance(req, dict):
        raise BadRequest(400, f"body must be a JSON object; {_USAGE}")
    queries = req.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest(422, f"'queries' must be a list of strings; {_USAGE}")
    if len(queries) > limits.max_queries:
        raise BadRequest(413, f"{len(queries)} queries; at most {limits.max_queries} per request")
    longest = max((len(q) for q in queries), default=0)
    if longest > limits.max_query_chars:
        raise BadRequest(422, f"a query has {longest} characters; at most {limits.max_query_chars}")
    topk = req.get("topk", 3)
    if topk is None:
        topk = 3
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= limits.max_topk:
        raise BadRequest(
            422, f"'topk' must be an integer in [1, {limits.max_topk}], got {topk!r:.40}"
        )
    return_scores = req.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise BadRequest(422, "'return_scores' must be true or false")
    return queries, topk, return_scores


class MicroBatcher:
    """Gathers the queries of concurrent requests into one batched `retriever.search`.

    One search runs at a time, on a worker thread. A request arriving while the index is
    idle waits up to `wait_s` for company; requests arriving while a search runs join
    the next batch, so batches grow with the load instead of searches piling up on the
    GIL. At most `max_queries` queries are searched together.
    """

    def __init__(self, retriever: Retriever, wait_s: float, max_queries: int):
        self.retriever = retriever
        self.wait_s = wait_s
        self.max_queries = max_queries
        self._pending: list[tuple[list[str], int, asyncio.Future]] = []
        self._size = 0
        self._flush: asyncio.TimerHandle | None = None
        self._busy = False
        #: batches and queries searched so far (reported by /health)
        self.batches = 0
        self.queries = 0

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._pending.append((queries, k, fut))
        self._size += len(queries)
        if not self._busy:
            if self._size >= self.max_queries or self.wait_s == 0:
                self._start(loop)
            elif self._flush is None:
                self._flush = loop.call_later(self.wait_s, self._start, loop)
        return await fut

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._busy or not self._pending:
            return
        batch, size = [], 0
        while self._pending and (not batch or size + len(self._pending[0][0]) <= self.max_queries):
            item = self._pending.pop(0)
            batch.append(item)
            size += len(item[0])
        self._size -= size
        self._busy = True
        loop.create_task(self._search(loop, batch))

    async def _search(
        self, loop: asyncio.AbstractEventLoop, batch: list[tuple[list[str], int, asyncio.Future]]
    ) -> None:
        flat = [q for qs, _, _ in batch for q in qs]
        k = max(
            k for _, k, _ in batch
        )  # one search at the largest k; each request keeps its own top-k
        try:
            results = await asyncio.to_thread(self.retriever.search, flat, k)
        except Exception as e:  # a failing backend fails this batch's requests, not the server
            log.exception("retrieval failed")
            results = e
        finally:
            self._busy = False
            self._start(loop)  # whatever queued up meanwhile goes next, without waiting
        self.batches += 1
        self.queries += len(flat)
        at = 0
        for qs, kk, fut in batch:
            if not fut.done():  # a request that timed out has been cancelled
                if isinstance(results, Exception):
                    fut.set_exception(results)
                else:
                    fut.set_result([hits[:kk] for hits in results[at : at + len(qs)]])
            at += len(qs)


def payload(results: list[list[Hit]], return_scores: bool) -> list[list[dict[str, Any]]]:
    """The ``result`` field of a /retrieve response (Search-R1's shape)."""
    out = []
    for hits in results:
        docs = [{"id": h.passage.id, "contents": h.passage.contents} for h in hits]
        out.append(
            [{"document": d, "score": h.score} for d, h in zip(docs, hits, strict=True)]
            if return_scores
            else docs
        )
    return out


async def _read_body(request: Any, limits: ServerLimits) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(400, "Content-Length is not a number")
        if int(declared) > limits.max_body_bytes:
            raise BadRequest(413, f"body of {declared} bytes; at most {limits.max_body_bytes}")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise BadRequest(413, f"body over {limits.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        body = await asyncio.wait_for(read(), limits.read_timeout_s)
    except TimeoutError as e:
        raise BadRequest(408, f"the body did not arrive within {limits.read_timeout_s} s") from e
    if not body:
        raise BadRequest(411, f"send a JSON body; {_USAGE}")
    return body


def make_app(
    retriever: Retriever, limits: ServerLimits = ServerLimits(), worker: int | None = None
) -> Any:
    """The FastAPI app serving `retriever` (any ASGI server); /health reports `worker`."""
    require("fastapi", "retrieval")
    from fastapi import FastAPI
    from fastapi.responses import Response

    app = FastAPI(title="trace-gym retriever", docs_url=None, redoc_url=None, openapi_url=None)
    batcher = MicroBatcher(retriever, limits.batch_wait_ms / 1000, limits.max_batch_queries)
    app.state.batcher = batcher

    def reply(status: int, body: dict[str, Any]) -> Response:
        return Response(
            json.dumps(body, ensure_ascii=False),
            status_code=status,
            media_type="application/json",
        )

    # plain Starlette routes: the handlers read the raw body themselves (size, time and
    # depth limits come before any parsing), so FastAPI's body validation is bypassed
    async def retrieve(request: Any) -> Response:
        try:
            queries, topk, return_scores = parse_request(await _read_body(request, limits), limits)
            results = await asyncio.wait_for(batcher.search(queries, topk), limits.search_timeout_s)
        except BadRequest as e:
            return reply(e.status, {"error": str(e)})
        except TimeoutError:
            return reply(
                504,
                {
                    "error": f"the search took over {limits.search_timeout_s} s; retry or send fewer queries"
                },
            )
        except Exception as e:  # a failing backend is reported, the server keeps serving
            return reply(500, {"error": f"retrieval failed: {type(e).__name__}: {e}"})
        return reply(200, {"result": payload(results, return_scores)})

    async def health(request: Any) -> Response:
        return reply(
            200,
            {
                "status": "ok",
                "index": retriever.describe(),
                "passages": len(retriever.passages),
                "batches": batcher.batches,
                "queries": batcher.queries,
                "pid": os.getpid(),
                "worker": worker,
            },
        )

    async def unknown(request: Any) -> Response:
        return reply(404, {"error": f"unknown path {request.url.path}; use POST /retrieve"})

    app.add_route("/retrieve", retrieve, methods=["POST"])
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/{path:path}", unknown, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    return app


class RetrievalServer:
    """A uvicorn server around one `Retriever`, bound at construction (port 0: a free port)."""

    def __init__(
        self,
        retriever: Retriever,
        host: str = "127.0.0.1",
        port: int = 8000,
        limits: ServerLimits = ServerLimits(),
    ):
        require("uvicorn", "retrieval")
        import uvicorn

        self.retriever = retriever
        self.limits = limits
        self.socket = socket.create_server((host, port), backlog=2048)
        self._server = uvicorn.Server(uvicorn_config(retriever, limits))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        """Serve in this thread until `shutdown()` (or Ctrl-C, or SIGTERM)."""
        self._server.run(sockets=[self.socket])

    def start_background(self) -> threading.Thread:
        """Serve on a daemon thread (for tests and notebooks); stop with `shutdown()`."""
        self._thread = threading.Thread(
            target=self.serve_forever, name="trace-gym-retriever", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._thread

    def shutdown(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def server_close(self) -> None:
        self.socket.close()


def make_server(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: ServerLimits = ServerLimits(),
) -> RetrievalServer:
    """A server for `retriever` (port 0 picks a free port; see `.url`)."""
    return RetrievalServer(retriever, host, port, limits)


def uvicorn_config(
    retriever: Retriever, limits: ServerLimits = ServerLimits(), worker: int | None = None
) -> Any:
    """The uvicorn configuration every server here runs: the app and the connection policy."""
    require("uvicorn", "retrieval")
    import uvicorn

    return uvicorn.Config(
        make_app(retriever, limits, worker),
        http=connection_protocol(limits),
        log_level="warning",
        access_log=False,
        timeout_keep_alive=limits.keep_alive_s,
        # the protocol keeps connections within max_connections (closing idle ones first);
        # uvicorn's own limit then only bounds requests in flight
        limit_concurrency=limits.max_connections + 1,
    )


def app_from_environ() -> Any:
    """An app over the index directory in ``$TRACE_GYM_RETRIEVER_INDEX`` (memory-mapped).

    For other ASGI servers (``gunicorn --preload 'trace_gym.envs.hotpotqa.server:app_from_environ()'``,
    ``granian --factory``); `bench retriever-server` measures them this way.
    """
    from trace_gym.envs.hotpotqa.retrievers import load_retriever

    path = os.environ.get("TRACE_GYM_RETRIEVER_INDEX")
    if not path:
        raise ConfigError("set TRACE_GYM_RETRIEVER_INDEX to an index directory")
    retriever = load_retriever(path, mmap=True)
    retriever.warm_up()
    return make_app(retriever)
