"""BFCL's multi-turn rules: ground truth scores 1, perturbations score 0 where BFCL says so,
and per-turn verdicts agree entry by entry with bfcl-eval's own checker."""

from __future__ import annotations

import numpy as np
import pytest
from trace_gym.envs.bfcl.scoring import (
    EMPTY_TURN,
    IRRELEVANCE,
    RESPONSE_MISMATCH,
    STATE_MISMATCH,
    TurnVerdict,
    entry_result,
    unordered_missing,
)
from trace_gym.envs.bfcl.scripted import PERTURBATIONS, ScriptedBFCL, ground_truth_actions


def _play(env, index, actions):
    env.reset(options={"task": index})
    for a in actions:
        _, reward, term, trunc, info = env.step(a)
        if term or trunc:
            return reward, info
    raise AssertionError("episode did not end after the ground-truth actions")


def _sample(n_total, k):
    return sorted({int(i) for i in np.linspace(0, n_total - 1, k)})


def test_unordered_subsequence_counts_duplicates():
    assert unordered_missing(["a", "b", "a"], ["b", "a", "c", "a"]) == []
    assert unordered_missing(["a", "a"], ["a"]) == ["a"]


def test_entry_result_reports_accuracy_errors_before_irrelevance():
    verdicts = [
        TurnVerdict(0, False, IRRELEVANCE, False, 1),
        TurnVerdict(1, False, RESPONSE_MISMATCH, True, 1),
        TurnVerdict(2, False, STATE_MISMATCH, True, 1),
    ]
    assert entry_result(verdicts, 3) == {"valid": False, "error_type": RESPONSE_MISMATCH, "turn": 1}
    assert entry_result(verdicts[:1], 3)["error_type"] == "multi_turn:force_terminated"
    assert entry_result([TurnVerdict(0, True, None, True, 1)], 1)["valid"]


def test_ground_truth_replay_scores_one_on_all_800_entries(bfcl_env):
    failures = []
    for i, entry in enumerate(bfcl_env.entries):
        reward, info = _play(bfcl_env, i, ground_truth_actions(entry))
        if reward != 1.0:
            failures.append((entry.id, info["bfcl_result"]))
    assert len(bfcl_env.entries) == 800 and not failures


@pytest.mark.parametrize("syntax", ["hermes", "json"])
def test_ground_truth_one_call_per_step_in_other_syntaxes(bfcl_env, syntax):
    player = ScriptedBFCL(error_rate=0.0, syntax=syntax)
    rng = np.random.default_rng(0)
    for i in _sample(len(bfcl_env.entries), 40):
        entry, actions = bfcl_env.entries[i], []
        bfcl_env.reset(options={"task": i})
        while True:
            actions.append(player.act(entry, actions, rng))
            _, reward, term, trunc, info = bfcl_env.step(actions[-1])
            if term or trunc:
                break
        assert reward == 1.0, (entry.id, info["bfcl_result"])
        assert all(v["valid"] for v in info["turn_verdicts"])


def _perturbation_run(env, bfcl_verdict, kind, indices):
    scored, zeros, disagreements = 0, 0, []
    for i in indices:
        entry = env.entries[i]
        actions = ground_truth_actions(entry, kind, np.random.default_rng(i), syntax="hermes")
        if actions is None:
            continue
        reward, info = _play(env, i, actions)
        ours = info["bfcl_result"]["error_type"]
        theirs = bfcl_verdict(entry, info["decoded_calls"])
        scored += 1
        zeros += reward == 0.0
        assert reward == float(ours is None)
        if ours != theirs:
            disagreements.append((entry.id, ours, theirs))
    return scored, zeros, disagreements


#: share of perturbed entries that must score 0 (where BFCL's rules give 0; the rest
#: are perturbations BFCL accepts, e.g. a wrong argument the backend ignores)
MIN_ZERO_SHARE = {
    "drop_call": 0.95,
    "wrong_argument": 0.85,
    "extra_call": 1.0,
    "irrelevant_call": 1.0,
}


@pytest.mark.parametrize("kind", PERTURBATIONS)
def test_perturbations_score_zero_and_agree_with_bfcl_checker_sample(bfcl_env, bfcl_verdict, kind):
    scored, zeros, disagreements = _perturbation_run(
        bfcl_env, bfcl_verdict, kind, _sample(800, 100)
    )
    assert scored >= 40
    assert not disagreements
    assert zeros / scored >= MIN_ZERO_SHARE[kind]


@pytest.mark.slow
@pytest.mark.parametrize("kind", PERTURBATIONS)
def test_perturbations_agree_with_bfcl_checker_all_entries(bfcl_env, bfcl_verdict, kind):
    scored, zeros, disagreements = _perturbation_run(bfcl_env, bfcl_verdict, kind, range(800))
    assert not disagreements
    assert zeros / scored >= MIN_ZERO_SHARE[kind]


def test_per_turn_verdicts_use_bfcl_categories(bfcl_env):
    entry_index = next(i for i, e in enumerate(bfcl_env.entries) if e.category == "miss_param")
    entry = bfcl_env.entries[entry_index]
    empty_turn = next(t for t, calls in enumerate(entry.ground_truth) if not calls)
    actions = ground_truth_actions(entry)
    # skip every call of the first turn with calls: that turn has no model response
    first = next(t for t, calls in enumerate(entry.ground_truth) if calls)
    assert first == 0
    reward, info = _play(bfcl_env, entry_index, actions[1:])
    assert reward == 0.0 and info["turn_verdicts"][0]["error_type"] == EMPTY_TURN
    assert info["turn_verdicts"][empty_turn]["expects_calls"] is False


def _success_rate(env, error_rate, indices, seed=0):
    player = ScriptedBFCL(error_rate=error_rate)
    wins = 0
    for i in indices:
        entry, actions = env.entries[i], []
        rng = np.random.default_rng(seed + i)
        env.reset(options={"task": i})
        while True:
            actions.append(player.act(entry, actions, rng))
            _, reward, term, trunc, _ = env.step(actions[-1])
            if term or trunc:
                break
        wins += reward
    return wins / len(indices)


def test_scripted_error_rate_gives_intermediate_success(bfcl_env):
    indices = _sample(800, 80)
    rates = [_success_rate(bfcl_env, e, indices) for e in (0.0, 0.1, 0.3)]
    assert rates[0] == 1.0
    assert 0.2 < rates[2] < rates[1] < 1.0


def test_ground_truth_snapshots_are_bytes_and_each_read_is_a_fresh_copy():
    # bytes: nothing in the 800-entry cache for the garbage collector to walk
    from trace_gym.envs.bfcl.backends import public_attributes
    from trace_gym.envs.bfcl.scoring import ground_truth_trace

    trace = ground_truth_trace("multi_turn_base_0")
    assert trace.snapshots and all(type(s) is bytes for s in trace.snapshots)
    first, again = trace.backends_after(0), trace.backends_after(0)
    assert (
        first.keys() == again.keys()
        and first["GorillaFileSystem"] is not again["GorillaFileSystem"]
    )
    first["GorillaFileSystem"].long_context = "changed"  # a caller's change stays its own
    fresh = trace.backends_after(0)["GorillaFileSystem"]
    assert public_attributes(fresh) == public_attributes(again["GorillaFileSystem"])
