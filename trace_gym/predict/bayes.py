"""`bayes`: a text-model prior combined with each prompt's own visit counts.

The `features` text model predicts p0 for a prompt from its text; past visits add
evidence. The prompt's belief is Beta(k p0 + s, k (1 - p0) + f), with s, f the
successes and failures seen under it and k (`prior_strength`) the pseudo-count the
text prior is worth. Prefix values come from the text model (it reads the history).

Why not just the posterior mean: TRACE's root objective, 1 - v^m - (1-v)^m, is
concave in v near 0.5, so plugging in a point estimate over-rates prompts the
predictor knows little about - an unvisited prompt predicted 0.5 looks like the best
possible candidate, although under this task distribution (success rates piled up
near 0 and 1) it is usually all-success or all-failure. With ``mixing=True`` the
value returned for a *prompt* is the point v whose two-rollout mixing chance equals
the posterior's expected one: 2 v (1 - v) = E[2 p (1 - p)] = 2 a b / ((a + b)(a + b + 1)),
on the same side of 0.5 as the posterior mean. Uncertain prompts move toward 0 or 1
(fewer rollouts); well-observed mixed prompts keep values near 0.5. Matching at
m = 2 is an approximation for larger groups. ``mixing=False`` returns the mean, a
calibrated probability (use it for measuring predictor quality).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.predict.base import State
from trace_gym.predict.empirical import add_evidence
from trace_gym.predict.features import FeaturePredictor

__all__ = ["BayesPredictor"]


class BayesPredictor:
    """Text-model prior x per-prompt Beta posterior; uncertainty-aware prompt values."""

    name: ClassVar[str] = "bayes"

    def __init__(
        self, prior_strength: float = 2.0, decay: float = 1.0, mixing: bool = True, **features: Any
    ):
        if prior_strength <= 0:
            raise ConfigError(f"prior_strength must be > 0, got {prior_strength}")
        if not 0.0 < decay <= 1.0:
            raise ConfigError(f"decay must be in (0, 1], got {decay}")
        self.prior_strength, self.decay, self.mixing = (
            float(prior_strength),
            float(decay),
            bool(mixing),
        )
        self.text = FeaturePredictor(**features)
        #: prompt id -> [successes, failures] (leaf counts, decayed)
        self.counts: dict[str, list[float]] = {}

    def posterior(
        self, states: Sequence[State], p0: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Beta parameters (a, b) of each state's prompt (text prior + visit counts)."""
        p0 = self.text.predict(states) if p0 is None else p0
        sf = np.array([self.counts.get(s.prompt_id, (0.0, 0.0)) for s in states]).reshape(-1, 2)
        k = self.prior_strength
        return k * p0 + sf[:, 0], k * (1.0 - p0) + sf[:, 1]

    def predict(self, states: Sequence[State]) -> np.ndarray:
        if not states:
            return np.zeros(0)
        p = self.text.predict(states)
        roots = np.array([s.depth == 0 for s in states])
        if roots.any():
            a, b = self.posterior([s for s in states if s.depth == 0], p[roots])
            mean = a / (a + b)
            if self.mixing:
                half_mix = a * b / ((a + b) * (a + b + 1.0))  # E[p (1 - p)] <= 1/4
                d = np.sqrt(np.clip(1.0 - 4.0 * half_mix, 0.0, 1.0))
                mean = np.where(mean < 0.5, (1.0 - d) / 2.0, (1.0 + d) / 2.0)
            p[roots] = mean
        return p

    def update(
        self, states: Sequence[State], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        """Train the text model on every state; add prompt-level leaves to the visit counts."""
        targets = np.asarray(targets, dtype=float)
        weights = np.ones(len(states)) if weights is None else np.asarray(weights, dtype=float)
        metrics = self.text.update(states, targets, weights)
        for st, y, w in zip(states, targets, weights, strict=True):
            if st.depth == 0:
                add_evidence(self.counts, st.prompt_id, y, w, self.decay)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The text model's state and the per-prompt visit counts (copies)."""
        return {"text": self.text.state_dict(), "counts": copy.deepcopy(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.text.load_state_dict(state["text"])
        self.counts = copy.deepcopy(state["counts"])
