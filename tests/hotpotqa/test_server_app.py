"""The retriever's ASGI app and micro-batcher, driven directly (no socket): a batched search
gives every request exactly its own unbatched results, ties and failures included, and the
response bytes are those of ``json.dumps``."""

from __future__ import annotations

import asyncio
import json
import math
import time

import numpy as np
import pytest
from trace_gym.envs.hotpotqa.retrievers import BM25Retriever, Hit
from trace_gym.envs.hotpotqa.server_app import MicroBatcher, ResultEncoder, RetrieverApp
from trace_gym.envs.hotpotqa.server_request import ServerLimits, payload
from trace_gym.envs.hotpotqa.task import Passage


@pytest.fixture(scope="module")
def tied():
    """Passages where most queries tie across many documents (repeated texts)."""
    texts = ["river town bridge", "river town", "town hall", "bridge over river", "hall"]
    return BM25Retriever([Passage(f"p{i}", f"T{i % 7}", texts[i % len(texts)]) for i in range(120)])


QUERIES = ["river", "town", "hall bridge", "nothing matches", "river town bridge hall"]


def _batched(batcher: MicroBatcher, requests: list[tuple[list[str], int]]) -> list:
    """Submit `requests` concurrently (one batch) and return each one's result or exception."""

    async def run() -> list:
        return await asyncio.gather(
            *(batcher.search(qs, k) for qs, k in requests), return_exceptions=True
        )

    return asyncio.run(run())


def _ids(results: list[list[Hit]]) -> list[list[tuple[str, float]]]:
    return [[(h.passage.id, h.score) for h in hits] for hits in results]


def test_a_batch_gives_each_request_its_unbatched_results_with_ties(tied):
    requests = [([q], 1 + (3 * i) % 12) for i, q in enumerate(QUERIES)]
    requests += [(QUERIES[:3], 2), ([], 4), (QUERIES[::-1], 9)]
    batcher = MicroBatcher(tied, wait_s=0.05, max_queries=256)
    got = _batched(batcher, requests)
    assert batcher.batches == 1  # all of them in one search
    for (qs, k), result in zip(requests, got, strict=True):
        assert _ids(result) == _ids(tied.search(qs, k) if qs else [])
        assert all(len(hits) == k for hits in result)


def test_max_batch_queries_splits_batches_and_keeps_order(tied):
    requests = [([q] * 3, 5) for q in QUERIES]
    batcher = MicroBatcher(tied, wait_s=0.05, max_queries=4)
    got = _batched(batcher, requests)
    assert batcher.batches == len(requests)  # 3 + 3 > 4: one request per batch
    assert [_ids(r) for r in got] == [_ids(tied.search(qs, k)) for qs, k in requests]


class _Flaky(BM25Retriever):
    def search(self, queries, k=3, n_threads=0):
        if "boom" in queries:
            raise RuntimeError("index offline")
        return super().search(queries, k)


def test_one_failing_request_fails_alone(tied):
    flaky = _Flaky(tied.passages)
    requests = [(["river"], 3), (["town", "boom"], 2), (["hall"], 4)]
    got = _batched(MicroBatcher(flaky, wait_s=0.05, max_queries=256), requests)
    assert isinstance(got[1], RuntimeError) and "index offline" in str(got[1])
    assert _ids(got[0]) == _ids(tied.search(["river"], 3))
    assert _ids(got[2]) == _ids(tied.search(["hall"], 4))


def test_the_encoder_writes_what_json_dumps_writes(tied):
    odd = Passage('id "1"\\', 'Tit\u00e9 "x"', "line\nbreak\ttab \U0001f642 \u2028 \x00")
    results = [[Hit(odd, 1.5), Hit(tied.passages[0], 0.1)], [], [Hit(odd, -2e-07)]]
    results += [[Hit(tied.passages[3], math.inf), Hit(tied.passages[4], 3)]]
    results += [[Hit(tied.passages[5], np.float64(0.1) + np.float64(0.2))]]
    encoder = ResultEncoder(cache_size=2)  # emptied and refilled along the way
    for scores in (True, False):
        want = json.dumps({"result": payload(results, scores)}, ensure_ascii=False).encode()
        assert encoder.result(results, scores) == want
    assert len(encoder._docs) <= 2


def _call(app, scope: dict, messages: list[dict]) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # a client that never sends the rest
        return {}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def _http(method: str, path: str, headers=()) -> dict:
    return {"type": "http", "method": method, "path": path, "headers": list(headers)}


def _reply(sent: list[dict]) -> tuple[int, dict]:
    head = dict(sent[0]["headers"])
    body = sent[1]["body"]
    assert int(head[b"content-length"]) == len(body)
    return sent[0]["status"], json.loads(body)


def test_the_app_routes_and_reads_bodies_in_chunks(tied):
    app = RetrieverApp(tied, ServerLimits(batch_wait_ms=0), worker=3)
    body = json.dumps({"queries": ["river"], "topk": 2, "return_scores": True}).encode()
    chunks = [
        {"type": "http.request", "body": body[:5], "more_body": True},
        {"type": "http.request", "body": body[5:], "more_body": False},
    ]
    status, out = _reply(_call(app, _http("POST", "/retrieve"), chunks))
    assert status == 200 and out == {"result": payload(tied.search(["river"], 2), True)}
    status, out = _reply(_call(app, _http("GET", "/health"), []))
    assert status == 200 and out["worker"] == 3 and out["queries"] == 1
    for method, path, code, use in (
        ("POST", "/search", 404, "POST /retrieve"),
        ("GET", "/retrieve", 405, "POST /retrieve"),
        ("DELETE", "/health", 405, "GET /health"),
    ):
        status, out = _reply(_call(app, _http(method, path), []))
        assert status == code and use in out["error"]


def test_the_app_answers_limits_and_leaves_quietly_on_disconnect(tied):
    app = RetrieverApp(tied, ServerLimits(max_body_bytes=64, read_timeout_s=0.2))
    big = [(b"content-length", b"65")]
    assert _reply(_call(app, _http("POST", "/retrieve", big), []))[0] == 413
    over = [{"type": "http.request", "body": b"{" * 65, "more_body": False}]
    assert _reply(_call(app, _http("POST", "/retrieve"), over))[0] == 413
    stalled = [{"type": "http.request", "body": b"{", "more_body": True}]
    status, out = _reply(_call(app, _http("POST", "/retrieve"), stalled))
    assert status == 408 and "0.2 s" in out["error"]
    empty = [{"type": "http.request", "body": b"", "more_body": False}]
    assert _reply(_call(app, _http("POST", "/retrieve"), empty))[0] == 411
    gone = [{"type": "http.disconnect"}]
    assert _call(app, _http("POST", "/retrieve"), gone) == []  # nobody to answer
    life = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    assert [m["type"] for m in _call(app, {"type": "lifespan"}, life)] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]


def test_a_slow_search_is_a_504_and_a_failing_one_a_500(tied):
    class Slow(BM25Retriever):
        def search(self, queries, k=3, n_threads=0):
            if "boom" in queries:
                raise RuntimeError("index offline")
            time.sleep(0.3)
            return super().search(queries, k)

    app = RetrieverApp(Slow(tied.passages), ServerLimits(search_timeout_s=0.1, batch_wait_ms=0))
    for query, status, says in (("river", 504, "over 0.1 s"), ("boom", 500, "index offline")):
        body = json.dumps({"queries": [query]}).encode()
        sent = _call(app, _http("POST", "/retrieve"), [{"type": "http.request", "body": body}])
        code, out = _reply(sent)
        assert code == status and says in out["error"]
