"""trace/HotpotQA-v0: protocol, reward, malformed turns, turn limit, checkpoint/restore."""

from __future__ import annotations

import json
import pickle

import gymnasium as gym
import pytest
from trace_gym.envs.hotpotqa import scripted
from trace_gym.envs.hotpotqa.bench import run_policy

import trace_gym
from trace_gym.checker import check_checkpoint
from trace_gym.errors import ConfigError


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = gym.make("trace/HotpotQA-v0", cache_dir=str(tmp_path_factory.mktemp("cache")))
    yield e
    e.close()


def test_default_make_serves_the_bundled_set(env):
    base = env.unwrapped
    obs, info = env.reset(seed=3)
    assert len(base.task_ids) >= 300
    assert "Question:" in obs and info["question"] in obs
    assert "answer" not in info and "gold_answer" not in info  # never leak the answer at reset
    task = base.current_task
    assert task.id == info["task_id"] and task.answer and len(task.supporting_titles) == 2
    json.dumps(info)


def test_scripted_two_hop_policy_reaches_em_09_and_no_search_stays_below_01(env):
    scripted_em = run_policy(env, lambda e, obs: scripted.next_action(e.current_task.question, obs))
    no_search = run_policy(env, lambda e, obs: scripted.no_search_action(e.current_task.question))
    assert scripted_em["em"] >= 0.9 and scripted_em["searches"] >= 2.0
    assert no_search["em"] <= 0.1 and no_search["searches"] == 0


def test_search_then_answer_episode_with_reward_and_trace(env):
    base = env.unwrapped
    env.reset(options={"task": 0})
    task = base.current_task
    obs, r, term, trunc, info = env.step(f"<search>{task.supporting_titles[0]}</search>")
    assert obs.startswith("<information>Doc 1(Title: ") and not term and r == 0.0
    assert info["action"] == "search" and len(info["retrieved"]) == 3
    obs, r, term, trunc, info = env.step(f"<answer>{task.answer.upper()}.</answer>")
    assert term and not trunc and r == 1.0 and info["em"] == 1.0 and info["f1"] == 1.0
    assert info["retrieval_trace"][0]["query"] == task.supporting_titles[0]
    assert info["supporting_recall"] >= 0.5
    json.dumps(info)
    env.reset(options={"task": 0})
    _, r, term, _, info = env.step("<answer>definitely wrong</answer>")
    assert term and r == 0.0 and info["em"] == 0.0


def test_observations_have_no_surrounding_blank_lines(env):
    obs, _ = env.reset(options={"task": 0})
    seen = [obs]
    for action in ("<search>town</search>", "no tags at all", "<search></search>"):
        obs, *_ = env.step(action)
        seen.append(obs)
    assert seen[0] == seen[0].lstrip()  # the prompt (Search-R1's template ends in a newline)
    assert all(o and o == o.strip() for o in seen[1:]), [o[:40] for o in seen]


@pytest.mark.parametrize(
    ("action", "error"),
    [
        ("<search>who directed", "unclosed_tag"),
        ("<search></search>", "empty_query"),
        ("<search>" + "x" * 5000 + "</search>", "query_too_long"),
        ("<search>a</search> <answer>b</answer>", "both_tags"),
        ("no tags at all", "no_action"),
    ],
)
def test_malformed_turns_give_a_hint_and_the_env_stays_usable(env, action, error):
    env.reset(options={"task": 1})
    obs, r, term, trunc, info = env.step(action)
    assert not term and r == 0.0 and info["error"] == error
    assert "My previous action is invalid" in obs
    obs, *_ = env.step("<search>anything</search>")
    assert "<information>" in obs


