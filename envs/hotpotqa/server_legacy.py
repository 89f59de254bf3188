"""The old hand-written threading retrieval server, kept only for `bench retriever-server`.

`trace-gym serve-retriever` now runs `trace_gym.envs.hotpotqa.server` (a plain ASGI
app on uvicorn). This module stays so the benchmark can measure the two side by side; do not
use it to serve: it has no socket timeouts and no limit on nesting depth.

Request (``POST /retrieve``, JSON)::

    {"queries": ["who directed ..."], "topk": 3, "return_scores": true}

Response::

    {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...]]}

(without ``return_scores`` each hit is the bare document, as in Search-R1). Requests
are served by a `ThreadingHTTPServer`: one thread per connection, so concurrent
clients are not serialised (bm25s/faiss search releases the GIL for most of its work).
Malformed requests get a 4xx JSON error (``{"error": "..."}``), never a crash.
``GET /health`` reports the index.
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from trace_gym.envs.hotpotqa.retrievers import Retriever

from trace_gym.errors import TraceGymError

__all__ = ["RetrievalServer", "make_server"]

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_QUERIES = 4096
MAX_TOPK = 1000


class _BadRequest(TraceGymError):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body; raise `_BadRequest` with a message saying what to send."""
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _BadRequest(
            HTTPStatus.BAD_REQUEST,
            f'body is not JSON ({e}); send {{"queries": [...], "topk": 3, "return_scores": true}}',
        ) from e
    if not isinstance(req, dict):
        raise _BadRequest(
            HTTPStatus.BAD_REQUEST, "body must be a JSON object with a 'queries' list"
        )
    queries = req.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise _BadRequest(HTTPStatus.UNPROCESSABLE_ENTITY, "'queries' must be a list of strings")
    if len(queries) > MAX_QUERIES:
        raise _BadRequest(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"at most {MAX_QUERIES} queries per request"
        )
    topk = req.get("topk", 3)
    if topk is None:
        topk = 3
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise _BadRequest(
            HTTPStatus.UNPROCESSABLE_ENTITY, f"'topk' must be an integer in [1, {MAX_TOPK}]"
        )
    return_scores = req.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise _BadRequest(HTTPStatus.UNPROCESSABLE_ENTITY, "'return_scores' must be true or false")
    return queries, topk, return_scores


class _Handler(BaseHTTPRequestHandler):
    server: RetrievalServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), fmt % args)

    def _send(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/health", ""):
            r = self.server.retriever
            self._send(
                HTTPStatus.OK, {"status": "ok", "index": r.describe(), "passages": len(r.passages)}
            )
        else:
            self._send(
                HTTPStatus.NOT_FOUND, {"error": f"unknown path {self.path}; use POST /retrieve"}
            )

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/retrieve":
            self._send(
                HTTPStatus.NOT_FOUND, {"error": f"unknown path {self.path}; use POST /retrieve"}
            )
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length <= 0:
            self._send(
                HTTPStatus.LENGTH_REQUIRED,
                {"error": "send a JSON body with a Content-Length header"},
            )
            return
        if length > MAX_BODY_BYTES:
            self._send(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"body over {MAX_BODY_BYTES} bytes"}
            )
            self.close_connection = True
            return
        body = self.rfile.read(length)
        try:
            queries, topk, return_scores = parse_request(body)
        except _BadRequest as e:
            self._send(e.status, {"error": str(e)})
            return
        try:
            results = self.server.retriever.search(queries, topk)
        except Exception as e:  # a failing backend is reported, the server keeps serving
            log.exception("retrieval failed")
            self._send(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"error": f"retrieval failed: {type(e).__name__}: {e}"},
            )
            return
        out = []
        for hits in results:
            docs = [{"id": h.passage.id, "contents": h.passage.contents} for h in hits]
            out.append(
                [{"document": d, "score": h.score} for d, h in zip(docs, hits, strict=True)]
                if return_scores
                else docs
            )
        self._send(HTTPStatus.OK, {"result": out})


class RetrievalServer(ThreadingHTTPServer):
    """A threaded HTTP server around one `Retriever`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, retriever: Retriever, host: str = "127.0.0.1", port: int = 8000):
        self.retriever = retriever
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start_background(self) -> threading.Thread:
        """Serve on a daemon thread (for tests and notebooks); stop with `shutdown()`."""
        t = threading.Thread(target=self.serve_forever, name="trace-gym-retriever", daemon=True)
        t.start()
        return t


def make_server(retriever: Retriever, host: str = "127.0.0.1", port: int = 0) -> RetrievalServer:
    """A server for `retriever` (port 0 picks a free port; see `.url`)."""
    return RetrievalServer(retriever, host, port)
