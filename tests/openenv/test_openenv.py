"""OpenEnv both ways, against the real `openenv` package and local uvicorn servers.

A trace env served by `make_app` is driven by OpenEnv's own clients (reset / step,
checkpoint / restore / release); an OpenEnv env (a trace-gym server, and a plain OpenEnv
`Environment` with no checkpoint calls) becomes a restorable trace env through
``trace/Wrapped-v0`` with ``env="openenv:<url>"``, and a TRACE tree grows on it.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest

import trace_gym
from trace_gym.alloc import make_allocator
from trace_gym.checker import check_checkpoint
from trace_gym.cli import main as cli_main
from trace_gym.core import FreeText, roundtrip
from trace_gym.errors import CheckpointError, CheckpointRefused
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.testing import RandomCountdownPolicy
from trace_gym.wrap import replay_cost

pytest.importorskip(
    "openenv.core", reason="openenv (the `openenv` extra, outside `all`) is not installed"
)

import uvicorn  # noqa: E402
from openenv.core import (  # noqa: E402
    Action,
    Environment,
    GenericEnvClient,
    Observation,
    State,
    create_fastapi_app,
)
from trace_gym.envs.openenv.client import TraceEnvClient, TraceToolEnvironment, checkpoint  # noqa: E402
from trace_gym.envs.openenv.server import TraceAction, make_app  # noqa: E402

pytestmark = pytest.mark.openenv

COUNTDOWN = "trace/OpenEnvCountdown-v0"
PLAIN = "trace/OpenEnvPlainText-v0"


class PlainTextEnv(gym.Env):
    """A gymnasium text env that is not a TraceEnv: it cannot checkpoint."""

    observation_space = action_space = FreeText()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "say anything", {}

    def step(self, action):
        return f"you said {action}", 1.0, True, False, {}


gym.register(COUNTDOWN, entry_point="trace_gym.testing:CountdownEnv")
gym.register(PLAIN, entry_point=f"{__name__}:PlainTextEnv")


# ---------------------------------------------------------------------- a plain OpenEnv env
class CountAction(Action):
    """An OpenEnv-native action: one text command."""

    command: str


class CountObservation(Observation):
    """An OpenEnv-native observation: one text field."""

    message: str = ""


class OpenEnvCountdown(Environment):
    """A countdown written against OpenEnv's API alone (no checkpoint calls)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.target = self.total = self.steps = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.target, self.total, self.steps = 3 + 2 * ((seed or 0) % 4), 0, 0
        text = f"Reach {self.target} with 'add N' actions, then 'answer N'."
        return CountObservation(message=text)

    def step(self, action, timeout_s=None, **kwargs):
        self.steps += 1
        if m := re.fullmatch(r"add (\d+)", action.command.strip()):
            self.total += int(m.group(1))
        elif m := re.fullmatch(r"answer (\d+)", action.command.strip()):
            won = int(m.group(1)) == self.target == self.total
            return CountObservation(message="done", reward=float(won), done=True)
        done = self.steps >= 6
        return CountObservation(message=f"total={self.total}", reward=0.0, done=done)

    @property
    def state(self):
        return State(step_count=self.steps)


# ---------------------------------------------------------------------- servers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(app) -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=_free_port()))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    yield f"http://127.0.0.1:{server.config.port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def trace_url() -> Iterator[str]:
    yield from _serve(make_app(COUNTDOWN, {"num_tasks": 4}))


@pytest.fixture(scope="module")
def plain_url() -> Iterator[str]:
    yield from _serve(make_app(PLAIN))


@pytest.fixture(scope="module")
def native_url() -> Iterator[str]:
    app = create_fastapi_app(
        OpenEnvCountdown, CountAction, CountObservation, max_concurrent_envs=64
    )
    yield from _serve(app)


