"""`empirical`: per-prompt Beta posteriors from past visits (no text model at all).

A prompt's value is the posterior mean of Beta(prior_a + successes, prior_b +
failures) over the leaves seen under it in past steps. A prefix's value starts from
its prompt's posterior mean and, if that exact prefix (same serialised history) was
seen in a training batch before, is updated with the prefix's own leaves, with the
prompt mean as a prior of strength `prefix_prior`. Under drift, `decay` < 1 shrinks a
prompt's old counts each time new evidence arrives, so stale visits fade.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.predict.base import State

__all__ = ["EmpiricalPredictor", "add_evidence"]


def add_evidence(table: dict, key, y: float, w: float, decay: float) -> None:
    """Decay `table[key]`'s [successes, failures] and add `w` leaves of success rate `y`."""
    c = table.setdefault(key, [0.0, 0.0])
    c[0], c[1] = decay * c[0] + w * y, decay * c[1] + w * (1.0 - y)


class EmpiricalPredictor:
    """Beta-posterior success rates per prompt (and per exactly revisited prefix)."""

    name: ClassVar[str] = "empirical"

    def __init__(
        self,
        prior_a: float = 1.0,
        prior_b: float = 1.0,
        prefix_prior: float = 2.0,
        decay: float = 1.0,
    ):
        if prior_a <= 0 or prior_b <= 0 or prefix_prior <= 0:
            raise ConfigError("prior_a, prior_b and prefix_prior must be > 0")
        if not 0.0 < decay <= 1.0:
            raise ConfigError(f"decay must be in (0, 1], got {decay}")
        self.prior_a, self.prior_b = float(prior_a), float(prior_b)
        self.prefix_prior, self.decay = float(prefix_prior), float(decay)
        #: prompt id -> [successes, failures]
        self.prompts: dict[str, list[float]] = {}
        #: prefix key -> [successes, failures]
        self.prefixes: dict[tuple[str, int], list[float]] = {}

    @staticmethod
    def _key(state: State) -> tuple[str, int]:
        return state.prompt_id, zlib.crc32(state.serialize().encode())

    def prompt_mean(self, prompt_id: str) -> float:
        s, f = self.prompts.get(prompt_id, (0.0, 0.0))
        return (self.prior_a + s) / (self.prior_a + self.prior_b + s + f)

    def predict(self, states: Sequence[State]) -> np.ndarray:
        out = np.empty(len(states))
        for i, st in enumerate(states):
            m = self.prompt_mean(st.prompt_id)
            if st.depth > 0 and (c := self.prefixes.get(self._key(st))) is not None:
                m = (self.prefix_prior * m + c[0]) / (self.prefix_prior + c[0] + c[1])
            out[i] = m
        return out

    def update(
        self, states: Sequence[State], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        """Add evidence: ``weights`` are leaf counts behind each target (default 1)."""
        targets = np.asarray(targets, dtype=float)
        weights = np.ones(len(states)) if weights is None else np.asarray(weights, dtype=float)
        err = self.predict(states) - targets
        for st, y, w in zip(states, targets, weights, strict=True):
            if st.depth == 0:
                add_evidence(self.prompts, st.prompt_id, y, w, self.decay)
            else:
                add_evidence(self.prefixes, self._key(st), y, w, self.decay)
        return {
            "mse": float(np.mean(err**2)) if len(err) else float("nan"),
            "n": float(len(states)),
        }

    def state_dict(self) -> dict[str, Any]:
        """The visit counts of prompts and prefixes (copies)."""
        return {"prompts": copy.deepcopy(self.prompts), "prefixes": copy.deepcopy(self.prefixes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts = copy.deepcopy(state["prompts"])
        self.prefixes = copy.deepcopy(state["prefixes"])
