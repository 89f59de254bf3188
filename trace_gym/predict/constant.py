"""`constant`: the no-information baseline predictor (always 0.5, never learns)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.predict.base import State

__all__ = ["ConstantPredictor"]


class ConstantPredictor:
    """Predicts the same probability for every prompt and prefix (default 0.5)."""

    name: ClassVar[str] = "constant"

    def __init__(self, value: float = 0.5):
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"constant predictor value must be in [0, 1], got {value}")
        self.value = float(value)

    def predict(self, states: Sequence[State]) -> np.ndarray:
        return np.full(len(states), self.value)

    def update(
        self, states: Sequence[State], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        return {"n": float(len(states))}

    def state_dict(self) -> dict[str, Any]:
        """Nothing is learned: an empty state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ConfigError(f"the constant predictor has no state; got keys {sorted(state)}")
