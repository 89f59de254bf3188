"""Exact statistics of a preset from its value recursion (no sampling).

- `state_distribution`: the chance that an episode is still running after t turns at
  offset k (a forward pass of the same transitions as `value_table`);
- `task_stats`: per task, Z_0, the share of Z_0 (1 - Z_0) resolved by the moves before
  the final draw (``1 - E[sigmoid(L)(1 - sigmoid(L))] / (Z_0 (1 - Z_0))`` with L the
  final logit: the martingale identity splits V_0 (1 - V_0) into the squared steps of Z
  along the path plus the final jump, whose expected square is that residual), and by
  depth the floor of the attainable squared error against the outcome given the full
  state, ``E[Z_t (1 - Z_t)]``, and the spread ``E|Z_t - Z_0|`` of the prefix values;
- `preset_stats`: the same over a pool, the resolved share over prompts with
  0.1 < Z_0 < 0.9 (where there is anything to resolve).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trace_gym.sim.model import (
    SimTask,
    backward_table,
    make_task,
    sigmoid,
    transition_parts,
    value_table,
)
from trace_gym.sim.presets import SimPreset, get_preset

__all__ = ["PresetStats", "TaskStats", "preset_stats", "state_distribution", "task_stats"]


def state_distribution(task: SimTask, skill: float) -> tuple[np.ndarray, np.ndarray]:
    """(alive (T+1, 2R+1): P(running after t turns at k), ended (2R+1,): P(ends at k))."""
    p = task.preset
    succ, pm, ans = transition_parts(task, skill)
    width = 2 * task.reach + 1
    alive = np.zeros((task.turns + 1, width))
    alive[0, task.reach] = 1.0
    ended = np.zeros(width)
    for t in range(task.turns):
        a = alive[t]
        pa = ans if t >= 1 else np.zeros(width)
        ended += a * pa
        alive[t + 1] += p.malformed_prob * a
        move = (1.0 - p.malformed_prob - pa) * a
        for j in range(p.num_actions):
            np.add.at(alive[t + 1], succ[t, j], pm[t, j] * move)
    ended += alive[task.turns]
    return alive, ended


@dataclass(frozen=True)
class TaskStats:
    """Exact figures of one task (depth d = turns done; d = 0 is the prompt)."""

    z0: float
    #: E[Z_end (1 - Z_end)]: the part of Z_0 (1 - Z_0) left to the final draw
    residual: float
    #: per depth 0..T-1: (P(a prefix at that depth exists), E[Z(1-Z)], E|Z - Z_0|, P(|Z - Z_0| > 0.2))
    by_depth: tuple[tuple[float, float, float, float], ...]


def task_stats(task: SimTask, skill: float | None = None) -> TaskStats:
    """The exact figures of one task under the simulated policy."""
    s = task.preset.skill if skill is None else float(skill)
    V = value_table(task, s)
    alive, ended = state_distribution(task, s)
    win = sigmoid(task.logit(np.arange(-task.reach, task.reach + 1)))
    z0 = float(V[0, task.reach])
    residual = float(ended @ (win * (1.0 - win)))
    rows = []
    for d in range(task.turns):
        w = alive[d]
        mass = float(w.sum())
        if mass <= 0:
            rows.append((0.0, 0.0, 0.0, 0.0))
            continue
        gap = np.abs(V[d] - z0)
        rows.append(
            (
                mass,
                float(w @ (V[d] * (1 - V[d])) / mass),
                float(w @ gap / mass),
                float(w @ (gap > 0.2) / mass),
            )
        )
    return TaskStats(z0, residual, tuple(rows))


def residual_table(task: SimTask, skill: float) -> np.ndarray:
    """E[Z_end (1 - Z_end) | t, k]: what the final draw still decides from each state."""
    win = sigmoid(task.logit(np.arange(-task.reach, task.reach + 1)))
    return backward_table(task, skill, win * (1.0 - win))


@dataclass(frozen=True)
class PresetStats:
    """Exact figures of a pool (what ``sim-calibrate --json`` reports per preset)."""

    preset: str
    resolved_share: float
    mid_prompts: int
    #: per depth: mean attainable squared error floor E[Z(1-Z)] over the prefixes there
    attainable_mse_by_depth: dict[int, float]
    #: per depth: mean |Z - Z_0| and share of prefixes more than 0.2 from Z_0
    spread_by_depth: dict[int, float]
    far_share_by_depth: dict[int, float]


def preset_stats(
    preset: str | SimPreset, num_tasks: int = 500, seed: int = 0, max_depth: int = 6
) -> PresetStats:
    """Exact pool figures; depth averages weight each task's prefixes by their chance."""
    p = get_preset(preset)
    stats = [task_stats(make_task(p, seed, i)) for i in range(num_tasks)]
    mid = [s for s in stats if 0.1 < s.z0 < 0.9]
    var = sum(s.z0 * (1 - s.z0) for s in mid)
    resolved = 1.0 - sum(s.residual for s in mid) / var if var > 0 else 0.0
    mse, spread, far = {}, {}, {}
    for d in range(max_depth + 1):
        rows = [s.by_depth[d] for s in stats if d < len(s.by_depth)]
        w = np.array([r[0] for r in rows])
        if not rows or w.sum() <= 0:
            continue
        arr = np.array(rows)
        mse[d] = float(w @ arr[:, 1] / w.sum())
        spread[d] = float(w @ arr[:, 2] / w.sum())
        far[d] = float(w @ arr[:, 3] / w.sum())
    return PresetStats(p.name, float(resolved), len(mid), mse, spread, far)
