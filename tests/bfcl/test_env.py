"""trace/BFCL-v0: the episode loop, tools, miss_func reveals, limits, bad input, restore."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

import trace_gym
from trace_gym.checker import check_checkpoint
from trace_gym.errors import ConfigError


def test_task_set_has_the_four_categories_of_200(bfcl_env):
    ids = bfcl_env.task_ids
    assert len(ids) == 800
    for cat in ("base", "miss_func", "miss_param", "long_context"):
        assert sum(i.startswith(f"multi_turn_{cat}_") for i in ids) == 200
    with pytest.raises(ConfigError):
        trace_gym.envs.bfcl.BFCLEnv(categories=("composite",))


def test_reset_gives_first_user_message_and_openai_tools(bfcl_env):
    obs, info = bfcl_env.reset(options={"task": "multi_turn_base_0"})
    entry = bfcl_env.current_entry
    assert obs == entry.questions[0][0]["content"]
    assert info["num_user_turns"] == entry.num_turns and info["category"] == "base"
    tools = info["tools"]
    names = {t["function"]["name"] for t in tools}
    assert {"cd", "mv", "post_tweet"} <= names
    cd = next(t for t in tools if t["function"]["name"] == "cd")
    assert cd["type"] == "function" and cd["function"]["parameters"]["type"] == "object"
    assert cd["function"]["parameters"]["required"] == ["folder"]
    assert "answer" not in info and "ground_truth" not in info


def test_miss_func_functions_appear_at_the_turn_bfcl_specifies(bfcl_env):
    obs, info = bfcl_env.reset(options={"task": "multi_turn_miss_func_0"})
    entry = bfcl_env.current_entry
    ((turn, names),) = entry.missed_function.items()
    assert not set(names) & {t["function"]["name"] for t in info["tools"]}
    for t in range(turn):
        for text in entry.ground_truth[t]:
            bfcl_env.step(f"[{text}]")
        obs, _, _, _, info = bfcl_env.step("ok")
    assert info["user_turn"] == turn and info["obs_role"] == "user"
    assert {t["function"]["name"] for t in info["new_tools"]} == set(names)
    assert set(names) <= {t["function"]["name"] for t in info["tools"]}
    assert obs.endswith("I have updated some more functions you can choose from. What about now?")
    assert names[0] in obs


def test_bad_calls_are_observations_and_the_turn_goes_on(bfcl_env):
    bfcl_env.reset(options={"task": "multi_turn_base_0"})
    obs, r, term, trunc, info = bfcl_env.step(
        "[teleport(to='mars'), cd(bogus=1), cd(folder='document')]"
    )
    assert not (term or trunc) and info["user_turn"] == 0 and info["obs_role"] == "tool"
    assert [c["status"] for c in info["calls"]] == ["unknown_function", "bad_arguments", "ok"]
    assert obs.splitlines()[0] == "Error during execution: name 'teleport' is not defined"
    obs, r, term, trunc, info = bfcl_env.step(
        '<tool_call>{"name": "cd", "arguments": {</tool_call>'
    )
    assert (
        obs.startswith("Error during execution: ") and info["malformed"] and info["user_turn"] == 0
    )
    obs, r, term, trunc, info = bfcl_env.step("All done.")
    assert (
        info["event"] == "end_of_turn"
        and info["user_turn"] == 1
        and not info["turn_verdict"]["valid"]
    )


def test_on_malformed_end_turn_follows_bfcl_inference_loop():
    from trace_gym.envs.bfcl.env import BFCLEnv

    env = BFCLEnv(categories=("base",), on_malformed="end_turn")
    env.reset(options={"task": 0})
    _, _, _, _, info = env.step("[cd(folder=")
    assert info["event"] == "end_of_turn" and info["user_turn"] == 1


def test_twenty_one_call_steps_force_quit_the_entry():
    from trace_gym.envs.bfcl.env import BFCLEnv

    env = BFCLEnv(categories=("base",))
    env.reset(options={"task": 0})
    for _ in range(20):
        _, _, term, _, _ = env.step("[pwd()]")
        assert not term
    obs, r, term, trunc, info = env.step("[pwd()]")
    assert term and r == 0.0 and info["bfcl_result"]["error_type"] == "multi_turn:force_terminated"


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [("plain", "A\nB"), ("hermes", "<tool_response>\nA\n</tool_response>"), ("json", '["A", "B"]')],
)
def test_obs_formats(fmt, expected):
    from trace_gym.envs.bfcl.env import OBS_FORMATS

    assert OBS_FORMATS[fmt](["A", "B"]).startswith(expected)


@pytest.mark.parametrize(
    "task",
    [
        "multi_turn_base_3",
        "multi_turn_miss_func_17",
        "multi_turn_miss_param_40",
        "multi_turn_long_context_120",
    ],
)
def test_checkpoint_contract_on_several_entries(task):
    env = gym.make("trace/BFCL-v0")
    report = check_checkpoint(
        env, task=task, max_steps=24, num_checkpoints=4, run_gym_check_env=False
    )
    assert report["turns"] >= 4


def test_restore_mid_episode_into_fresh_env_replays_identically(bfcl_env):
    from trace_gym.envs.bfcl.scripted import ScriptedBFCL

    player = ScriptedBFCL(error_rate=0.3)
    bfcl_env.reset(seed=3, options={"task": "multi_turn_base_60"})
    entry, actions = bfcl_env.current_entry, []
    rng = np.random.default_rng(5)
    for _ in range(6):
        actions.append(player.act(entry, actions, rng))
        bfcl_env.step(actions[-1])
    ck = bfcl_env.checkpoint()
    assert pickle.loads(pickle.dumps(ck)) == ck.without_local()
    rest = []
    while True:
        rest.append(player.act(entry, actions + rest, rng))
        out = bfcl_env.step(rest[-1])
        if out[2] or out[3]:
            break
    # replay the tail from the checkpoint, in a fresh env, and compare step by step
    fresh = gym.make("trace/BFCL-v0").unwrapped
    fresh.restore(pickle.loads(pickle.dumps(ck)))
    bfcl_env.restore(ck)
    for a in rest:
        assert fresh.step(a) == bfcl_env.step(a)
    assert fresh.done and bfcl_env.done