def test_overlong_turns_are_refused_by_the_core_cap_alone(tmp_path):
    from trace_gym.core import TraceEnv

    assert gym.make("trace/HotpotQA-v0", cache_dir=str(tmp_path)).unwrapped.max_action_chars == (
        TraceEnv.max_action_chars
    )
    e = gym.make("trace/HotpotQA-v0", max_action_chars=50, max_turns=3, cache_dir=str(tmp_path))
    base = e.unwrapped
    assert base.max_action_chars == 50
    e.reset(options={"task": 1})
    obs, r, term, trunc, info = e.step(
        "<answer>" + "x" * 60 + "</answer>"
    )  # a valid answer, too long
    assert (
        not term and r == 0.0 and (info["error"], info["action_chars"]) == ("action_too_long", 77)
    )
    # one text: the core's line, then the env's hint for a turn it cannot act on
    assert obs.startswith("Error: your message is 77 characters long; the limit is 50.")
    assert "My previous action is invalid" in obs and info["action"] == "invalid"
    base.max_action_chars = 100  # the same setting, changed on the instance
    _, r, term, _, info = e.step("<answer>" + "x" * 60 + "</answer>")
    assert term and "error" not in info
    with pytest.raises(ConfigError, match="max_action_chars"):
        gym.make("trace/HotpotQA-v0", max_action_chars=0)


def test_turn_limit_truncates_and_reports_the_trace(tmp_path):
    e = gym.make("trace/HotpotQA-v0", max_turns=2, cache_dir=str(tmp_path))
    e.reset(options={"task": 2})
    _, _, term, trunc, _ = e.step("<search>one</search>")
    assert not (term or trunc)
    _, r, term, trunc, info = e.step("<search>two</search>")
    assert trunc and not term and r == 0.0 and info["truncation"] == "turn_limit"
    assert [h["query"] for h in info["retrieval_trace"]] == ["one", "two"]


def test_checkpoint_restores_task_turn_history_and_rng(env):
    report = check_checkpoint(env, seed=5, max_steps=6)
    assert report["turns"] >= 2
    base = env.unwrapped
    env.reset(options={"task": 4})
    env.step("<search>first</search>")
    ck = trace_gym.checkpoint(env)
    env.step("<search>second</search>")
    fresh = gym.make("trace/HotpotQA-v0", cache_dir=base.config.cache_dir)
    trace_gym.restore(fresh, pickle.loads(pickle.dumps(ck)))
    assert fresh.unwrapped.turn == 1 and [h["query"] for h in fresh.unwrapped.history] == ["first"]
    assert fresh.unwrapped.current_task == base.tasks[4]


def test_splits_limit_and_bad_config(tmp_path):
    dev = gym.make("trace/HotpotQA-v0", split="dev", cache_dir=str(tmp_path)).unwrapped
    train = gym.make(
        "trace/HotpotQA-v0", split="train", limit=10, cache_dir=str(tmp_path)
    ).unwrapped
    assert not set(dev.task_ids) & set(train.task_ids) and len(train.task_ids) == 10
    assert dev.task_set != train.task_set
    with pytest.raises(ConfigError):
        gym.make("trace/HotpotQA-v0", split="test")
    with pytest.raises(ConfigError):
        gym.make("trace/HotpotQA-v0", topk=0)


def test_real_hotpotqa_env_with_its_context_corpus(real_sample, tmp_path):
    e = gym.make("trace/HotpotQA-v0", dataset=str(real_sample), limit=40, cache_dir=str(tmp_path))
    res = run_policy(e, lambda b, obs: scripted.oracle_next_action(b.current_task, obs))
    # an oracle-guided searcher finds the evidence for most real questions with BM25
    assert res["em"] >= 0.5 and res["searches"] >= 1
    check_checkpoint(e, seed=1, max_steps=4, run_gym_check_env=False)


def test_env_accepts_a_retriever_instance_and_an_index_directory(bundled, tmp_path):
    from trace_gym.envs.hotpotqa.retrievers import BM25Retriever

    tasks, passages = bundled
    gold = {t for task in tasks[:3] for t in task.supporting_titles}
    r = BM25Retriever([p for p in passages if p.title in gold] + passages[:50])
    e = gym.make("trace/HotpotQA-v0", retriever=r, limit=3)
    e.reset(options={"task": 0})
    title = e.unwrapped.current_task.supporting_titles[0]
    obs, *_ = e.step(f"<search>{title}</search>")
    assert f"Doc 1(Title: {title})" in obs
    r.save(tmp_path / "idx")
    e2 = gym.make("trace/HotpotQA-v0", retriever=str(tmp_path / "idx"), limit=3)
    e2.reset(options={"task": 0})
    assert e2.step(f"<search>{title}</search>")[0] == obs
