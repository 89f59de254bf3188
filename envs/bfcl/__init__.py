"""BFCL v4 multi-turn function calling (`trace/BFCL-v0`) on the bfcl-eval backends.

Needs ``pip install --no-deps bfcl-eval==2026.3.23 && pip install mpmath``; nothing from
bfcl-eval is imported until an env is made or data is loaded.
"""

from trace_gym.envs.bfcl.data import CATEGORIES, BFCLEntry, get_entry, load_entries
from trace_gym.envs.bfcl.env import BFCLEnv
from trace_gym.envs.bfcl.scripted import ScriptedBFCL

__all__ = ["CATEGORIES", "BFCLEntry", "BFCLEnv", "ScriptedBFCL", "get_entry", "load_entries"]
