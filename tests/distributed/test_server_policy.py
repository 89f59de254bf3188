"""A policy built on each Ray worker: an OpenAI-compatible client talking to a loopback server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from trace_gym.agents import openai_backend

from trace_gym.alloc import make_allocator
from trace_gym.distributed import RayConfig, RayRunner, WorkerPolicy
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.testing import CountdownEnv

pytestmark = pytest.mark.usefixtures("ray_local")


class _Handler(BaseHTTPRequestHandler):
    """Chat completions whose text is a function of the request's seed only."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        seed = int(body["seed"])
        text = f"add {1 + seed % 3}" if seed % 4 else f"answer {seed % 7}"
        reply = {
            "choices": [
                {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ]
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def env():
    return CountdownEnv(num_tasks=8, max_turns=5)


def test_worker_built_openai_client_gives_the_local_trees(server):
    cfg = openai_backend.OpenAIConfig(base_url=server, max_retries=0)
    tasks = [f"count-{i}" for i in range(8)]
    rc = RunnerConfig(root_budget=12, replays_per_root=1.0, m_max=8, seed=2)
    local = BranchingRunner(
        openai_backend.OpenAIPolicy(cfg), env, make_allocator("trace", m_max=8), None, rc
    )
    remote = RayRunner(
        WorkerPolicy(openai_backend.OpenAIPolicy, cfg),
        env,
        make_allocator("trace", m_max=8),
        None,
        rc,
        RayConfig(num_workers=2, worker_cpus=0.5),
    )
    try:
        a, b = local.run_step(0, tasks), remote.run_step(0, tasks)
    finally:
        local.close()
        remote.close()
    assert b.report.failed_branches == a.report.failed_branches == 0
    assert [t.to_dict() for t in b.trees] == [t.to_dict() for t in a.trees]
    assert len(set(b.report.placement.values())) == 2
