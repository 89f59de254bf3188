"""`trace-gym serve-retriever`: an index over HTTP with Search-R1's `/retrieve` shape.

Request (``POST /retrieve``, JSON)::

    {"queries": ["who directed ..."], "topk": 3, "return_scores": true}

Response::

    {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...]]}

(without ``return_scores`` each hit is the bare document, as in Search-R1).
``GET /health`` reports the index. Errors are ``{"error": "..."}`` with a 4xx/5xx code.

A plain ASGI app (`trace_gym.envs.hotpotqa.server_app`: no framework on the hot path)
under uvicorn with httptools and uvloop (the ``retrieval`` extra). Limits (`ServerLimits`,
in `trace_gym.envs.hotpotqa.server_request`, each a command-line flag):

- body size (413), queries per request (413), topk and query length (422);
- nesting depth: bodies nested deeper than a request can be are refused (400) before
  any JSON parsing;
- timeouts: reading the request head (closed) and body (408), the search itself (504),
  idle connections, new ones included (closed);
- connections: at most ``max_connections_per_client`` per client address and
  ``max_connections`` in all, per process; past either the least recently active idle
  connection is closed to make room, and where none is idle the newcomer gets 503
  (`trace_gym.envs.hotpotqa.server_conn`, which also replies to half-closed clients).

Concurrent requests are micro-batched (`server_app.MicroBatcher`): one batched BM25/dense search
runs at a time on a worker thread, and the requests that arrive meanwhile (or within
``batch_wait_ms`` of an idle index) are searched together next, so the event loop keeps
accepting while the index works and batches grow with the load.

`RetrievalServer` serves in this process; `trace_gym.envs.hotpotqa.supervisor` runs
several worker processes over one socket (`trace-gym serve-retriever --workers N`, in
`trace_gym.envs.hotpotqa.serve`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from trace_gym.envs.hotpotqa.retrievers import Retriever
from trace_gym.envs.hotpotqa.server_app import RetrieverApp
from trace_gym.envs.hotpotqa.server_conn import connection_protocol
from trace_gym.envs.hotpotqa.server_request import (
    USAGE,
    BadRequest,
    ServerLimits,
    parse_request,
    payload,
)

from trace_gym.errors import ConfigError
from trace_gym.optional import require

__all__ = [
    "USAGE",
    "BadRequest",
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


def make_app(
    retriever: Retriever, limits: ServerLimits = ServerLimits(), worker: int | None = None
) -> Any:
    """The ASGI app serving `retriever` (any ASGI server); /health reports `worker`."""
    return RetrieverApp(retriever, limits, worker)


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
        lifespan="off",  # the app holds no resources to open or close
        proxy_headers=False,  # the app never reads the client address (the protocol does)
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
