"""The tree-branching simulator: synthetic tasks with an exact success martingale.

- `SimEnv` (registered as ``trace/Sim-v0``): a restorable text env;
- `SimPolicy`: the simulated agent, driven through the batched `Policy` protocol;
- `PRESETS`: the frozen ``math`` / ``hotpotqa`` / ``bfcl`` task pools;
- `true_value(task_id, actions_so_far, preset, skill)`: exact Z_t from a tree path.

See docs/sim.md for the model and its calibration.
"""

from __future__ import annotations

from trace_gym.sim.env import SimEnv
from trace_gym.sim.model import make_task, pool_values, task_from_id, true_value
from trace_gym.sim.policy import SimPolicy
from trace_gym.sim.presets import PRESETS, SimPreset, get_preset, skill_at

__all__ = [
    "PRESETS",
    "SimEnv",
    "SimPolicy",
    "SimPreset",
    "get_preset",
    "make_task",
    "pool_values",
    "skill_at",
    "task_from_id",
    "true_value",
]
