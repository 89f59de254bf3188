"""Predictors of P(success) for prompts and prefixes, behind one protocol.

- ``empirical``: per-prompt Beta posteriors from past visits;
- ``features``: hashed text n-grams of the shared serialisation + online logistic regression;
- ``bayes``: the ``features`` text model as a prior, combined with each prompt's visit
  counts (Beta posterior), with uncertainty-aware prompt values for allocation;
- ``constant``: 0.5 everywhere (the no-information baseline);
- ``oracle`` / ``noisy``: exact simulator values, and exact values with noise sized to a
  target Spearman (`trace_gym.predict.oracle`; references, they learn nothing).

`make_predictor(name, **kwargs)` builds one; `training_batch` turns finished trees into
an update batch; `quality_by_depth` reports Spearman and squared error per depth.
"""

from __future__ import annotations

from typing import Any

from trace_gym.errors import unknown
from trace_gym.predict.base import Predictor, State, serialize, states_from_tree
from trace_gym.predict.bayes import BayesPredictor
from trace_gym.predict.constant import ConstantPredictor
from trace_gym.predict.critic import CriticPredictor
from trace_gym.predict.empirical import EmpiricalPredictor
from trace_gym.predict.features import FeaturePredictor
from trace_gym.predict.oracle import NoisyOraclePredictor, OraclePredictor
from trace_gym.predict.training import TrainingBatch, quality_by_depth, spearman, training_batch

__all__ = [
    "PREDICTORS",
    "BayesPredictor",
    "ConstantPredictor",
    "EmpiricalPredictor",
    "FeaturePredictor",
    "Predictor",
    "State",
    "TrainingBatch",
    "make_predictor",
    "quality_by_depth",
    "serialize",
    "spearman",
    "states_from_tree",
    "training_batch",
]

#: predictor name -> class (each constructor takes keyword options only)
PREDICTORS: dict[str, type] = {
    "empirical": EmpiricalPredictor,
    "features": FeaturePredictor,
    "bayes": BayesPredictor,
    "constant": ConstantPredictor,
    "critic": CriticPredictor,
    "oracle": OraclePredictor,
    "noisy": NoisyOraclePredictor,
}


def make_predictor(name: str, **kwargs: Any) -> Predictor:
    """Build the predictor registered as `name` (unknown names raise `UnknownNameError`)."""
    if name not in PREDICTORS:
        raise unknown("predictor", name, PREDICTORS)
    return PREDICTORS[name](**kwargs)
