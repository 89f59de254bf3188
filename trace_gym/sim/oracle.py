"""Reference predictors on the simulator: exact values, and exact values made noisy.

They live with the simulator because they read its exact values; the predictor registry
(`trace_gym.predict.PREDICTORS`) names them by entry point, so `trace_gym.predict` never
imports the simulator. ``trace_gym.predict.oracle`` is their old path (a warning alias).

- ``oracle``: the exact P(success | state) of `trace_gym.sim.true_value` (simulator task
  ids only). TRACE with it is the oracle allocator; it learns nothing.
- ``noisy``: the exact value with Gaussian noise on the logit, its size fitted so that
  the Spearman correlation between noisy and exact prompt values over the preset's task
  pool equals a target ``rho`` (``make_predictor("noisy", rho=0.9)``; the bench writes
  ``--predictor noisy:0.9``). The noise of a state is a pure function of the state's
  text, so predicting the same state twice gives the same number. It locates how much
  allocation quality a given ranking quality buys, without any learning.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.predict.base import State
from trace_gym.predict.training import spearman
from trace_gym.sim.model import parse_task_id, pool_values, preset_for_stem, true_value

__all__ = ["NoisyOraclePredictor", "OraclePredictor", "noise_for_spearman"]

_EPS = 1e-6


def _exact(state: State, skill: float | None) -> float:
    try:
        return true_value(state.prompt_id, [a for a, _ in state.turns], skill=skill)
    except ConfigError as e:
        raise ConfigError(
            f"the oracle predictors need simulator tasks (trace/Sim-v0); {state.prompt_id!r}: {e}"
        ) from e


class OraclePredictor:
    """Exact values from the simulator's recursion (at `skill`, default the preset's)."""

    name: ClassVar[str] = "oracle"

    def __init__(self, skill: float | None = None):
        self.skill = skill

    def predict(self, states: Sequence[State]) -> np.ndarray:
        return np.array([_exact(s, self.skill) for s in states], dtype=float)

    def update(
        self, states: Sequence[State], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        return {"n": float(len(states))}


def _unit_normal(text: str) -> float:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return float(np.random.default_rng(int.from_bytes(digest, "little")).normal())


def _logit(v: np.ndarray) -> np.ndarray:
    v = np.clip(v, _EPS, 1 - _EPS)
    return np.log(v) - np.log1p(-v)


@functools.lru_cache(maxsize=256)
def noise_for_spearman(stem: str, rho: float, num_tasks: int = 2000) -> float:
    """Logit noise sd whose noisy prompt values have Spearman `rho` with the exact ones."""
    z = _logit(pool_values(preset_for_stem(stem), num_tasks))
    eps = np.random.default_rng(12345).normal(size=z.size)
    lo, hi = 0.0, 64.0
    for _ in range(30):  # Spearman falls as the noise grows
        mid = 0.5 * (lo + hi)
        if spearman(z + mid * eps, z) > rho:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


class NoisyOraclePredictor:
    """Exact values plus logit noise sized to a target prompt-level Spearman `rho`."""

    name: ClassVar[str] = "noisy"

    def __init__(self, rho: float = 0.9, skill: float | None = None):
        rho = float(rho)
        if not 0.0 < rho < 1.0:
            raise ConfigError(f"noisy predictor: rho must be in (0, 1), got {rho}")
        self.rho = rho
        self.skill = skill

    def sigma(self, prompt_id: str) -> float:
        return noise_for_spearman(parse_task_id(prompt_id)[0], self.rho)

    def predict(self, states: Sequence[State]) -> np.ndarray:
        out = np.empty(len(states))
        for i, s in enumerate(states):
            z = _logit(np.array(_exact(s, self.skill)))
            noisy = z + self.sigma(s.prompt_id) * _unit_normal(s.prompt_id + s.serialize())
            out[i] = 1.0 / (1.0 + np.exp(-noisy))
        return out

    def update(
        self, states: Sequence[State], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        return {"n": float(len(states))}
