"""`bench learn --learner tiny-lm`: the tiny LM under the scaled-down protocol; the paired t-test."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from trace_gym.bench import learn as lb
from trace_gym.bench.learn_stats import betainc, paired_t


def test_paired_t_and_incomplete_beta():
    # d = 1, 2, 3: t = 2 / (1 / sqrt 3) = 3.4641 on 2 df; two-sided p = 1 - 3.4641 / sqrt(3.4641^2 + 2)
    assert paired_t([1.0, 2.0, 3.0]) == pytest.approx(
        1.0 - 3.4641016 / math.sqrt(12.0 + 2.0), rel=1e-6
    )
    # 1 df: p = 1 - 2 atan(|t|) / pi (the Cauchy distribution)
    t = 0.5 / (math.sqrt(0.5) / math.sqrt(2.0))
    assert paired_t([0.0, 1.0]) == pytest.approx(1.0 - 2.0 * math.atan(t) / math.pi, rel=1e-9)
    assert paired_t([0.3, -0.3, 0.0]) == pytest.approx(1.0)
    assert (
        paired_t([0.2, 0.2, 0.2]) < 1e-12 and paired_t([0.0, 0.0]) == 1.0 and paired_t([0.5]) == 1.0
    )
    # I_x(1, b) = 1 - (1 - x)^b and symmetry I_x(a, b) = 1 - I_{1-x}(b, a)
    assert betainc(1.0, 3.0, 0.2) == pytest.approx(1.0 - 0.8**3, rel=1e-12)
    assert betainc(2.5, 0.5, 0.9) == pytest.approx(1.0 - betainc(0.5, 2.5, 0.1), rel=1e-12)


def test_tiny_lm_protocol_reads():
    proto = lb.load_protocol(lb.TINY_LM_PROTOCOL)
    cfg = lb.config_from_protocol(proto)
    assert cfg.learner == "tiny-lm" and cfg.eval_samples == 4 and cfg.heldout_tasks == 32
    assert cfg.accounted_budget == cfg.flat_roots == 24 and set(cfg.arms) == {
        "trace",
        "treepo",
        "trace_roots",
        "grpo",
    }
    assert proto["comparisons"]["test"] == "paired_t"
    assert lb.config_from_protocol(lb.load_protocol(lb.DEFAULT_PROTOCOL)).learner == "softmax"


def test_learner_must_match_the_protocol(capsys):
    from trace_gym.cli import main

    rc = main(
        [
            "bench",
            "learn",
            "--learner",
            "tiny-lm",
            "--protocol",
            str(lb.DEFAULT_PROTOCOL),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "not --learner tiny-lm" in err


@pytest.mark.slow
def test_bench_learn_tiny_lm_end_to_end(tmp_path):
    pytest.importorskip("transformers")
    from trace_gym.cli import main

    js = tmp_path / "r.json"
    rc = main(
        [
            "bench",
            "learn",
            "--learner",
            "tiny-lm",
            "--seeds",
            "2",
            "--steps",
            "2",
            "--heldout",
            "4",
            "--eval-samples",
            "2",
            "--eval-every",
            "1",
            "--no-progress",
            "--json",
            str(js),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    rep = json.loads(js.read_text())
    proto = rep["protocol"]
    assert (
        proto["learner"] == "tiny-lm"
        and proto["evaluation"] == "sampled"
        and proto["eval_samples"] == 2
    )
    assert proto["sha256"] == hashlib.sha256(lb.TINY_LM_PROTOCOL.read_bytes()).hexdigest()
    assert set(rep["arms"]) == {"trace", "treepo", "trace_roots", "grpo"}
    for a in rep["arms"].values():
        assert a["eval_episodes"] == 8 and 0.0 <= a["final_success_binomial_se"] <= 0.5
    for c in ("trace_vs_treepo", "trace_roots_vs_grpo"):
        comp = rep["comparisons"][c]
        assert (
            comp["test"] == "paired_t"
            and 0.0 <= comp["p_value"] <= 1.0
            and 0.0 <= comp["p_wilcoxon_raw"] <= 1.0
        )
    steps = [r for r in rep["records"] if r["step"] >= 0]
    assert len(steps) == 4 * 2 * 2 and all(r["success"] is not None for r in rep["records"])
    for seed in (
        0,
        1,
    ):  # every arm of a seed: the same task stream, the same accounted cost per step
        for step in (0, 1):
            rows = [r for r in steps if r["seed"] == seed and r["step"] == step]
            assert len({r["tasks"] for r in rows}) == 1
            assert all(r["accounted_cost"] == pytest.approx(24.0) for r in rows)
            assert all(r["measured_turns"] > 0 and r["generated_tokens"] > 0 for r in rows)
    assert any(
        r.get("trained_tokens", 0) > 0 and r.get("grad_norm", 0) > 0 for r in steps
    )  # the LM was trained
    assert (tmp_path / "out" / "curve_cost.png").exists() and (
        tmp_path / "out" / "runs" / "trace-s0"
    ).is_dir()


def test_cost_goal_needs_a_target_above_the_start():
    from trace_gym.bench.learn_cli import goals

    proto = lb.load_protocol(lb.TINY_LM_PROTOCOL)
    comps = {"trace_vs_treepo": {"effect": 0.01, "p_value": 0.5}}
    flat = {
        "trace": {"cost_to_target_share": 0.0},
        "grpo": {"initial_success": 0.5, "final_success": 0.49},
    }
    g = goals(flat, comps, proto)[0]
    assert not g["met"] and "nothing to reach" in g["note"]
    rose = {
        "trace": {"cost_to_target_share": 0.5},
        "grpo": {"initial_success": 0.5, "final_success": 0.6},
    }
    assert goals(rose, comps, proto)[0]["met"] and "note" not in goals(rose, comps, proto)[0]
