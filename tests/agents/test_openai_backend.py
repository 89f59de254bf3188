"""OpenAIPolicy against a local stub server on loopback, with deterministic fault injection.

Faults are keyed by the task prompt, not by arrival order, so concurrency cannot change
which request fails: ``FAULT 500x2`` answers HTTP 500 to the first two attempts of that
conversation, ``FAULT hangx1`` holds the first attempt until the client times out,
``FAULT 400`` always answers 400 (not retried). The stub holds every request until
``cap`` are in flight (or all have arrived), so a test observes the concurrency cap
reached and never exceeded without timing assumptions.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from trace_gym.agents.openai_backend import OpenAIConfig, OpenAIPolicy

from trace_gym.errors import ConfigError
from trace_gym.policy import Conversation


class Stub:
    def __init__(self, hold_until: int = 0, total: int = 0):
        self.lock = threading.Condition()
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrived = 0
        self.attempts: dict[str, int] = {}
        self.bodies: list[dict] = []
        self.hold_until, self.total = hold_until, total
        self.release = threading.Event()  # frees hung requests at teardown
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.handle(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def handle(self, h, body):
        prompt = body["messages"][1]["content"]
        with self.lock:
            self.bodies.append(body)
            self.arrived += 1
            n = self.attempts[prompt] = self.attempts.get(prompt, 0) + 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.lock.notify_all()
            # hold until the cap is reached or everything has arrived (bounded wait)
            self.lock.wait_for(
                lambda: self.in_flight >= self.hold_until or self.arrived >= self.total, timeout=10
            )
        try:
            m = re.search(r"FAULT (\w+?)(?:x(\d+))?$", prompt)
            fault, times = (m.group(1), int(m.group(2) or 10**6)) if m else (None, 0)
            if fault == "hang" and n <= times:
                self.release.wait(10)
                return
            if fault and fault.isdigit() and n <= times:
                self._send(h, int(fault), {"error": {"message": f"injected {fault}"}})
                return
            text = f"seed {body['seed']} says <answer>{prompt.split()[0]}"
            self._send(
                h,
                200,
                {
                    "choices": [
                        {
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                            "stop_reason": "</answer>",
                            "logprobs": {"content": [{"token": "a", "logprob": -0.5}]},
                        }
                    ],
                    "usage": {"completion_tokens": 7},
                },
            )
        finally:
            with self.lock:
                self.in_flight -= 1

    @staticmethod
    def _send(h, code, obj):
        data = json.dumps(obj).encode()
        try:
            h.send_response(code)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        except OSError:
            pass


def _convs(prompts):
    return [
        Conversation("trace/HotpotQA-v0", f"t{i}", p, (), seed=100 + i)
        for i, p in enumerate(prompts)
    ]


@pytest.fixture
def stub_factory():
    made = []

    def make(**kw):
        made.append(Stub(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_config_validates():
    with pytest.raises(ConfigError):
        OpenAIConfig(base_url="localhost:8000")
    with pytest.raises(ConfigError):
        OpenAIConfig(base_url="http://x/v1", concurrency=0)


def test_completions_keep_order_seed_and_stop_string(stub_factory):
    stub = stub_factory()
    pol = OpenAIPolicy(OpenAIConfig(base_url=stub.url, backoff_s=0, logprobs=True))
    outs = pol.generate(_convs(["alpha q", "beta q", "gamma q"]))
    assert [o.text for o in outs] == [
        f"seed {100 + i} says <answer>{w}</answer>"
        for i, w in enumerate(["alpha", "beta", "gamma"])
    ]
    assert all(o.error is None and o.info["logprobs"] == [-0.5] for o in outs)
    body = stub.bodies[0]
    assert body["stop"] == ["</search>", "</answer>"] and body["include_stop_str_in_output"] is True
    assert body["messages"][0]["role"] == "system"


def test_concurrency_cap_is_reached_and_never_exceeded(stub_factory):
    stub = stub_factory(hold_until=3, total=10)
    pol = OpenAIPolicy(OpenAIConfig(base_url=stub.url, concurrency=3, backoff_s=0))
    outs = pol.generate(_convs([f"q{i} x" for i in range(10)]))
    assert all(o.error is None for o in outs)
    assert stub.max_in_flight == 3


def test_server_errors_are_retried_then_succeed(stub_factory):
    stub = stub_factory()
    pol = OpenAIPolicy(OpenAIConfig(base_url=stub.url, max_retries=3, backoff_s=0.001))
    out = pol.generate(_convs(["fine FAULT 500x2"]))[0]
    assert out.error is None and out.info["attempts"] == 3
    assert stub.attempts["fine FAULT 500x2"] == 3


def test_retries_give_up_with_an_error_output(stub_factory):
    stub = stub_factory()
    pol = OpenAIPolicy(OpenAIConfig(base_url=stub.url, max_retries=2, backoff_s=0.001))
    outs = pol.generate(_convs(["bad FAULT 503", "good q"]))
    assert outs[0].error and "gave up after 3 attempts" in outs[0].error and "503" in outs[0].error
    assert outs[1].error is None  # the sibling goes on
    assert stub.attempts["bad FAULT 503"] == 3


def test_client_errors_are_not_retried(stub_factory):
    stub = stub_factory()
    pol = OpenAIPolicy(OpenAIConfig(base_url=stub.url, max_retries=3, backoff_s=0.001))
    out = pol.generate(_convs(["q FAULT 400"]))[0]
    assert out.error and "400" in out.error
    assert stub.attempts["q FAULT 400"] == 1


def test_a_timed_out_attempt_is_retried(stub_factory):
    stub = stub_factory()
    pol = OpenAIPolicy(
        OpenAIConfig(base_url=stub.url, timeout_s=0.3, max_retries=1, backoff_s=0.001)
    )
    out = pol.generate(_convs(["slow FAULT hangx1"]))[0]
    assert out.error is None and out.info["attempts"] == 2


def test_unreachable_server_is_an_error_not_a_crash():
    pol = OpenAIPolicy(
        OpenAIConfig(base_url="http://127.0.0.1:9/v1", max_retries=1, backoff_s=0.001, timeout_s=1)
    )
    out = pol.generate(_convs(["q"]))[0]
    assert out.error and "connection" in out.error
