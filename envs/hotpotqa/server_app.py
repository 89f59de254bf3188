"""The retriever server's ASGI app and its micro-batcher, written against ASGI directly.

`RetrieverApp` routes ``POST /retrieve``, ``GET /health`` and a JSON 404 with two string
compares, reads the body under the limits of `ServerLimits`, and assembles the response
bytes from each passage's document encoded once (`ResultEncoder`): no framework, request
object or response model on the hot path. Against an instant stand-in index that more than
doubled what one worker answers (docs/hotpotqa.md, "Retrieval server").

`MicroBatcher` joins the queries of concurrent requests into one batched search; a batch
that fails is searched again request by request, so one bad request fails alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

from trace_gym.envs.hotpotqa.retrievers import Hit, Retriever
from trace_gym.envs.hotpotqa.server_request import USAGE, BadRequest, ServerLimits, parse_request

from trace_gym.errors import TraceGymError

__all__ = ["MicroBatcher", "ResultEncoder", "RetrieverApp"]

log = logging.getLogger(__name__)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
_Pending = tuple[list[str], int, asyncio.Future]


class MicroBatcher:
    """Gathers the queries of concurrent requests into one batched `retriever.search`.

    One search runs at a time, on a worker thread. A request arriving while the index is
    idle waits up to `wait_s` for company; requests arriving while a search runs join
    the next batch, so batches grow with the load instead of searches piling up on the
    GIL. At most `max_queries` queries are searched together. The batch is searched at
    its largest k and each request keeps its own top k (ties are ordered by corpus
    position, so that is what a search at its k returns); where the batched search
    raises, each request is searched alone, so only the one that fails gets the error.
    """

    def __init__(self, retriever: Retriever, wait_s: float, max_queries: int):
        self.retriever = retriever
        self.wait_s = wait_s
        self.max_queries = max_queries
        self._pending: list[_Pending] = []
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

    async def _search(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        try:
            results = await loop.run_in_executor(None, self.search_batch, batch)
        finally:
            self._busy = False
            self._start(loop)  # whatever queued up meanwhile goes next, without waiting
        for (_, _, fut), result in zip(batch, results, strict=True):
            if fut.done():  # a request that timed out has been cancelled
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)

    def search_batch(self, batch: list[_Pending]) -> list[list[list[Hit]] | Exception]:
        """Each request's hits (or the exception its search raised): one search, alone if it fails."""
        flat = [q for qs, _, _ in batch for q in qs]
        k = max(k for _, k, _ in batch)  # one search at the largest k
        self.batches += 1
        self.queries += len(flat)
        try:
            results = self.retriever.search(flat, k) if flat else []
        except Exception as e:  # a failing backend fails only the requests it fails on
            if len(batch) == 1:
                log.exception("retrieval failed")
                return [e]
            return [self.search_batch([item])[0] for item in batch]
        out: list[list[list[Hit]] | Exception] = []
        at = 0
        for qs, kk, _ in batch:
            out.append([hits[:kk] for hits in results[at : at + len(qs)]])
            at += len(qs)
        return out


class ResultEncoder:
    """The bytes of a /retrieve response: each passage's document is JSON-encoded once.

    The output is what ``json.dumps(body, ensure_ascii=False)`` gives. Up to `cache_size`
    encoded documents are kept (the cache is emptied when full: a plain dict is cheaper
    than an LRU, and a search's hot passages come back at once).
    """

    def __init__(self, cache_size: int = 65_536):
        self.cache_size = cache_size
        self._docs: dict[Any, str] = {}

    def document(self, passage: Any) -> str:
        doc = self._docs.get(passage)
        if doc is None:
            if len(self._docs) >= self.cache_size:
                self._docs.clear()
            doc = json.dumps({"id": passage.id, "contents": passage.contents}, ensure_ascii=False)
            self._docs[passage] = doc
        return doc

    def result(self, results: list[list[Hit]], return_scores: bool) -> bytes:
        doc = self.document
        if return_scores:
            rows = (
                ", ".join(
                    f'{{"document": {doc(h.passage)}, "score": {_number(h.score)}}}' for h in hits
                )
                for hits in results
            )
        else:
            rows = (", ".join(doc(h.passage) for h in hits) for hits in results)
        return ('{"result": [' + ", ".join(f"[{row}]" for row in rows) + "]}").encode()


