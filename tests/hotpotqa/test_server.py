"""`trace-gym serve-retriever`: Search-R1 /retrieve over loopback, concurrency, 4xx errors."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import gymnasium as gym
import pytest
from trace_gym.envs.hotpotqa.remote import RemoteRetriever, RetrievalServerError
from trace_gym.envs.hotpotqa.retrievers import BM25Retriever
from trace_gym.envs.hotpotqa.server import make_server


@pytest.fixture(scope="module")
def server(bundled):
    srv = make_server(BM25Retriever(bundled[1]))
    srv.start_background()
    yield srv
    srv.shutdown()
    srv.server_close()


def _post(url: str, body: bytes, path: str = "/retrieve") -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_retrieve_has_search_r1_shape(server):
    status, out = _post(server.url, json.dumps({"queries": ["Ostra", "town"], "topk": 2, "return_scores": True}).encode())
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
