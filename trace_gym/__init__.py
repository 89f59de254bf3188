"""trace-gym: restorable agentic text environments and TRACE rollout-budget allocation.

``import trace_gym`` registers the built-in env ids (``trace/Math-v0``,
``trace/HotpotQA-v0``, ``trace/BFCL-v0``, ``trace/Sim-v0``) with gymnasium.
"""

from __future__ import annotations

from trace_gym.core import Checkpoint, FreeText, TraceEnv, Transition, checkpoint, restore, unwrap
from trace_gym.registration import env_ids, register_envs

__version__ = "0.1.0"

register_envs()

__all__ = [
    "Checkpoint",
    "FreeText",
    "TraceEnv",
    "Transition",
    "checkpoint",
    "env_ids",
    "restore",
    "unwrap",
    "__version__",
]
