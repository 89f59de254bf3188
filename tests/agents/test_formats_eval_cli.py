"""Formats, the evaluator, and the eval / rollout CLIs (smoke-run as subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from trace_gym.agents.evaluate import evaluate
from trace_gym.agents.formats import (
    FORMATS,
    ReActFormat,
    chat_messages,
    find_stop,
    format_for,
    restore_stop,
    system_prompt,
)
from trace_gym.agents.scripted import make_env, make_scripted

from trace_gym.errors import ConfigError
from trace_gym.policy import Conversation
from trace_gym.tree import Turn, load_trees


def test_every_env_has_a_format_with_its_action_stops():
    assert (
        "</search>" in FORMATS["trace/HotpotQA-v0"].stop
        and "</answer>" in FORMATS["trace/HotpotQA-v0"].stop
    )
    assert "</python>" in FORMATS["trace/Math-v0"].stop
    assert FORMATS["trace/BFCL-v0"].stop == ("</tool_call>",) and FORMATS["trace/BFCL-v0"].tools
    assert format_for("trace/Unknown-v0").stop == ()
    with pytest.raises(ConfigError):
        ReActFormat("x", "s", obs_role="system")
    with pytest.raises(ConfigError):
        ReActFormat("x", "s", stop=("",))


def test_find_and_restore_stop():
    assert find_stop("a <search>q</search> tail", ("</search>", "</answer>")) == len(
        "a <search>q</search>"
    )
    assert find_stop("nothing", ("</search>",)) is None
    assert find_stop("x</answer>y</search>", ("</search>", "</answer>")) == len("x</answer>")
    assert restore_stop("<search>q", "</search>") == "<search>q</search>"
    assert restore_stop("<search>q</search>", "</search>") == "<search>q</search>"


def test_tools_go_native_or_into_the_system_prompt():
    tool = {"type": "function", "function": {"name": "ls", "description": "list", "parameters": {}}}
    conv = Conversation(
        "trace/BFCL-v0",
        "t",
        "list files",
        (Turn("<tool_call>x</tool_call>", "out", info={"obs_role": "tool"}),),
        seed=0,
        reset_info={"tools": [tool]},
    )
    fmt = FORMATS["trace/BFCL-v0"]
    assert system_prompt(conv, fmt, native_tools=True) == fmt.system
    assert '"name": "ls"' in system_prompt(conv, fmt, native_tools=False)
    msgs = chat_messages(conv, fmt, native_tools=False)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[-1]["content"] == "<tool_response>\nout\n</tool_response>"
    assert chat_messages(conv, fmt, native_tools=True)[-1]["role"] == "tool"


def test_evaluate_reports_mean_and_pass_at_k():
    env_id = "trace/HotpotQA-v0"
    env = make_env(env_id)
    ids = list(env.unwrapped.task_ids)[:6]
    res = evaluate(
        make_scripted(env_id, skill=0.6, env=env), lambda: make_env(env_id), ids, k=3, max_batch=4
    )
    s = res.summary
    assert s["tasks"] == 6 and len(res.tasks) == 6 and all(t["k"] == 3 for t in res.tasks)
    assert s["mean@3"] == pytest.approx(sum(t["successes"] for t in res.tasks) / 18)
    assert s["pass@3"] == pytest.approx(sum(t["successes"] > 0 for t in res.tasks) / 6)
    assert s["pass@3"] >= s["mean@3"] and s["avg_turns"] >= 2
    # batching does not change results (seeds are per episode)
    again = evaluate(
        make_scripted(env_id, skill=0.6, env=env), lambda: make_env(env_id), ids, k=3, max_batch=1
    )
    assert again.tasks == res.tasks


def test_evaluate_with_the_tiny_model_records_tokens(countdown_policy_factory):
    pol = countdown_policy_factory(max_new_tokens=8)
    res = evaluate(pol, lambda: make_env("trace/Countdown-v0"), ["count-0", "count-1"], k=2)
    assert res.summary["avg_tokens"] > 0 and res.summary["errors"] == 0


def _cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_eval_cli_writes_per_task_jsonl(tmp_path):
    out = tmp_path / "eval.jsonl"
    r = _cli(
        "eval",
        "--env",
        "trace/HotpotQA-v0",
        "--policy",
        "scripted:0.9",
        "--limit",
        "4",
        "--n",
        "2",
        "--json",
        str(out),
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    assert "mean@2" in r.stdout and "pass@2" in r.stdout
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 5 and "summary" in lines[-1] and lines[0]["k"] == 2


def test_rollout_cli_writes_trees(tmp_path):
    out = tmp_path / "trees.jsonl"
    r = _cli(
        "rollout",
        "--env",
        "trace/Sim-v0",
        "--policy",
        "sim",
        "--allocator",
        "trace",
        "--steps",
        "2",
        "--tasks",
        "6",
        "--roots",
        "8",
        "--out",
        str(out),
        "--no-progress",
        "--env-kwargs",
        '{"num_tasks": 32}',
    )
    assert r.returncode == 0, r.stderr
    trees = load_trees(out)
    assert trees and {t.step for t in trees} == {0, 1}
    assert sum(json.loads(x)["roots"] for x in r.stdout.splitlines() if x.startswith("{")) == 16


def test_policy_specs():
    from trace_gym.agents.openai_backend import OpenAIPolicy
    from trace_gym.agents.policies import make_policy

    env = make_env("trace/HotpotQA-v0")
    assert make_policy("scripted:0.3", "trace/HotpotQA-v0", env).skill == 0.3
    pol = make_policy("openai:http://127.0.0.1:1/v1#my-model", "trace/HotpotQA-v0", temperature=0.5)
    assert (
        isinstance(pol, OpenAIPolicy)
        and pol.config.model == "my-model"
        and pol.config.temperature == 0.5
    )
    with pytest.raises(ConfigError):
        make_policy("magic", "trace/HotpotQA-v0")
    with pytest.raises(ConfigError):
        make_policy("hf", "trace/HotpotQA-v0")