# ---------------------------------------------------------------------- serving a trace env
def test_openenv_generic_client_drives_a_trace_env_and_branches(trace_url):
    with GenericEnvClient(base_url=trace_url).sync() as env:  # OpenEnv's own client
        first = env.reset(seed=3, task="count-1")
        assert first.observation["text"].startswith("Reach 5") and not first.done
        assert first.observation["task_id"] == "count-1"
        env.step({"message": "add 2"})
        held = env.step({"trace_call": "checkpoint"})
        handle = held.observation["handle"]
        assert handle and held.observation["turn"] == 1  # a call is not a turn
        ahead = [env.step({"message": a}) for a in ("add 1", "add 2", "answer 5")]
        back = env.step({"trace_call": "restore", "handle": handle})
        assert back.observation["text"] == held.observation["text"]
        again = [env.step({"message": a}) for a in ("add 1", "add 2", "answer 5")]
        assert [r.observation for r in again] == [r.observation for r in ahead]
        assert [(r.reward, r.done) for r in again] == [(0.0, False), (0.0, False), (1.0, True)]
        assert env.state()["handles"] == [handle]
        env.step({"trace_call": "release", "handle": handle})
        assert env.state()["handles"] == []
        with pytest.raises(RuntimeError, match="unknown checkpoint handle"):
            env.step({"trace_call": "restore", "handle": handle})


def test_typed_client_checkpoint_handle_restores_and_reset_lets_go(trace_url):
    with TraceEnvClient(base_url=trace_url).sync() as env:
        env.reset(seed=0, task=2)
        env.step("add 3")
        ckpt = checkpoint(env)
        ahead = env.step(TraceAction(message="add 1")).observation.text
        assert "total=3" in ckpt.result.observation.text
        assert ckpt.restore().observation.text == ckpt.result.observation.text
        assert env.step("add 1").observation.text == ahead
        other = checkpoint(env)
        env.reset(seed=1)  # a new episode releases every handle of the session
        for handle in (ckpt, other):
            with pytest.raises(CheckpointError, match="unknown checkpoint handle"):
                handle.restore()


def test_the_trl_environment_shape_plays_a_served_env(trace_url):
    env = TraceToolEnvironment(trace_url)  # what GRPOTrainer's environment_factory returns
    tools = [n for n, _ in inspect.getmembers(type(env), inspect.isfunction) if n[0] != "_"]
    assert sorted(tools) == ["act", "get_reward", "reset"]  # TRL: reset, get_reward, tools
    # a TRL tool: typed arguments, each described under "Args:" (transformers' schema rules)
    assert inspect.get_annotations(TraceToolEnvironment.act) == {"message": "str", "return": "str"}
    assert re.search(r"Args:\n\s+message: \S", TraceToolEnvironment.act.__doc__ or "")
    assert env.reset(seed=0, task="count-0").startswith("Reach 3")
    assert env.act("add 3").startswith("total=3") and env.get_reward() == 0.0
    assert env.act("answer 3") and env.get_reward() == 1.0
    assert "ended" in env.act("add 1")  # a message after the end is answered, not raised
    env.client.close()


def test_an_env_that_cannot_checkpoint_refuses_explicitly(trace_url, plain_url):
    with TraceEnvClient(base_url=trace_url).sync() as env:
        with pytest.raises(CheckpointRefused, match="call env.reset"):
            checkpoint(env)  # nothing to checkpoint before the first reset
    with TraceEnvClient(base_url=plain_url).sync() as env:
        assert env.reset(seed=0).observation.text == "say anything"
        with pytest.raises(CheckpointRefused, match="not a TraceEnv"):
            checkpoint(env)
        assert env.step("hi").observation.text == "you said hi"  # the session goes on


def test_a_served_math_env_restores_its_interpreter_over_the_wire():
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(contextlib.contextmanager(_serve)(make_app("trace/Math-v0")))
        env = stack.enter_context(TraceEnvClient(base_url=url).sync())
        env.reset(seed=0, task=0)
        assert "42" in env.step("<python>x = 21\nprint(x * 2)</python>").observation.text
        ckpt = checkpoint(env)
        ahead = env.step("<python>x += 1\nprint(x)</python>").observation.text
        ckpt.restore()  # the interpreter is back at x = 21
        assert env.step("<python>x += 1\nprint(x)</python>").observation.text == ahead
        assert "22" in ahead


# ---------------------------------------------------------------------- wrapping OpenEnv envs
def _wrapped(url: str):
    return gym.make("trace/Wrapped-v0", env=f"openenv:{url}", num_tasks=4, max_turns=8)


