"""Predictors: registry, Spearman, training batches, quality by depth, and that they learn."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_gym.errors import ConfigError, UnknownNameError
from trace_gym.predict import (
    PREDICTORS,
    EmpiricalPredictor,
    FeaturePredictor,
    Predictor,
    State,
    make_predictor,
    predictor_class,
    predictor_entry_point,
    quality_by_depth,
    register_predictor,
    spearman,
    training_batch,
)
from trace_gym.sim.sampling import sample_trees
from trace_gym.tree import RolloutTree, Turn


def test_registry_and_protocol():
    assert {"empirical", "features", "constant"} <= set(PREDICTORS)
    for name in ("empirical", "features", "constant"):
        p = make_predictor(name)
        assert isinstance(p, Predictor) and p.name == name
        out = p.predict([State("a", "x"), State("a", "x", (("act", "obs"),))])
        assert out.shape == (2,) and np.all((out >= 0) & (out <= 1))
    with pytest.raises(UnknownNameError, match="features"):
        make_predictor("no-such-predictor")
    with pytest.raises(ConfigError):
        make_predictor("constant", value=2.0)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties take average ranks: ranks a = [0, 1.5, 1.5, 3], b = [0, 1, 2, 3]
    ra, rb = np.array([0, 1.5, 1.5, 3]), np.arange(4.0)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(
        ra @ rb / np.sqrt((ra @ ra) * (rb @ rb))
    )
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1], [1]))


def _chain_tree(pid: str, rewards: list[float], depth: int = 3) -> RolloutTree:
    """A prompt with one rollout per reward, all of `depth` turns (one branch point: root)."""
    tree = RolloutTree(pid, f"prompt {pid}")
    for r in rewards:
        node = 0
        for d in range(depth):
            node = tree.add_child(node, Turn(f"a{d}", f"o{d} {'good' if r else 'bad'}")).id
        tree.finish(node, reward=r, terminated=True)
    tree.compute_targets()
    return tree


def test_training_batch_prefix_share_targets_and_weights():
    trees = [_chain_tree(f"p{i}", [1.0, 0.0, 1.0, 1.0]) for i in range(200)]
    states, targets, weights = training_batch(
        trees, prefix_share=0.06, rng=np.random.default_rng(0)
    )
    roots = [s for s in states if s.depth == 0]
    prefixes = [s for s in states if s.depth > 0]
    assert len(roots) == 200 and roots[0].prompt == "prompt p0"
    assert len(prefixes) / len(states) == pytest.approx(0.06, abs=0.01)
    assert np.all(targets[: len(roots)] == 0.75) and np.all(weights[: len(roots)] == 4)
    assert set(targets[len(roots) :]) <= {0.0, 1.0} and np.all(weights[len(roots) :] == 1)
    only_roots = training_batch(trees, prefix_share=0.0)
    assert all(s.depth == 0 for s in only_roots.states)
    only_prefixes = training_batch(trees, prefix_share=1.0)
    assert len(only_prefixes.states) == 200 * 4 * 2  # inner nodes: depths 1 and 2
    with pytest.raises(ConfigError):
        training_batch(trees, prefix_share=1.5)


def test_quality_by_depth_reports_every_depth():
    trees = [_chain_tree(f"p{i}", [1.0, 0.0] if i % 2 else [1.0, 1.0]) for i in range(20)]
    q = quality_by_depth(make_predictor("constant"), trees)
    assert sorted(q) == [0, 1, 2]
    assert q[0]["n"] == 20 and math.isnan(q[0]["spearman"])
    # targets: 0.5 for the mixed half (error 0), 1.0 for the rest (error 0.25)
    assert q[0]["mse"] == pytest.approx(0.125)
    assert quality_by_depth(make_predictor("constant"), trees, use_true_values=True) == {}


def test_empirical_converges_to_each_prompts_success_rate():
    rng = np.random.default_rng(0)
    p = make_predictor("empirical")
    rates = {"easy": 0.9, "mid": 0.5, "hard": 0.05}
    for _ in range(60):
        states = [State(pid, pid) for pid in rates]
        targets = np.array([rng.binomial(8, r) / 8 for r in rates.values()])
        p.update(states, targets, np.full(3, 8.0))
    got = p.predict([State(pid, pid) for pid in rates])
    assert np.allclose(got, list(rates.values()), atol=0.05)
    # prefixes start from their prompt's value
    assert p.predict([State("easy", "easy", (("a", "b"),))])[0] == pytest.approx(got[0])
    assert p.predict([State("new", "new")])[0] == 0.5


@pytest.fixture(scope="module")
def sim_trees():
    train = sample_trees(
        "hotpotqa", range(0, 160), num_tasks=240, roots=6, replays_per_root=2, seed=1
    )
    held_out = sample_trees(
        "hotpotqa", range(160, 240), num_tasks=240, roots=6, replays_per_root=2, seed=2
    )
    return train, held_out


def test_features_beats_constant_on_held_out_sim_trees(sim_trees):
    """Held-out *tasks*: only the text clues (difficulty words, progress readings) can help."""
    train, held_out = sim_trees
    feats = make_predictor("features")
    rng = np.random.default_rng(0)
    for _ in range(3):
        feats.update(*training_batch(train, prefix_share=0.3, rng=rng))
    const = make_predictor("constant")
    qf = quality_by_depth(feats, held_out, use_true_values=True)
    qc = quality_by_depth(const, held_out, use_true_values=True)
    for depth in (0, 1, 2):
        assert qf[depth]["mse"] < 0.8 * qc[depth]["mse"], (depth, qf[depth], qc[depth])
        assert qf[depth]["spearman"] > 0.5, (depth, qf[depth])
    # against noisy bottom-up targets too
    qt = quality_by_depth(feats, held_out)
    assert qt[1]["mse"] < quality_by_depth(const, held_out)[1]["mse"]


def test_features_reads_prefix_clues_beyond_the_prompt(sim_trees):
    """At depth >= 1 the prefix-aware prediction tracks Z_t better than the prompt's own."""
    train, held_out = sim_trees
    feats = make_predictor("features")
    rng = np.random.default_rng(0)
    for _ in range(3):
        feats.update(*training_batch(train, prefix_share=0.3, rng=rng))
    deep, prompt_only, truth = [], [], []
    for tree in held_out:
        for node in tree.nodes[1:]:
            if not node.terminal and node.depth >= 2:
                s = tree.prompt_id
                deep.append(
                    State(
                        s,
                        tree.prompt,
                        tuple((t.action, t.observation) for t in tree.turns(node.id)),
                    )
                )
                prompt_only.append(State(s, tree.prompt))
                truth.append(node.true_value)
    truth = np.asarray(truth)
    err_deep = np.mean((feats.predict(deep) - truth) ** 2)
    err_prompt = np.mean((feats.predict(prompt_only) - truth) ** 2)
    assert err_deep < err_prompt


