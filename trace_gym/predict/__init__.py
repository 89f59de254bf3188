"""Predictors of P(success) for prompts and prefixes, behind one protocol.

- ``empirical``: per-prompt Beta posteriors from past visits;
- ``features``: hashed text n-grams of the shared serialisation + online logistic regression;
- ``bayes``: the ``features`` text model as a prior, combined with each prompt's visit
  counts (Beta posterior), with uncertainty-aware prompt values for allocation;
- ``clue``: a Bayesian logistic model on generic text features, refit on every root and
  prefix label so far, with a Laplace posterior (`trace_gym.predict.clue`; docs/alloc.md);
- ``constant``: 0.5 everywhere (the no-information baseline);
- ``critic``: the LM critic (`trace_gym.agents.critic`; needs the ``train`` extra).
- ``oracle`` / ``noisy``: exact simulator values, and exact values with noise sized to a
  target Spearman (`trace_gym.sim.oracle`, beside the values they read; references, they
  learn nothing).

Predictors are registered like envs, by ``"module:Class"`` entry points, so nothing is
imported until one is built: the core never imports the LM critic's package, and this
package never imports the simulator (which imports it).
`make_predictor(name, **kwargs)` builds one from a registered name, an entry point an
installed package declares in the ``trace_gym.predictors`` group, or a "module:Class"
string; `register_predictor` adds a name. Every predictor has ``state_dict()`` /
``load_state_dict()`` (what a training checkpoint saves). `training_batch` turns
finished trees into an update batch; `quality_by_depth` reports Spearman and squared
error per depth.
"""

from __future__ import annotations

from typing import Any

from trace_gym.compat import moved_names
from trace_gym.errors import ConfigError, unknown
from trace_gym.plugins import installed, is_entry_point, load
from trace_gym.predict.base import Predictor, State, serialize, states_from_tree
from trace_gym.predict.bayes import BayesPredictor
from trace_gym.predict.clue import CluePredictor
from trace_gym.predict.constant import ConstantPredictor
from trace_gym.predict.empirical import EmpiricalPredictor
from trace_gym.predict.features import FeaturePredictor
from trace_gym.predict.training import (
    TrainingBatch,
    every_label,
    quality_by_depth,
    spearman,
    training_batch,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "PREDICTORS",
    "BayesPredictor",
    "CluePredictor",
    "ConstantPredictor",
    "EmpiricalPredictor",
    "FeaturePredictor",
    "Predictor",
    "State",
    "TrainingBatch",
    "every_label",
    "make_predictor",
    "predictor_class",
    "predictor_entry_point",
    "quality_by_depth",
    "register_predictor",
    "serialize",
    "spearman",
    "states_from_tree",
    "training_batch",
]

#: predictor name -> "module:Class" entry point (each constructor takes keyword options only)
PREDICTORS: dict[str, str] = {
    "empirical": "trace_gym.predict.empirical:EmpiricalPredictor",
    "features": "trace_gym.predict.features:FeaturePredictor",
    "bayes": "trace_gym.predict.bayes:BayesPredictor",
    "clue": "trace_gym.predict.clue:CluePredictor",
    "constant": "trace_gym.predict.constant:ConstantPredictor",
    "critic": "trace_gym.agents.critic:CriticPredictor",
    "oracle": "trace_gym.sim.oracle:OraclePredictor",
    "noisy": "trace_gym.sim.oracle:NoisyOraclePredictor",
}

#: the entry-point group an installed package declares its predictors in
ENTRY_POINT_GROUP = "trace_gym.predictors"

#: OraclePredictor and NoisyOraclePredictor moved to trace_gym.sim.oracle (a warning alias)
__getattr__ = moved_names(__name__)


def register_predictor(name: str, entry_point: str) -> None:
    """Register `entry_point` ("module:Class") as `name`, for configs and `make_predictor`."""
    if entry_point.count(":") != 1:
        raise ConfigError(f"predictor entry point must be 'module:Class', got {entry_point!r}")
    PREDICTORS[name] = entry_point


def predictor_entry_point(name: str) -> str:
    """The "module:Class" string `name` stands for: a registered name, an installed entry
    point of the ``trace_gym.predictors`` group, or an entry-point string itself.

    Nothing is imported; unknown names raise `UnknownNameError` listing the known ones.
    """
    if name in PREDICTORS:
        return PREDICTORS[name]
    found = installed(ENTRY_POINT_GROUP)
    if name in found:
        return found[name]
    if is_entry_point(name):
        return name
    raise unknown("predictor", name, [*PREDICTORS, *found])


def predictor_class(name: str) -> type:
    """The predictor class of a registered name or a "module:Class" string (imports it)."""
    return load(predictor_entry_point(name), "predictor")


def make_predictor(name: str, **kwargs: Any) -> Predictor:
    """Build the predictor `name` (registered name or "module:Class"), with keyword options."""
    return predictor_class(name)(**kwargs)
