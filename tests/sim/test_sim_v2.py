"""Simulator v2: luck presets reproduce v1, the fitted families hit their targets, exact stats."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import trace_gym.sim as sim_pkg
from trace_gym.sim import PRESETS, SimEnv, SimPolicy, make_task, true_value
from trace_gym.sim.exact import preset_stats, residual_table, state_distribution, task_stats
from trace_gym.sim.fit import SHARES, TARGETS, template
from trace_gym.sim.fitted import FITTED
from trace_gym.sim.model import value_table
from trace_gym.sim.presets import LUCK_PRESETS

FITTED_NAMES = sorted(d["name"] for d in FITTED)


def test_luck_presets_keep_the_v1_task_ids_and_draws():
    for name, p in LUCK_PRESETS.items():
        assert not p.is_v2 and p.id_stem == name.removesuffix("-luck")
        t = make_task(p, 0, 5)
        assert t.id == f"sim-{p.id_stem}-0-5" and t.hints == () and t.knife == ()
    env = SimEnv("math-luck", num_tasks=4)
    prompt, _ = env.reset(seed=0, options={"task": 1})
    assert "Next:" not in prompt  # v1 text, unchanged


def test_defaults_are_the_fitted_r06_presets_and_every_family_is_complete():
    for domain in TARGETS:
        assert PRESETS[domain] is PRESETS[f"{domain}-r06"]
        assert PRESETS[domain].resolved_share == 0.6
        for share in SHARES:
            assert PRESETS[f"{domain}-r{round(share * 10):02d}"].resolved_share == share


@pytest.mark.parametrize("name", FITTED_NAMES)
def test_fitted_preset_hits_its_resolved_share(name):
    p = PRESETS[name]
    assert preset_stats(p, 400).resolved_share == pytest.approx(p.resolved_share, abs=0.05)


#: fits that could not reach their baseline target (docs/sim.md says why)
UNREACHED = {"bfcl-r02"}


@pytest.mark.parametrize(
    "name",
    [n for n in FITTED_NAMES if TARGETS[PRESETS[n].domain][0] == "grpo8" and n not in UNREACHED],
)
def test_fitted_preset_hits_its_grpo8_target(name):
    from trace_gym.sim.calibrate import grpo_effective_ratio

    target = TARGETS[PRESETS[name].domain][1]
    assert grpo_effective_ratio(name, 1000) == pytest.approx(target, abs=0.03)


def test_unreached_fits_are_really_unreached():
    from trace_gym.sim.calibrate import grpo_effective_ratio

    for name in UNREACHED:
        target = TARGETS[PRESETS[name].domain][1]
        assert abs(grpo_effective_ratio(name, 1000) - target) > 0.03, name


def test_luck_presets_resolve_little_and_v2_more():
    luck = preset_stats("math-luck", 400).resolved_share
    assert luck < 0.25  # the audit: about 17%
    assert (
        preset_stats("math-r08", 400).resolved_share
        > preset_stats("math-r02", 400).resolved_share
        > luck - 0.1
    )


def test_resolved_share_is_the_quadratic_variation_before_the_final_draw():
    """Monte-Carlo: E[sum of squared steps of Z before the draw] = Z0(1-Z0) - E[Z_end(1-Z_end)]."""
    env = SimEnv("hotpotqa", num_tasks=64)
    z0 = np.array([true_value(t) for t in env.task_ids])
    task = int(np.argmin(np.abs(z0 - 0.5)))
    st = task_stats(make_task(env.preset, 0, task))
    want = st.z0 * (1 - st.z0) - st.residual
    policy = SimPolicy(env.preset)
    from trace_gym.policy import Conversation
    from trace_gym.tree import Turn

    rng = np.random.default_rng(3)
    qv = []
    for _ in range(800):
        prompt, _ = env.reset(seed=int(rng.integers(2**31)), options={"task": task})
        turns, zs = [], [env.true_value()]
        while not env.done:
            conv = Conversation(
                env.id, env.task_id, prompt, tuple(turns), seed=int(rng.integers(2**63))
            )
            text = policy.generate([conv])[0].text
            obs, *_ = env.step(text)
            turns.append(Turn(text, obs))
            zs.append(true_value(env.task_id, [t.action for t in turns]))
        qv.append(float(np.sum(np.diff(zs) ** 2)))
    qv = np.array(qv)
    se = qv.std(ddof=1) / np.sqrt(qv.size)
    assert abs(qv.mean() - want) <= 5 * se + 1e-9, (qv.mean(), want, se)


def test_state_distribution_is_a_probability_and_residual_table_agrees():
    task = make_task(PRESETS["bfcl"], 0, 3)
    alive, ended = state_distribution(task, task.preset.skill)
    assert ended.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.diff(alive.sum(axis=1)) <= 1e-12)  # episodes only end
    res = residual_table(task, task.preset.skill)[0, task.reach]
    assert res == pytest.approx(task_stats(task).residual, abs=1e-12)
    # the value is the same expectation with the win probability as the end payoff
    win = 1.0 / (1.0 + np.exp(-task.logit(np.arange(-task.reach, task.reach + 1))))
    assert ended @ win == pytest.approx(
        value_table(task, task.preset.skill)[0, task.reach], abs=1e-12
    )


def test_v2_prompts_and_observations_show_hints_and_decisive_turns():
    env = SimEnv("hotpotqa", num_tasks=32)
    prompt, _ = env.reset(seed=0, options={"task": 0})
    assert "Next: you notice" in prompt
    task = env.task
    assert len(task.hints) == task.turns and 1 <= len(task.knife) <= 2
    seen = sum("decisive" in (prompt if t == 0 else "") for t in task.knife)
    obs_texts = [prompt]
    while not env.done:
        obs, *_ = env.step("action 0")
        obs_texts.append(obs)
    flagged = [i for i, o in enumerate(obs_texts) if "decisive" in o]
    assert flagged == list(task.knife) and seen == (0 in task.knife)


def test_attainable_error_falls_with_depth_on_the_default_presets():
    for name in ("math", "hotpotqa"):
        mse = preset_stats(name, 400).attainable_mse_by_depth
        assert mse[max(mse)] < mse[0], mse


def test_shared_effects_make_move_quality_predictable_across_tasks():
    """The same (topic, hint, move) helps on average on unseen tasks of the domain."""
    p = PRESETS["math"]
    tasks = [make_task(p, 0, i) for i in range(600)]
    topic_idx = {t: i for i, t in enumerate(sorted({x.topic for x in tasks}))}
    sums = {}
    for x in tasks[:300]:
        for t in range(x.turns):
            for a in range(p.num_actions):
                key = (x.topic, x.hints[t], a)
                sums.setdefault(key, []).append(x.shifts[t, a])
    learned = {k: np.mean(v) for k, v in sums.items()}
    pred, real = [], []
    for x in tasks[300:]:
        for t in range(x.turns):
            for a in range(p.num_actions):
                if (x.topic, x.hints[t], a) in learned:
                    pred.append(learned[(x.topic, x.hints[t], a)])
                    real.append(x.shifts[t, a])
    assert len(topic_idx) > 1 and np.corrcoef(pred, real)[0, 1] > 0.2


def test_template_names_and_stems():
    p = template("bfcl", 0.4)
    assert (p.name, p.id_stem, p.topic_domain, p.resolved_share) == (
        "bfcl-r04",
        "bfcl_r04",
        "bfcl",
        0.4,
    )


FORBIDDEN = ("trace_gym.alloc", "trace_gym.predict", "trace_gym.runner", "trace_gym.plan")


def _imports(module: str) -> list[str]:
    path = Path(sim_pkg.__file__).parent / f"{module}.py"
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


@pytest.mark.parametrize("start", ["calibrate", "fit"])
def test_calibration_imports_no_allocator_or_predictor(start):
    """sim/calibrate and everything of sim/ it reaches (transitively) import no adaptive
    allocator, predictor or runner: the fit cannot look at TRACE."""
    seen, todo, reached = set(), [start], []
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        for name in _imports(mod):
            reached.append((mod, name))
            if name.startswith("trace_gym.sim."):
                todo.append(name.removeprefix("trace_gym.sim."))
    bad = [(m, n) for m, n in reached if n.startswith(FORBIDDEN)]
    assert not bad, bad
    assert {start, "baselines", "exact", "model", "presets"} <= seen


def test_the_import_check_would_catch_a_predictor_import():
    assert any(n.startswith(FORBIDDEN) for n in _imports("quality"))
