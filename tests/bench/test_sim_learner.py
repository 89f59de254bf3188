"""The simulator learner: its update, exact evaluation, paired arms at equal cost, the protocol check."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trace_gym.bench import learn as lb  # noqa: E402
from trace_gym.bench.learn_stats import auc, cost_to_target, holm, wilcoxon_signed_rank  # noqa: E402
from trace_gym.bench.sim_learner import (  # noqa: E402
    LearnedSimPolicy,
    LearnerEnv,
    MoveFeatures,
    exact_success,
    pg_update,
)

from trace_gym.errors import ConfigError  # noqa: E402
from trace_gym.sim import get_preset  # noqa: E402
from trace_gym.sim.model import make_task  # noqa: E402
from trace_gym.tree import RolloutTree, Turn  # noqa: E402

PROMPT = "Task x. Topic: algebra. Initial assessment: fair (level 3/5). You have 3 turns. Next: you notice a date."


def _hand_tree() -> RolloutTree:
    """Prompt -> 'action 1' (reward 1) and 'action 2' (reward 0), twice each."""
    t = RolloutTree("sim-math-0-0", PROMPT)
    for move, r in ((1, 1.0), (2, 0.0), (1, 1.0), (2, 0.0)):
        n = t.add_child(0, Turn(action=f"Thought: x.\naction {move}", observation="[turn 1/3] ..."))
        t.finish(n.id, reward=r, terminated=True)
    return t


@pytest.mark.parametrize("optimiser", ["grpo", "treerpo", "tree_grpo", "treepo"])
def test_pg_step_moves_probability_toward_rewarded_move(optimiser):
    pol = LearnedSimPolicy("math")
    f = MoveFeatures(topic=0, hint=2, turn=0)  # algebra, "a date", first turn
    before = pol.move_probs(f)
    opt = torch.optim.Adam(pol.parameters(), lr=0.1)
    out = pg_update(pol, opt, [_hand_tree()], optimiser)
    after = pol.move_probs(f)
    assert out["trained_moves"] == 4
    assert after[1] > before[1] + 0.01 and after[2] < before[2] - 0.01
    other = pol.move_probs(
        MoveFeatures(topic=3, hint=0, turn=2)
    )  # never trained: only the shared turn bias moved
    assert abs(other[1] - other[2]) < abs(after[1] - after[2])


def _perturbed(preset: str, seed: int = 0) -> LearnedSimPolicy:
    pol = LearnedSimPolicy(preset)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        pol.theta += 2.0 * torch.randn(pol.theta.shape, generator=g, dtype=torch.float64)
    pol._sync()
    return pol


def test_exact_evaluation_matches_sampled_episodes():
    from trace_gym.policy import Conversation
    from trace_gym.tree import Turn as T

    preset = get_preset("math")
    pol = _perturbed("math")
    tasks = [make_task(preset, 5, i) for i in range(4)]
    env = LearnerEnv(pol, preset="math", num_tasks=4, seed=5)
    wins, n = 0.0, 0
    for ep in range(2400):
        task = tasks[ep % 4]
        prompt, _ = env.reset(seed=ep, options={"task": task.id})
        turns, done = [], False
        while not done:
            conv = Conversation(
                "trace/Sim-v0", task.id, prompt, tuple(turns), seed=ep * 101 + len(turns)
            )
            text = pol.generate([conv])[0].text
            obs, r, term, trunc, _ = env.step(text)
            turns.append(T(action=text, observation=obs))
            done = term or trunc
        wins, n = wins + r, n + 1
    exact = exact_success(pol, tasks)
    se = np.sqrt(exact * (1 - exact) / n)
    assert abs(wins / n - exact) < 4 * se
    assert exact != pytest.approx(
        exact_success(LearnedSimPolicy("math"), tasks), abs=1e-3
    )  # the parameters matter


def _cfg(**kw):
    base = dict(
        steps=3, roots=8, candidates=8, heldout_tasks=16, eval_every=1, seeds=2, progress=False
    )
    return lb.config_from_protocol(lb.load_protocol(lb.DEFAULT_PROTOCOL), **{**base, **kw})


def test_equal_accounted_cost_and_paired_task_streams():
    cfg = _cfg()
    recs = {arm: lb.run_arm(cfg, arm, 0) for arm in ("trace", "treepo", "trace_roots", "grpo")}
    for arm, rs in recs.items():
        assert [r["accounted_cost"] for r in rs[1:]] == [cfg.accounted_budget] * cfg.steps, arm
        assert (
            rs[0]["success"] == recs["trace"][0]["success"]
        )  # the same held-out tasks, same start
    streams = {arm: [r["tasks"] for r in rs[1:]] for arm, rs in recs.items()}
    assert len({tuple(s) for s in streams.values()}) == 1
    assert lb.run_arm(cfg, "grpo", 1)[1]["tasks"] != streams["grpo"][0]  # seeds differ
    ids = [t for step in lb.task_stream(cfg, 0) for t in step]
    assert len(set(ids)) == len(ids) == cfg.steps * cfg.candidates  # fresh: never offered twice
    held = {t.id for t in lb.heldout_tasks(cfg, 0)}
    assert not held & set(ids)


def test_statistics():
    assert wilcoxon_signed_rank([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)
    assert wilcoxon_signed_rank([1, -2, 3, -4, 5, 6]) == pytest.approx(
        2 * 14 / 64
    )  # W+ = 15: 14 of 64 patterns at <= 6
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert auc([0, 1, 2], [0.0, 1.0, 1.0]) == pytest.approx(0.75)
    assert cost_to_target([0, 10, 20], [0.2, 0.4, 0.6], 0.5) == pytest.approx(15.0)
    assert cost_to_target([0, 10], [0.2, 0.3], 0.5) is None


def test_protocol_must_be_committed(tmp_path):
    assert len(lb.check_protocol(lb.DEFAULT_PROTOCOL)) == 64
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    f = tmp_path / "p.toml"
    f.write_text(lb.DEFAULT_PROTOCOL.read_text())
    with pytest.raises(ConfigError, match="not committed"):
        lb.check_protocol(f)
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "add", "p.toml"], cwd=tmp_path, check=True)
    subprocess.run(
        ["git", "commit", "-qm", "p"],
        cwd=tmp_path,
        check=True,
        env={**__import__("os").environ, **env},
    )
    lb.check_protocol(f)
    f.write_text(f.read_text() + "\n# edited\n")
    with pytest.raises(ConfigError, match="uncommitted"):
        lb.check_protocol(f)


def test_bench_learn_smoke(tmp_path, capsys):
    from trace_gym.cli import main

    js = tmp_path / "r.json"
    rc = main(
        [
            "bench",
            "learn",
            "--preset",
            "math",
            "--arms",
            "trace,treepo,trace_roots,grpo",
            "--seeds",
            "2",
            "--steps",
            "2",
            "--heldout",
            "8",
            "--eval-every",
            "1",
            "--roots",
            "8",
            "--candidates",
            "8",
            "--no-progress",
            "--json",
            str(js),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    rep = json.loads(js.read_text())
    assert set(rep["arms"]) == {"trace", "treepo", "trace_roots", "grpo"}
    for a in rep["arms"].values():
        assert {"auc", "auc_ci95", "cost_to_target"} <= set(a)
    for c in ("trace_vs_treepo", "trace_roots_vs_grpo"):
        assert 0.0 <= rep["comparisons"][c]["p_value"] <= 1.0 and "effect" in rep["comparisons"][c]
    assert rep["protocol"]["seeds"] == [0, 1] and len(rep["protocol"]["sha256"]) == 64
    assert rep["protocol"]["deviations"] == {"roots": 8, "candidates": 8}
    assert (tmp_path / "out" / "curve_cost.png").stat().st_size > 0 and (
        tmp_path / "out" / "summary.csv"
    ).exists()
    assert (tmp_path / "out" / "paired_differences.png").exists() and (
        tmp_path / "out" / "index.html"
    ).exists()


def test_bench_learn_refuses_uncommitted_protocol(tmp_path, capsys):
    from trace_gym.cli import main

    f = tmp_path / "p.toml"
    f.write_text(lb.DEFAULT_PROTOCOL.read_text())
    rc = main(["bench", "learn", "--arms", "trace,grpo", "--protocol", str(f), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "not committed" in err


def test_seed_base_defaults_to_zero_and_shifts_the_paired_seeds():
    proto = lb.load_protocol(lb.DEFAULT_PROTOCOL)
    assert "seed_base" not in proto["comparisons"]  # v1 as registered: seeds 0..19
    assert lb.config_from_protocol(proto).seed_list == list(range(20))
    proto["comparisons"]["seed_base"] = 200
    cfg = lb.config_from_protocol(
        proto, steps=1, roots=4, candidates=4, heldout_tasks=4, eval_every=1, seeds=2
    )
    cfg.progress = False
    from trace_gym.bench.learn_cli import compare

    rep = compare(cfg, ["trace", "grpo"], proto, {})
    assert rep["protocol"]["seeds"] == [200, 201]
    assert sorted({r["seed"] for r in rep["records"]}) == [200, 201]
    assert rep["comparisons"]["grpo_vs_trace"]["seeds"] == 2  # paired over both seeds


def test_registered_protocol_files_are_unchanged():
    """v1's sha256 is the one every v1 JSON carries; v2 names clue on seeds never run in v1."""
    import hashlib

    v1 = lb.DEFAULT_PROTOCOL.read_bytes()
    assert (
        hashlib.sha256(v1).hexdigest()
        == "b149ee61313b3d608154c3d5c049caa125113ae64d670c9c24115246670741b8"
    )
    v2 = lb.load_protocol(lb.DEFAULT_PROTOCOL.with_name("v2.toml"))
    cfg = lb.config_from_protocol(v2)
    assert v2["protocol"]["version"] == 2 and cfg.predictor.split(":")[0] == "clue"
    assert not set(cfg.seed_list) & set(range(20))


@pytest.mark.slow  # two spawned processes import torch
def test_parallel_jobs_give_the_same_records(tmp_path):
    from trace_gym.bench.learn_cli import run_all

    cfg = _cfg(steps=1, roots=4, candidates=4, heldout_tasks=4)
    one = run_all(cfg, ["trace", "grpo"], jobs=1)
    sink = tmp_path / "runs.jsonl"
    assert run_all(cfg, ["trace", "grpo"], jobs=2, sink=sink) == one
    lines = [json.loads(x) for x in sink.read_text().splitlines()]  # one per finished run
    assert sorted(r for recs in lines for r in map(json.dumps, recs)) == sorted(
        map(json.dumps, one)
    )
    assert [(r["seed"], r["arm"]) for r in one if r["step"] == -1] == [
        (0, "trace"),
        (0, "grpo"),
        (1, "trace"),
        (1, "grpo"),
    ]