def test_featurize_drops_nonces_and_reads_fractions():
    from trace_gym.predict.features import featurize

    a = State("p", "prompt", (("Thought: draft 3fa9c2e1\naction 1", "Progress (gauge 6/9)."),))
    b = State("p", "prompt", (("Thought: draft 77aa0b12\naction 1", "Progress (gauge 6/9)."),))
    ia, va = featurize(a)
    ib, vb = featurize(b)
    assert np.array_equal(ia, ib) and np.allclose(va, vb)  # only the nonce differed
    c = State("p", "prompt", (("Thought: draft 3fa9c2e1\naction 1", "Progress (gauge 2/9)."),))
    ic, vc = featurize(c)
    assert not np.allclose(np.sort(va), np.sort(vc))  # the fraction's value moved
    with pytest.raises(ConfigError):
        make_predictor("features", weighting="cubic")


def test_empirical_prefix_revisits_and_decay():
    p = make_predictor("empirical", decay=0.5)
    root = State("a", "a")
    prefix = State("a", "a", (("act", "obs"),))
    p.update([root], np.array([1.0]), np.array([4.0]))
    assert p.predict([root])[0] == pytest.approx(5 / 6)
    p.update([prefix], np.array([0.0]), np.array([6.0]))
    # the prefix's own leaves pull it down from the prompt mean (prior strength 2)
    assert p.predict([prefix])[0] == pytest.approx(2 * (5 / 6) / (2 + 6))
    assert p.predict([root])[0] == pytest.approx(5 / 6)
    p.update([root], np.array([0.0]), np.array([4.0]))  # old counts halve: 2 succ, 4 fail
    assert p.predict([root])[0] == pytest.approx(3 / 8)