def test_wrap_picks_the_server_checkpoint_calls_where_offered(trace_url, native_url):
    assert _wrapped(trace_url).unwrapped.restore_mode == "handle"
    assert _wrapped(native_url).unwrapped.restore_mode == "replay"


@pytest.mark.parametrize("server", ["trace_url", "native_url"])
def test_wrapped_openenv_env_passes_check_checkpoint(server, request):
    url = request.getfixturevalue(server)
    env = _wrapped(url)
    check_checkpoint(env, make_fresh=lambda: _wrapped(url), seed=0)


def test_remote_handle_restores_without_replay(trace_url):
    env = _wrapped(trace_url)
    env.reset(options={"task": 1})
    env.step("add 1")
    ckpt = trace_gym.checkpoint(env)
    ahead = env.step("add 2")
    trace_gym.restore(env, ckpt)
    assert env.step("add 2") == ahead
    assert replay_cost(env) == 0  # restored by the server's handle
    trace_gym.restore(env, roundtrip(ckpt))  # a pickled one has no handle
    assert env.step("add 2")[0] == ahead[0] and replay_cost(env) == 1


@pytest.mark.parametrize("server", ["trace_url", "native_url"])
def test_a_trace_tree_grows_on_an_openenv_env(server, request):
    url = request.getfixturevalue(server)
    cfg = RunnerConfig(root_budget=8, replays_per_root=1.0, seed=0, update_predictor=False)
    alloc = make_allocator("trace_roots_random_prefixes")
    runner = BranchingRunner(RandomCountdownPolicy(), lambda: _wrapped(url), alloc, None, cfg)
    result = runner.run_step(0, ["0", "1", "2", "3"])
    rep, trees = result.report, result.trees
    assert rep.roots == 8 == sum(len(t.root.children) for t in trees)
    assert rep.replays > 0  # branches grew from restored prefixes
    replays = [n for t in trees for n in t.nodes if n.origin == "replay"]
    assert replays and all(n.turn is not None for n in replays)
    leaves = [n for t in trees for n in t.nodes if not n.children and n.turn is not None]
    assert {n.reward for n in leaves} <= {0.0, 1.0} and any(n.reward == 1.0 for n in leaves)
    again = BranchingRunner(RandomCountdownPolicy(), lambda: _wrapped(url), alloc, None, cfg)
    ref = [t.to_dict() for t in again.run_step(0, ["0", "1", "2", "3"]).trees]
    assert [t.to_dict() for t in trees] == ref  # the same seeds give the same trees


# ---------------------------------------------------------------------- the CLI
def test_cli_errors_are_one_line(capsys):
    assert cli_main(["serve-openenv", "trace/Nope-v0"]) == 2
    assert cli_main(["serve-openenv", COUNTDOWN, "--env-kwargs", "{bad"]) == 2
    assert cli_main(["serve-openenv", COUNTDOWN, "--env-kwargs", '{"nope": 1}']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("trace-gym serve-openenv: error:") for line in err)
    assert "unknown env id" in err[0] and "JSON object" in err[1] and "cannot make" in err[2]


@pytest.mark.slow  # a fresh interpreter importing OpenEnv's stack: about 25 s here
def test_cli_serves_a_trace_env_to_an_openenv_client():
    port = _free_port()
    cmd = [sys.executable, "-m", "trace_gym.cli", "serve-openenv", "trace/Sim-v0"]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert "serving trace/Sim-v0" in (proc.stdout.readline() if proc.stdout else "")
        _wait_for_port(port)
        with TraceEnvClient(base_url=f"http://127.0.0.1:{port}").sync() as env:
            obs = env.reset(seed=4).observation
            assert obs.text.startswith("Task sim-")
            action = gym.make("trace/Sim-v0").unwrapped
            action.reset(seed=4)
            ckpt = checkpoint(env)
            step = env.step(action.example_action(np.random.default_rng(0)))
            assert ckpt.restore().observation.text == obs.text
            assert env.step(action.example_action(np.random.default_rng(0))) == step
    finally:
        proc.terminate()
        proc.wait(20)


def _wait_for_port(port: int, tries: int = 600) -> None:
    """Wait until the server listens (it prints its address before uvicorn binds)."""
    for _ in range(tries):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"serve-openenv never listened on port {port}")
