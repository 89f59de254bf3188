"""Deprecated: moved to `trace_gym.sim.oracle` (this alias goes in 0.3)."""

from trace_gym.compat import moved

__getattr__ = moved(__name__, "trace_gym.sim.oracle")
