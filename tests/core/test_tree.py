"""Rollout trees: targets, anchors, segments, metrics on hand-built trees; JSON io."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trace_gym.errors import TreeError, TreeFormatError
from trace_gym.tree import (
    FORMAT_VERSION,
    Failure,
    RolloutTree,
    Turn,
    batch_metrics,
    effective_ratio,
    load_trees,
    save_trees,
)


def _turn(i: int) -> Turn:
    return Turn(
        action=f"a{i}",
        observation=f"o{i}",
        token_ids=[i, i + 1],
        logprobs=[-0.5, -0.25],
        obs_token_ids=[9],
    )


def build_tree() -> RolloutTree:
    """root -> 1 -> 2 -> 3 (leaf, r=1)
                      2 -> 4 (replay leaf, r=0)
       root -> 5 -> 6 (leaf, r=0)
       root -> 7 (leaf, r=1)

    Node 1 has one child (2); node 2 has two children (3, 4): an anchor.
    """
    t = RolloutTree("p0", "prompt", env_id="trace/Test-v0", step=2)
    n1 = t.add_child(0, _turn(1))
    n2 = t.add_child(n1.id, _turn(2))
    n3 = t.add_child(n2.id, _turn(3))
    t.finish(n3.id, reward=1.0, terminated=True)
    n4 = t.add_child(n2.id, _turn(4), origin="replay", seed=42)
    t.finish(n4.id, reward=0.0, truncated=True)
    n5 = t.add_child(0, _turn(5))
    n6 = t.add_child(n5.id, _turn(6))
    t.finish(n6.id, reward=0.0, terminated=True)
    n7 = t.add_child(0, _turn(7))
    t.finish(n7.id, reward=1.0, terminated=True)
    assert [n.id for n in (n1, n2, n3, n4, n5, n6, n7)] == list(range(1, 8))
    return t


def test_targets_are_bottom_up_success_rates():
    t = build_tree()
    t.compute_targets()
    assert t.root.target == pytest.approx(2 / 4)
    assert t[1].target == t[2].target == pytest.approx(1 / 2)
    assert t[5].target == 0.0 and t[7].target == 1.0
    assert [t[i].num_leaves for i in (0, 1, 2, 5)] == [4, 2, 2, 1]


def test_anchors_segments_and_chain_compression():
    t = build_tree()
    assert [a.id for a in t.anchors()] == [0, 2]
    segs = {(s.anchor, s.nodes): s.value for s in t.segments()}
    assert segs == {
        (0, (1, 2)): 0.5,  # chain 1 -> 2 compressed, ends at the anchor 2
        (0, (5, 6)): 0.0,
        (0, (7,)): 1.0,
        (2, (3,)): 1.0,
        (2, (4,)): 0.0,
    }


def test_metrics_known_answers():
    t = build_tree()
    m = t.metrics()
    assert (m.leaves, m.successes, m.failures) == (4, 2, 2)
    assert m.mixed and m.mixed_anchors == 2 and m.anchors == 2
    # pairs at node 2: (3, 4) = 1; at root: successes {3,7} x failures {4,6} minus the
    # pair inside child 1 -> 2*2 - 1 = 3; total S*F = 4
    assert t.contrastive_pairs_by_anchor() == {0: 3, 2: 1}
    assert m.contrastive_pairs == 4
    assert m.turns == 7 and m.tokens == 14


def test_failed_branches_have_no_reward_and_do_not_count():
    t = RolloutTree("p1", "prompt")
    a = t.add_child(0, _turn(1))
    t.finish(a.id, reward=1.0, terminated=True)
    b = t.add_child(0, _turn(2))
    t.finish(b.id, error="PolicyError: boom")
    m = t.metrics()
    assert b.failed and b.reward is None
    assert (m.leaves, m.failed_branches, m.mixed) == (1, 1, False)
    assert t.root.target == 1.0


def test_batch_metrics_and_effective_ratio():
    mixed = build_tree()
    pure = RolloutTree("p2", "prompt")
    for i in range(3):
        n = pure.add_child(0, _turn(i))
        pure.finish(n.id, reward=0.0, terminated=True)
    assert effective_ratio([mixed, pure]) == 0.5
    assert math.isnan(effective_ratio([]))
    bm = batch_metrics([mixed, pure])
    assert bm["mixed_groups"] == 1 and bm["contrastive_pairs"] == 4 and bm["leaves"] == 7


def test_terminal_nodes_cannot_grow():
    t = build_tree()
    with pytest.raises(ValueError, match="terminal"):
        t.add_child(3, _turn(9))


def test_json_round_trip_is_exact(tmp_path):
    trees = [build_tree(), RolloutTree("p9", "héllo ✓", prompt_token_ids=[1, 2, 3])]
    trees[0].compute_targets()
    trees[0][3].true_value = 0.123456789012345
    trees[0][2].value = 1 / 3
    for suffix in ("trees.jsonl", "trees.jsonl.gz"):
        path = save_trees(trees, tmp_path / suffix)
        back = load_trees(path)
        assert back == trees
        assert [b.to_dict() for b in back] == [t.to_dict() for t in trees]


def test_wrong_version_and_corruption_give_clear_errors(tmp_path):
    d = build_tree().to_dict()
    bad = tmp_path / "v99.jsonl"
    bad.write_text(json.dumps({**d, "version": 99}) + "\n")
    with pytest.raises(TreeFormatError, match="version 99 is not supported"):
        load_trees(bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(d)[:-20] + "\n")
    with pytest.raises(TreeFormatError, match="broken.jsonl:1: not valid JSON"):
        load_trees(broken)
    wrong_parent = dict(d, nodes=[dict(n) for n in d["nodes"]])
    wrong_parent["nodes"][3]["parent"] = 7
    p = tmp_path / "parent.jsonl"
    p.write_text(json.dumps(wrong_parent) + "\n")
    with pytest.raises(TreeFormatError, match="bad parent"):
        load_trees(p)
    alien = tmp_path / "alien.jsonl"
    alien.write_text(json.dumps({"hello": 1}) + "\n")
    with pytest.raises(TreeFormatError, match="not a trace-gym rollout tree"):
        load_trees(alien)
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({k: v for k, v in d.items() if k != "prompt"}) + "\n")
    with pytest.raises(TreeFormatError, match="corrupted"):
        load_trees(missing)


# ---------------------------------------------------------------------- format 2
FIXTURE_V1 = Path(__file__).parent.parent / "fixtures" / "trees_v1"


def test_failure_record_and_policy_version_round_trip(tmp_path):
    t = RolloutTree("p3", "prompt")
    a = t.add_child(0, _turn(1), policy_version=7)
    t.finish(a.id, error=Failure("env.step", "env", "OSError: backend crashed"))
    b = t.add_child(0, _turn(2), policy_version=7)
    t.finish(b.id, error="policy: backend refused")  # text is parsed into a record
    assert a.error == "env.step: OSError: backend crashed"
    assert b.failure == Failure("policy", "policy", "backend refused")
    d = json.loads(json.dumps(t.to_dict()))
    assert d["version"] == FORMAT_VERSION == 2
    assert d["nodes"][1]["failure"] == {
        "where": "env.step",
        "kind": "env",
        "message": "OSError: backend crashed",
    }
    assert d["nodes"][2]["policy_version"] == 7
    back = load_trees(save_trees([t], tmp_path / "v2.jsonl"))[0]
    assert back == t and back[1].failure == a.failure and back[2].policy_version == 7
    with pytest.raises(TreeError, match="kind"):
        Failure("env.step", "cosmic-ray", "?")


def test_version_1_files_are_read_and_upgraded(tmp_path):
    old = load_trees(sorted(FIXTURE_V1.glob("math-trace.jsonl.gz"))[0])  # written by format-1 code
    assert old and all(n.failure is None and n.policy_version is None for t in old for n in t.nodes)
    assert all(t.to_dict()["version"] == 2 for t in old)  # upgraded in memory, written as 2
    d = build_tree().to_dict()
    d["version"] = 1
    for n in d["nodes"]:  # a format-1 node has neither field
        del n["failure"], n["policy_version"]
    d["nodes"][7].update(error="env.step: OSError: gone", reward=None)
    path = tmp_path / "v1.jsonl"
    path.write_text(json.dumps(d) + "\n")
    (tree,) = load_trees(path)
    assert tree[7].failure == Failure("env.step", "env", "OSError: gone")
    assert tree[7].error == "env.step: OSError: gone" and tree[1].failure is None
    assert tree.metrics().failed_branches == 1


def test_targets_are_computed_once_and_marked_stale_by_edits(monkeypatch):
    t = build_tree()
    calls = []
    real = RolloutTree.compute_targets

    def counting(self, **kw):
        calls.append(self._targets_stale)
        return real(self, **kw)

    monkeypatch.setattr(RolloutTree, "compute_targets", counting)
    t.metrics()
    t.segments()
    t.metrics()
    assert calls[0] is True and not any(calls[1:])  # the first reader computed, others read
    assert t.root.target == 0.5
    n = t.add_child(0, _turn(8))
    assert calls[-1] is False and t._targets_stale  # add_child marked them stale
    t.finish(n.id, reward=1.0, terminated=True)
    assert t.metrics().successes == 3 and t.root.target == pytest.approx(3 / 5)
    assert calls[-2:] == [True, False]  # recomputed once, then read


# ---------------------------------------------------------------------- validation on load
def _write_tree(path: Path, d) -> Path:
    path.write_text(json.dumps(d) + "\n")
    return path


def _edited(**node_changes) -> dict:
    """build_tree()'s dict with node 3's fields changed (node index: `at`)."""
    d = build_tree().to_dict()
    at = node_changes.pop("at", 3)
    d["nodes"] = [dict(n) for n in d["nodes"]]
    d["nodes"][at].update(node_changes)
    return d


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({**build_tree().to_dict(), "nodes": []}, "'nodes' is empty"),
        (_edited(at=2, children=[3, 999]), "node 2 lists child 999"),
        (_edited(reward="1"), "node 3: 'reward' must be a finite number or null, got '1'"),
        (_edited(reward=float("nan")), "node 3: 'reward' must be a finite number or null, got nan"),
        (_edited(reward=float("inf")), "node 3: 'reward' must be a finite number or null, got inf"),
        (_edited(at=2, children=[3, 4, 3]), "node 2 lists child 3 more than once"),
        (_edited(depth="0"), "node 3: 'depth' must be an integer"),
        (_edited(id=True), "node 3: 'id' must be an integer"),
        (
            _edited(turn={**build_tree().to_dict()["nodes"][3]["turn"], "token_ids": ["a"]}),
            "turn: 'token_ids'",
        ),
        (_edited(turn="text"), "corrupted rollout tree"),
        ({**build_tree().to_dict(), "step": 2.5}, "'step' must be an integer"),
        ({**build_tree().to_dict(), "nodes": 7}, "corrupted rollout tree"),
    ],
    ids=[
        "no-nodes",
        "child-999",
        "reward-str",
        "reward-nan",
        "reward-inf",
        "child-twice",
        "depth-str",
        "id-bool",
        "token-str",
        "turn-str",
        "step-float",
        "nodes-int",
    ],
)
def test_bad_fields_are_refused_on_load_with_file_and_line(tmp_path, d, match):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(build_tree().to_dict()) + "\n" + json.dumps(d) + "\n")
    with pytest.raises(TreeFormatError, match=match) as e:
        load_trees(path)
    assert str(e.value).startswith(f"{path}:2: ")
    assert isinstance(e.value, TreeError)  # a bad tree, whether built or loaded


def test_deep_json_is_a_format_error(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(TreeFormatError, match=r"deep.jsonl:1: JSON nested too deeply"):
        load_trees(path)
    deep_info = {**build_tree().to_dict(), "info": json.loads("[" * 500 + "]" * 500)}
    with pytest.raises(TreeFormatError, match="'info' must be an object"):
        load_trees(_write_tree(tmp_path / "info.jsonl", deep_info))


def test_non_utf8_and_broken_gzip_are_format_errors(tmp_path):
    good = json.dumps(build_tree().to_dict()) + "\n"
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(good.encode() + b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(TreeFormatError, match=r"latin.jsonl:\d+: not UTF-8"):
        load_trees(latin)
    plain = tmp_path / "plain.jsonl.gz"  # a .gz name on a file that is not gzip
    plain.write_text(good)
    with pytest.raises(TreeFormatError, match=r"plain.jsonl.gz:1: unreadable"):
        load_trees(plain)
    whole = save_trees([build_tree()] * 3, tmp_path / "whole.jsonl.gz").read_bytes()
    cut = tmp_path / "cut.jsonl.gz"  # a download or a write that stopped half-way
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TreeFormatError, match=r"cut.jsonl.gz:\d+: unreadable"):
        load_trees(cut)
    assert len(load_trees(tmp_path / "whole.jsonl.gz")) == 3


def test_version_1_tree_with_a_bad_error_field_is_a_format_error(tmp_path):
    d = _edited(error=5)
    d["version"] = 1
    for n in d["nodes"]:
        n.pop("failure", None)
    with pytest.raises(TreeFormatError, match="t.jsonl:1: corrupted rollout tree"):
        load_trees(_write_tree(tmp_path / "t.jsonl", d))
