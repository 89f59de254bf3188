"""Exact values of a simulator task under *any* move distribution (not only `SimPolicy`'s).

`trace_gym.sim.model.value_table` fixes the move probabilities to the simulated policy's
``softmax(skill * delta + habit)``. A learner that plays the simulator with its own
per-turn move distribution ``pm[t, a]`` (and the simulator's malformed / answer rule)
has the same backward recursion with `pm` in place::

    V[T, k] = sigmoid(b + grid k)
    V[t, k] = p_ans(t, k) sigmoid(b + grid k) + p_mal V[t+1, k]
              + (1 - p_mal - p_ans(t, k)) sum_a pm[t, a] V[t+1, k + d[t, a]]

so held-out success under the current learned policy is exact (no sampling noise).
"""

from __future__ import annotations

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.sim.model import SimTask, sigmoid, transition_parts

__all__ = ["policy_success", "policy_value_at", "policy_value_table"]


def policy_value_table(task: SimTask, pm: np.ndarray) -> np.ndarray:
    """V[t, k + reach]: exact P(success) after t turns at offset k when moves follow `pm` (T, K)."""
    pm = np.asarray(pm, dtype=float)
    if pm.shape != task.shifts.shape:
        raise ConfigError(
            f"{task.id}: move probabilities need shape {task.shifts.shape}, got {pm.shape}"
        )
    p = task.preset
    succ, _, ans = transition_parts(task, 0.0)
    win = sigmoid(task.logit(np.arange(-task.reach, task.reach + 1)))
    V = np.empty((task.turns + 1, win.size))
    V[task.turns] = win
    for t in range(task.turns - 1, -1, -1):
        nxt = V[t + 1]
        pa = ans if t >= 1 else 0.0
        moved = pm[t] @ nxt[succ[t]]
        V[t] = pa * win + p.malformed_prob * nxt + (1.0 - p.malformed_prob - pa) * moved
    return V


def policy_value_at(task: SimTask, pm: np.ndarray, t: int, k: int, ended: bool) -> float:
    """Exact P(success) at state (t, k) under `pm` (sigmoid of the final logit once ended)."""
    if ended:
        return float(sigmoid(task.logit(k)))
    return float(policy_value_table(task, pm)[t, k + task.reach])


def policy_success(task: SimTask, pm: np.ndarray) -> float:
    """Exact P(success) from the prompt under `pm`."""
    return float(policy_value_table(task, pm)[0, task.reach])