def _number(x: float) -> str:
    """`x` as json.dumps writes it (a float subclass such as numpy's float64 included)."""
    if isinstance(x, float) and math.isfinite(x):
        return float.__repr__(x)
    return json.dumps(x)


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, ensure_ascii=False).encode()


class _Gone(TraceGymError):  # noqa: N818  (not an error: the client left mid-body)
    """The client disconnected before its body arrived: nothing to answer."""


def _header(scope: dict[str, Any], name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def read_body(scope: dict[str, Any], receive: Receive, limits: ServerLimits) -> bytes:
    """The request body, within ``max_body_bytes`` (413) and ``read_timeout_s`` (408)."""
    declared = _header(scope, b"content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(400, "Content-Length is not a number")
        if int(declared) > limits.max_body_bytes:
            raise BadRequest(413, f"body of {int(declared)} bytes; at most {limits.max_body_bytes}")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.read_timeout_s):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise _Gone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise BadRequest(413, f"body over {limits.max_body_bytes} bytes")
                chunks.append(chunk)
                if not message.get("more_body"):
                    break
    except TimeoutError as e:
        raise BadRequest(408, f"the body did not arrive within {limits.read_timeout_s} s") from e
    if not size:
        raise BadRequest(411, f"send a JSON body; {USAGE}")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class RetrieverApp:
    """The ASGI app serving one `Retriever` (any ASGI server); /health reports `worker`."""

    def __init__(
        self, retriever: Retriever, limits: ServerLimits = ServerLimits(), worker: int | None = None
    ):
        self.retriever = retriever
        self.limits = limits
        self.worker = worker
        self.batcher = MicroBatcher(
            retriever, limits.batch_wait_ms / 1000, limits.max_batch_queries
        )
        self.encoder = ResultEncoder()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return None
        path, method = scope["path"], scope["method"]
        try:
            if path == "/retrieve" and method == "POST":
                status, body = await self.retrieve(scope, receive)
            elif path == "/health" and method in ("GET", "HEAD"):
                status, body = 200, self.health()
            elif path in ("/retrieve", "/health"):
                use = "POST /retrieve" if path == "/retrieve" else "GET /health"
                status, body = 405, error_body(f"{method} {path} is not served; use {use}")
            else:
                status, body = 404, error_body(f"unknown path {path}; use POST /retrieve")
        except _Gone:
            return None
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(body)),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return None

    async def retrieve(self, scope: dict[str, Any], receive: Receive) -> tuple[int, bytes]:
        """A /retrieve request's status and body; every failure is a JSON error."""
        limits = self.limits
        try:
            queries, topk, return_scores = parse_request(
                await read_body(scope, receive, limits), limits
            )
            async with asyncio.timeout(limits.search_timeout_s):
                results = await self.batcher.search(queries, topk)
        except BadRequest as e:
            return e.status, error_body(str(e))
        except _Gone:
            raise
        except TimeoutError:
            timeout = limits.search_timeout_s
            return 504, error_body(f"the search took over {timeout} s; retry or send fewer queries")
        except Exception as e:  # a failing backend is reported, the server keeps serving
            return 500, error_body(f"retrieval failed: {type(e).__name__}: {e}")
        return 200, self.encoder.result(results, return_scores)

    def health(self) -> bytes:
        return json.dumps(
            {
                "status": "ok",
                "index": self.retriever.describe(),
                "passages": len(self.retriever.passages),
                "batches": self.batcher.batches,
                "queries": self.batcher.queries,
                "pid": os.getpid(),
                "worker": self.worker,
            },
            ensure_ascii=False,
        ).encode()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
