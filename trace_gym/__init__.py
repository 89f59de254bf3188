"""trace-gym: restorable agentic text environments and TRACE rollout-budget allocation.

``import trace_gym`` registers the built-in env ids (``trace/Math-v0``,
``trace/HotpotQA-v0``, ``trace/BFCL-v0``, ``trace/Sim-v0``, ``trace/Wrapped-v0``) with
gymnasium. `trace_gym.wrap(env)` makes any gym-style text env restorable.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from trace_gym.core import Checkpoint, FreeText, TraceEnv, Transition, checkpoint, restore, unwrap
from trace_gym.registration import env_ids, register_envs
from trace_gym.wrap import WrappedEnv, wrap

try:
    __version__ = _metadata.version("trace-gym")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

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
    "wrap",
    "WrappedEnv",
    "__version__",
]
