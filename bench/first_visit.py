"""The first-visit reference: what any predictor could know about a prompt from its text alone.

On a fresh prompt a predictor sees only what the prompt shows: in the simulator its
topic, difficulty clue, turn count and (v2) first hint and decisive flag. The best
root allocation given that information maximises the *expected* number of mixed
groups under the posterior of the prompt's success probability v given those clues:

    sum_x E[1 - v_x^m - (1 - v_x)^m | clues(x)]

(not the value at the posterior mean). Each per-unit gain of that objective is the
posterior mean of the gains of `solve_roots`, so the same exact method (the budget
largest per-unit gains, then the parity repair) solves it. The posterior is the
empirical distribution of Z_0 over a large reference pool of the same preset (another
pool seed), by clue cell, falling back to (topic, clue) for cells with few tasks.
Prefixes use TRACE's rule on the run's predictor, so the row isolates the root stage.

`CellMeanPredictor` is the weaker *cell-mean* reference beside it: the plug-in value
at the cell's mean success, under the unchanged TRACE solver and objective.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from trace_gym.alloc.base import Candidate
from trace_gym.alloc.policies import TraceAllocator
from trace_gym.alloc.solvers import check_root_budget, greedy_counts, repair_counts, root_increments

__all__ = ["CellMeanPredictor", "FirstVisitAllocator", "cell_means", "posterior_increments"]

#: reference pool size and seed (disjoint from the bench's pools, which use seeds 0..)
REFERENCE_TASKS = 20000
REFERENCE_SEED = 1_000_003
MIN_CELL = 25


def clue_cells(task) -> tuple[tuple, tuple]:
    fine = (task.topic, task.clue, task.turns, task.hints[:1], 0 in task.knife)
    return fine, (task.topic, task.clue)


@functools.lru_cache(maxsize=8)
def _pool(stem: str) -> tuple[np.ndarray, dict[tuple, list[int]]]:
    """(exact Z_0 of every reference task, clue cell -> its tasks) of the reference pool."""
    from trace_gym.sim.model import make_task, preset_for_stem, value_at

    p = preset_for_stem(stem)
    tasks = [make_task(p, REFERENCE_SEED, i) for i in range(REFERENCE_TASKS)]
    z = np.array([value_at(t, 0, 0, False, p.skill) for t in tasks])
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        fine, coarse = clue_cells(t)
        groups[fine].append(i)
        groups[coarse].append(i)
    return z, dict(groups)


@functools.lru_cache(maxsize=8)
def _reference(stem: str, m_max: int) -> tuple[dict[tuple, np.ndarray], dict[tuple, int]]:
    """(clue cell -> mean per-unit gains (m_max,), cell -> tasks) over the reference pool."""
    z, groups = _pool(stem)
    inc = root_increments(np.clip(z, 0.0, 1.0), m_max)
    return {k: inc[idx].mean(axis=0) for k, idx in groups.items()}, {
        k: len(idx) for k, idx in groups.items()
    }


def _cell_of(tid: str) -> tuple[str, tuple]:
    """(preset stem, the cell the reference uses for this task: fine if big enough, else coarse)."""
    from trace_gym.sim.model import parse_task_id, task_from_id

    stem = parse_task_id(tid)[0]
    _, groups = _pool(stem)
    fine, coarse = clue_cells(task_from_id(tid))
    return stem, fine if len(groups.get(fine, ())) >= MIN_CELL else coarse


def cell_means(task_ids: Sequence[str]) -> np.ndarray:
    """The mean exact success of each task's clue cell over the reference pool (0.5 if empty)."""
    out = []
    for tid in task_ids:
        stem, key = _cell_of(tid)
        z, groups = _pool(stem)
        idx = groups.get(key, [])
        out.append(float(np.mean(z[idx])) if idx else 0.5)
    return np.clip(np.array(out, dtype=float), 0.0, 1.0)


class CellMeanPredictor:
    """The cell-mean reference: a prompt's value is the mean success of its clue cell.

    What a predictor that has learned the prompt text's clue-to-success map perfectly,
    and nothing else, would say on a fresh prompt: the mean exact Z_0 of the reference
    pool's tasks in the prompt's cell (the cells `FirstVisitAllocator` uses, from the
    same disjoint pool). Under the unchanged TRACE solver it isolates what point values
    of that quality buy. Prefixes (depth >= 1) are scored, and every update is learned,
    by `inner` (the run's predictor), so the row changes only the root values.
    """

    name: ClassVar[str] = "cell_mean"

    def __init__(self, inner):
        self.inner = inner

    def predict(self, states):
        v = np.empty(len(states))
        deep = [i for i, s in enumerate(states) if s.depth > 0]
        roots = [i for i, s in enumerate(states) if s.depth == 0]
        if deep:
            v[deep] = self.inner.predict([states[i] for i in deep])
        if roots:
            v[roots] = cell_means([states[i].prompt_id for i in roots])
        return v

    def update(self, states, targets, weights=None):
        return self.inner.update(states, targets, weights)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state) -> None:
        self.inner.load_state_dict(state)


def posterior_increments(task_ids: Sequence[str], m_max: int) -> np.ndarray:
    """(P, m_max) posterior-mean per-unit gains of each candidate, given its prompt's clues."""
    rows = []
    for tid in task_ids:
        stem, key = _cell_of(tid)
        ref, _ = _reference(stem, m_max)
        rows.append(ref.get(key, np.zeros(m_max)))
    inc = np.array(rows).reshape(len(task_ids), m_max)
    np.minimum.accumulate(inc, axis=1, out=inc)
    return inc


class FirstVisitAllocator(TraceAllocator):
    """TRACE's root solver on posterior-expected gains given the prompt's clues (simulator only)."""

    name: ClassVar[str] = "first_visit"
    #: its roots read the clue cells, not the predictor: no uniform cold start
    cold_start_uniform: ClassVar[bool] = False

    def allocate_roots(
        self, candidates: Sequence[Candidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        if not candidates:
            return np.zeros(0, dtype=np.int64)
        check_root_budget(len(candidates), budget, self.m_max)
        inc = posterior_increments([c.id for c in candidates], self.m_max)
        counts = greedy_counts(inc, int(budget))
        partial = np.flatnonzero(counts == 1)
        if partial.size:
            counts[partial[0]] = 0
            repaired = repair_counts(inc, counts, self.m_max)
            if repaired is not None:
                counts = repaired[0]
        return counts
