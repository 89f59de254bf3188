"""The runner copies an UncertainPredictor's concentration into the allocator's records."""

from __future__ import annotations

import numpy as np

from trace_gym.alloc import TraceAllocator
from trace_gym.predict import make_predictor
from trace_gym.predict.base import UncertainPredictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy

TASKS = [f"count-{i}" for i in range(10)]


class _Sure:
    """A features predictor that also reports a concentration growing with depth."""

    name = "sure"

    def __init__(self):
        self.inner = make_predictor("features")

    def predict(self, states):
        return self.inner.predict(states)

    def update(self, states, targets, weights=None):
        return self.inner.update(states, targets, weights)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)

    @property
    def has_data(self):
        return True

    def concentration(self, states):
        return np.array([1.0 + s.depth for s in states])


class _Recording(TraceAllocator):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.roots, self.prefixes = [], []

    def allocate_roots(self, candidates, budget, rng):
        self.roots += list(candidates)
        return super().allocate_roots(candidates, budget, rng)

    def allocate_prefixes(self, prefixes, budget, rng):
        self.prefixes += list(prefixes)
        return super().allocate_prefixes(prefixes, budget, rng)


def _run(predictor, objective="posterior"):
    alloc = _Recording(m_max=8, objective=objective)
    runner = BranchingRunner(
        RandomCountdownPolicy(),
        lambda: CountdownEnv(num_tasks=10, max_turns=6),
        alloc,
        predictor,
        RunnerConfig(root_budget=20, replays_per_root=2.0, m_max=8, seed=3),
    )
    try:
        trees = [runner.run_step(s, TASKS).trees for s in range(2)]
    finally:
        runner.close()
    return alloc, trees


def test_concentrations_reach_roots_and_prefixes():
    assert isinstance(_Sure(), UncertainPredictor)
    alloc, _ = _run(_Sure())
    assert alloc.roots and all(c.concentration == 1.0 for c in alloc.roots)
    assert alloc.prefixes and all(p.concentration == 1.0 + p.depth for p in alloc.prefixes)


def test_point_predictors_give_none_and_posterior_equals_plugin():
    alloc, trees = _run(make_predictor("features"))
    assert all(c.concentration is None for c in alloc.roots)
    assert all(p.concentration is None for p in alloc.prefixes)
    _, plug = _run(make_predictor("features"), objective="plugin")
    assert [[t.to_dict() for t in s] for s in trees] == [[t.to_dict() for t in s] for s in plug]


def test_the_posterior_objective_changes_the_plan_when_beliefs_are_wide():
    _, post = _run(_Sure())
    _, plug = _run(_Sure(), objective="plugin")
    a = [[t.to_dict() for t in s] for s in post]
    b = [[t.to_dict() for t in s] for s in plug]
    assert a != b
