"""The server's connection policy: half-closed clients get their reply, idle connections time
out, and per-client / total limits close idle connections before refusing anyone."""

from __future__ import annotations

import json
import socket
import time

import pytest
from trace_gym.envs.hotpotqa.retrievers import BM25Retriever
from trace_gym.envs.hotpotqa.server import ServerLimits, make_server

REQUEST = json.dumps({"queries": ["town"], "topk": 2, "return_scores": True}).encode()
HEAD = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"


@pytest.fixture(scope="module")
def srv(bundled):
    limits = ServerLimits(
        keep_alive_s=0.5, read_timeout_s=0.5, max_connections=40, max_connections_per_client=8
    )
    server = make_server(BM25Retriever(bundled[1][:300]), limits=limits)
    server.start_background()
    yield server
    server.shutdown()
    server.server_close()


def _connect(srv) -> socket.socket:
    host, port = srv.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_a_half_closed_client_gets_its_reply(srv):
    s = _connect(srv)
    s.sendall(HEAD % len(REQUEST) + REQUEST)
    s.shutdown(socket.SHUT_WR)  # done sending; still reading
    reply = _read_all(s)  # the server closes once the reply is out
    s.close()
    assert reply.startswith(b"HTTP/1.1 200")
    result = json.loads(reply.split(b"\r\n\r\n", 1)[1])["result"]
    assert len(result) == 1 and set(result[0][0]) == {"document", "score"}


def test_a_silent_connection_and_a_trickled_head_time_out(srv):
    silent = _connect(srv)
    t0 = time.monotonic()
    assert silent.recv(10) == b""  # closed by the server, not by our 5 s timeout
    assert time.monotonic() - t0 < 3
    slow = _connect(srv)
    t0 = time.monotonic()
    try:
        for ch in b"POST /retrieve HTTP/1.1\r\nHost: x\r\n":  # a byte every 0.1 s
            slow.send(bytes([ch]))
            time.sleep(0.1)
    except OSError:
        pass
    assert time.monotonic() - t0 < 4.5  # cut off after read_timeout_s, not after the whole head


def _retrieve_on_new_connection(srv) -> bytes:
    s = _connect(srv)
    s.sendall(HEAD % len(REQUEST) + REQUEST)
    s.shutdown(socket.SHUT_WR)
    reply = _read_all(s)
    s.close()
    return reply


def test_idle_connections_past_the_per_client_limit_make_room(srv):
    idle = [_connect(srv) for _ in range(30)]  # more than 8 per client, under 40 in all
    time.sleep(0.1)
    assert _retrieve_on_new_connection(srv).startswith(b"HTTP/1.1 200")
    closed = 0
    for s in idle:
        s.settimeout(3)
        try:
            closed += s.recv(10) == b""
        except OSError:
            closed += 1
        s.close()
    assert closed == 30  # evicted (the oldest first) or timed out; none kept the newcomer out


def test_many_half_open_connections_do_not_keep_health_at_503(srv):
    held = []
    for _ in range(120):  # three times max_connections, each sending nothing
        try:
            held.append(_connect(srv))
        except OSError:
            break
    reply = _retrieve_on_new_connection(srv)
    for s in held:
        s.close()
    assert reply.startswith(b"HTTP/1.1 200")


def test_busy_connections_past_the_limit_refuse_the_newcomer_with_503(bundled):
    class Slow(BM25Retriever):
        def search(self, queries, k=3, n_threads=0):
            time.sleep(1.5)
            return super().search(queries, k)

    limits = ServerLimits(max_connections_per_client=2, batch_wait_ms=0)
    server = make_server(Slow(bundled[1][:100]), limits=limits)
    server.start_background()
    try:
        busy = [_connect(server) for _ in range(2)]
        for s in busy:
            s.sendall(HEAD % len(REQUEST) + REQUEST)
        time.sleep(0.3)
        newcomer = _connect(server)  # answered at once, before it sends anything
        reply = _read_all(newcomer)
        newcomer.close()
        assert reply.startswith(b"HTTP/1.1 503") and b"at most 2" in reply
        for s in busy:
            assert s.recv(20).startswith(b"HTTP/1.1 200")
            s.close()
    finally:
        server.shutdown()
        server.server_close()
