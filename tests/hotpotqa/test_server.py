"""`trace-gym serve-retriever`: Search-R1 /retrieve over loopback, concurrency, limits, 4xx errors."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import gymnasium as gym
import pytest
from trace_gym.envs.hotpotqa.remote import RemoteRetriever, RetrievalServerError
from trace_gym.envs.hotpotqa.retrievers import BM25Retriever
from trace_gym.envs.hotpotqa.server import ServerLimits, make_server

from trace_gym.errors import ConfigError


@pytest.fixture(scope="module")
def server(bundled):
    srv = make_server(BM25Retriever(bundled[1]))
    srv.start_background()
    yield srv
    srv.shutdown()
    srv.server_close()


def _post(url: str, body: bytes, path: str = "/retrieve") -> tuple[int, dict]:
    req = urllib.request.Request(
        url + path, data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_retrieve_has_search_r1_shape(server):
    status, out = _post(
        server.url,
        json.dumps({"queries": ["Ostra", "town"], "topk": 2, "return_scores": True}).encode(),
    )
    assert status == 200 and len(out["result"]) == 2 and len(out["result"][0]) == 2
    item = out["result"][0][0]
    assert set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"}
    assert item["document"]["contents"].startswith('"')
    status, out = _post(server.url, json.dumps({"queries": ["town"], "topk": 1}).encode())
    assert status == 200 and set(out["result"][0][0]) == {"id", "contents"}


def test_concurrent_clients_get_the_same_answers_as_a_local_search(server, bundled):
    tasks = bundled[0][:24]
    local = server.retriever.search([t.question for t in tasks], 3)
    want = [[h.passage.id for h in hits] for hits in local]
    got: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            remote = RemoteRetriever(server.url)
            for j in range(i, len(tasks), 8):
                got[j] = [h.passage.id for h in remote.search([tasks[j].question], 3)[0]]
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and [got[j] for j in range(len(tasks))] == want


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"not json", 400),
        (b"[1, 2]", 400),
        (json.dumps({"topk": 3}).encode(), 422),
        (json.dumps({"queries": "one string"}).encode(), 422),
        (json.dumps({"queries": ["a", 3]}).encode(), 422),
        (json.dumps({"queries": ["a"], "topk": 0}).encode(), 422),
        (json.dumps({"queries": ["a"], "topk": "3"}).encode(), 422),
        (json.dumps({"queries": ["a"], "return_scores": "yes"}).encode(), 422),
    ],
)
def test_malformed_requests_get_4xx_and_the_server_keeps_serving(server, body, status):
    code, out = _post(server.url, body)
    assert code == status and "error" in out
    assert _post(server.url, json.dumps({"queries": ["town"]}).encode())[0] == 200


def test_unknown_path_and_empty_body(server):
    assert _post(server.url, b"{}", path="/search")[0] == 404
    req = urllib.request.Request(server.url + "/retrieve", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 411
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        assert json.loads(r.read())["passages"] == len(server.retriever.passages)


def test_env_over_the_server_matches_the_local_env(server, tmp_path):
    local = gym.make("trace/HotpotQA-v0", cache_dir=str(tmp_path))
    remote = gym.make("trace/HotpotQA-v0", retriever=server.url)
    for e in (local, remote):
        e.reset(options={"task": 7})
    q = "<search>" + local.unwrapped.current_task.supporting_titles[0] + "</search>"
    assert local.step(q)[0] == remote.step(q)[0]


def test_unreachable_server_is_an_observation_not_a_crash():
    r = RemoteRetriever("http://127.0.0.1:9", timeout=2)
    with pytest.raises(RetrievalServerError, match="serve-retriever"):
        r.search(["x"], 3)
    env = gym.make("trace/HotpotQA-v0", retriever="http://127.0.0.1:9")
    env.unwrapped.retriever.timeout = 2
    env.reset(options={"task": 0})
    obs, r_, term, trunc, info = env.step("<search>x</search>")
    assert "Search failed" in obs and info["error"] == "retrieval_failed" and not term


@pytest.fixture(scope="module")
def tight(bundled):
    """A server with small limits and a long batching window, to exercise every refusal."""
    limits = ServerLimits(
        max_body_bytes=4096,
        max_queries=8,
        max_topk=20,
        max_query_chars=200,
        read_timeout_s=0.5,
        batch_wait_ms=100,
    )
    srv = make_server(BM25Retriever(bundled[1]), limits=limits)
    srv.start_background()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (json.dumps({"queries": ["town " * 2000]}).encode(), 413, "4096"),
        (json.dumps({"queries": ["a"] * 9}).encode(), 413, "at most 8"),
        (json.dumps({"queries": ["a"], "topk": 21}).encode(), 422, "[1, 20]"),
        (json.dumps({"queries": ["a" * 201]}).encode(), 422, "at most 200"),
        (b"[" * 1500 + b"]" * 1500, 400, "nested deeper"),
        (b'{"queries": [[[[[[[[[["a"]]]]]]]]]]}', 400, "nested deeper"),
    ],
)
def test_limits_answer_with_a_message(tight, body, status, says):
    code, out = _post(tight.url, body)
    assert code == status and says in out["error"]
    assert _post(tight.url, json.dumps({"queries": ["town"], "topk": 20}).encode())[0] == 200


def test_brackets_inside_query_strings_are_not_nesting(tight):
    code, out = _post(tight.url, json.dumps({"queries": ["[[[[[[[[[[{{{{{{ town"]}).encode())
    assert code == 200 and len(out["result"]) == 1


def test_stalled_clients_time_out_and_do_not_block_others(tight):
    host, port = tight.url.removeprefix("http://").split(":")
    stalled = []
    for _ in range(20):  # each promises 1,000 bytes and sends 10
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"{" * 10)
        stalled.append(s)
    assert _post(tight.url, json.dumps({"queries": ["town"]}).encode())[0] == 200
    for s in stalled:
        assert s.recv(4096).split(b" ")[1] == b"408"
        s.close()


def test_concurrent_requests_are_micro_batched(tight, bundled):
    before = _health(tight)
    barrier = threading.Barrier(8)
    codes: list[int] = []

    def one(i: int) -> None:
        barrier.wait()
        codes.append(
            _post(
                tight.url, json.dumps({"queries": [bundled[0][i].question], "topk": 1 + i}).encode()
            )[0]
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    after = _health(tight)
    assert codes == [200] * 8 and after["queries"] - before["queries"] == 8
    assert after["batches"] - before["batches"] < 8  # several requests shared one search


def test_a_failing_retriever_is_a_500_and_the_server_survives(bundled):
    class Flaky(BM25Retriever):
        def search(self, queries, k=3, n_threads=0):
            if "boom" in queries:
                raise RuntimeError("index offline")
            return super().search(queries, k)

    srv = make_server(Flaky(bundled[1][:50]))
    srv.start_background()
    try:
        code, out = _post(srv.url, json.dumps({"queries": ["boom"]}).encode())
        assert code == 500 and "index offline" in out["error"]
        assert _post(srv.url, json.dumps({"queries": ["town"]}).encode())[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()


def test_bad_limits_and_cli_flags_are_one_line_errors():
    with pytest.raises(ConfigError, match="max_topk"):
        ServerLimits(max_topk=0)
    out = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "serve-retriever", "--max-topk", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "max_topk" in out.stderr


def _health(srv) -> dict:
    with urllib.request.urlopen(srv.url + "/health", timeout=10) as r:
        return json.loads(r.read())
