"""The CPU pipeline check's RL task pool: the v1 draws it was measured on, never the warm start's prompts.

Regression (2026-12-01): since simulator v2 a preset's task ids and draws key on its
`stem`, and ``replace(math-luck, name="learnable")`` kept the stem "math". The RL pool became
sim-math-0-0..7: the very prompts the cached warm start (built from v1 "math" data) was
fine-tuned on, with the same random draws rescaled, and the 3-method x 3-seed check learned
nothing on average (mean gain 0.0; it was +0.11 on the v1 pool).
"""

from __future__ import annotations

import pytest
from trace_gym.bench.pipeline import pipeline_preset, warm_start_config

from trace_gym.sim import get_preset
from trace_gym.sim.env import SimEnv
from trace_gym.sim.model import make_task


def _pool(preset, num_tasks: int, seed: int = 0) -> set[str]:
    return set(SimEnv(preset=preset, num_tasks=num_tasks, seed=seed).task_ids)


def test_pipeline_pool_is_the_v1_learnable_pool():
    p = pipeline_preset()
    assert p.id_stem == "learnable" and not p.is_v2
    t = make_task(p, 0, 0)  # the draws of the pool the docs' figures were measured on (v1)
    assert (t.id, t.topic, t.turns, t.clue) == ("sim-learnable-0-0", "alpha", 2, 0)
    assert t.base == pytest.approx(-4.058492, abs=1e-6)
    assert t.shifts.tolist() == [[13, -13, -1], [9, 5, -1]]


def test_pipeline_pool_is_disjoint_from_every_warm_start_pool():
    sft = warm_start_config().env_kwargs["trace/Sim-v0"]
    rl = _pool(pipeline_preset(), 8)
    # the warm start's prompts under the current default preset and under v1 "math" (a model
    # cached before simulator v2 keeps its key: the key does not cover the simulator's version)
    for preset in ("math", "math-luck"):
        assert not rl & _pool(get_preset(preset), sft["num_tasks"], sft.get("seed", 0)), preset