def test_training_batch_is_reproducible_and_quality_reports_within_prompt():
    trees = sample_trees("math", 12, roots=4, replays_per_root=2, seed=5)
    a = training_batch(trees, 0.3, np.random.default_rng(1))
    b = training_batch(trees, 0.3, np.random.default_rng(1))
    assert [s.serialize() for s in a.states] == [s.serialize() for s in b.states]
    q = quality_by_depth(make_predictor("features"), trees, use_true_values=True)
    assert 0 in q and 1 in q and set(q[1]) == {"spearman", "mse", "n", "spearman_within"}


def test_registry_holds_entry_point_strings_and_accepts_them():
    assert all(v.count(":") == 1 for v in PREDICTORS.values())
    assert predictor_class("features") is FeaturePredictor
    p = make_predictor("trace_gym.predict.empirical:EmpiricalPredictor", prior_a=2.0)
    assert isinstance(p, EmpiricalPredictor) and p.prior_a == 2.0
    with pytest.raises(ConfigError, match="NoSuchClass"):
        make_predictor("trace_gym.predict.empirical:NoSuchClass")
    with pytest.raises(UnknownNameError):
        predictor_entry_point("not-an-entry-point")
    register_predictor("always-on", "trace_gym.predict.constant:ConstantPredictor")
    try:
        assert make_predictor("always-on", value=1.0).predict([State("a", "x")])[0] == 1.0
    finally:
        del PREDICTORS["always-on"]
    with pytest.raises(ConfigError):
        register_predictor("bad", "no_colon_here")


@pytest.mark.parametrize("name", ["empirical", "features", "bayes", "constant"])
def test_state_dict_round_trip(name, sim_trees):
    """A fresh predictor loaded with a trained one's (pickled) state predicts exactly like it,
    and the next update (shuffling generator included) stays in step."""
    import pickle

    train, held_out = sim_trees
    rng = np.random.default_rng(0)
    first, second = (training_batch(train[i::2], prefix_share=0.3, rng=rng) for i in (0, 1))
    states = (
        first.states + second.states + training_batch(held_out, prefix_share=0.3, rng=rng).states
    )
    a = make_predictor(name)
    a.update(*first)
    state = a.state_dict()
    snapshot = a.predict(states)
    a.update(*second)  # the state is a copy: later updates do not reach it
    if name != "constant":
        assert not np.allclose(a.predict(states), snapshot)
    state = pickle.loads(pickle.dumps(state))  # what a training checkpoint stores
    b = make_predictor(name)
    b.load_state_dict(state)
    np.testing.assert_array_equal(b.predict(states), snapshot)
    a.load_state_dict(state)
    a.update(*second)
    b.update(*second)
    np.testing.assert_array_equal(b.predict(states), a.predict(states))


def test_load_state_dict_refuses_a_state_of_other_options():
    a = make_predictor("features", dim=1 << 10)
    with pytest.raises(ConfigError, match="dim=1024"):
        a.load_state_dict(make_predictor("features", dim=1 << 12).state_dict())
    with pytest.raises(ConfigError):
        make_predictor("constant").load_state_dict({"w": np.zeros(3)})
