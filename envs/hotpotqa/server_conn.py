"""How the retriever's uvicorn workers treat connections: half-close, idle and per-client limits.

uvicorn's httptools protocol (`uvicorn.protocols.http.httptools_impl`), with four changes:

- a client that half-closes its side (``shutdown(SHUT_WR)`` after sending its request)
  still gets its reply, and the connection closes once the reply is out (uvicorn closes
  the transport on EOF, so the reply was dropped);
- a connection that sends nothing is closed after ``keep_alive_s``: uvicorn arms its idle
  timer only after a first response, so a connection that never spoke stayed open for ever
  and counted against ``limit_concurrency`` (1,500 of them kept every request at 503);
- a request head (request line and headers) must arrive within ``read_timeout_s`` of its
  first byte (a client trickling header bytes otherwise resets the idle timer for ever);
- at most ``max_connections_per_client`` connections per client address and
  ``max_connections`` in all (both per worker process): past either, the least recently
  active *idle* connection (no request in progress) of that client, or of anyone, is closed
  to make room, so a newcomer (a health check, a client that behaves) is served; where none
  is idle, the newcomer is answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from trace_gym.optional import require

__all__ = ["connection_protocol"]

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


def _refusal(message: str) -> bytes:
    body = b'{"error": "' + message.encode() + b'"}'
    return _REFUSED % (len(body), body)


class _Table:
    """This process's open connections, by client address, and the limits on them."""

    def __init__(self, limits: Any):
        self.per_client_limit = limits.max_connections_per_client
        self.total_limit = limits.max_connections
        self.head_s = limits.read_timeout_s
        self.by_client: dict[str, set[Any]] = {}
        self.everyone: set[Any] = set()

    @staticmethod
    def idlest(pool: set[Any], besides: Any) -> Any:
        idle = [c for c in pool if c is not besides and c.is_idle()]
        return min(idle, key=lambda c: c.last_active) if idle else None


class _Policy:
    """Mixed in before uvicorn's HttpToolsProtocol (see the module docstring)."""

    table: _Table

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        t = self.table
        self.last_active = time.monotonic()
        self.eof = False
        self.head_timer: asyncio.TimerHandle | None = None
        self.host = self.client[0] if self.client else ""  # type: ignore[attr-defined]
        mine = t.by_client.setdefault(self.host, set())
        mine.add(self)
        t.everyone.add(self)
        for pool, limit, who in (
            (mine, t.per_client_limit, "this client"),
            (t.everyone, t.total_limit, "the server"),
        ):
            if len(pool) > limit:
                victim = t.idlest(pool, self)
                if victim is None:
                    transport.write(
                        _refusal(f"{who} has {limit} connections open; at most {limit}")
                    )
                    transport.close()
                    return
                victim.transport.close()
                victim.forget()
        # uvicorn arms this only after a response: a silent connection would never time out
        self.timeout_keep_alive_task = self.loop.call_later(  # type: ignore[attr-defined]
            self.timeout_keep_alive,  # type: ignore[attr-defined]
            self.timeout_keep_alive_handler,  # type: ignore[attr-defined]
        )

    def forget(self) -> None:
        t = self.table
        t.everyone.discard(self)
        mine = t.by_client.get(self.host)
        if mine is not None:
            mine.discard(self)
            if not mine:
                del t.by_client[self.host]

    def connection_lost(self, exc: Exception | None) -> None:
        self.forget()
        self._cancel_head_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def is_idle(self) -> bool:
        """No request in progress: closing this connection loses no work."""
        cycle = self.cycle  # type: ignore[attr-defined]
        return (cycle is None or cycle.response_complete) and not self.pipeline  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        super().data_received(data)  # type: ignore[misc]

    def eof_received(self) -> bool:
        """Keep the write side open: a half-closed client still reads its reply."""
        self.eof = True
        if self.is_idle():
            self.transport.close()  # type: ignore[attr-defined]
        elif self.cycle is not None:  # type: ignore[attr-defined]
            self.cycle.keep_alive = False  # type: ignore[attr-defined]  # closed after the reply
            for cycle, _ in self.pipeline:  # type: ignore[attr-defined]
                cycle.keep_alive = False
        return True

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(self.table.head_s, self._head_timed_out)  # type: ignore[attr-defined]

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()  # type: ignore[misc]
        if self.eof and self.cycle is not None:  # type: ignore[attr-defined]
            self.cycle.keep_alive = False  # type: ignore[attr-defined]

    def on_response_complete(self) -> None:
        self.last_active = time.monotonic()
        super().on_response_complete()  # type: ignore[misc]
        transport = self.transport  # type: ignore[attr-defined]
        if self.eof and self.is_idle() and not transport.is_closing():
            transport.close()

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        transport = self.transport  # type: ignore[attr-defined]
        if self.is_idle() and not transport.is_closing():
            transport.close()


def connection_protocol(limits: Any) -> type[asyncio.Protocol]:
    """A uvicorn HTTP protocol class enforcing `limits` (a `ServerLimits`); one table per class."""
    require("httptools", "retrieval")
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return type("RetrieverHttpProtocol", (_Policy, HttpToolsProtocol), {"table": _Table(limits)})
