"""The predictor protocol and the prompt+history serialisation every predictor shares.

A predictor estimates P(success) from a `State`: a prompt (depth 0) or a prompt plus
the turns of a visited prefix (depth >= 1). It is trained online on bottom-up tree
targets (the success rate of the leaves below each node). Like a torch module, it saves
and restores what it learned through ``state_dict()`` / ``load_state_dict()``; a
checkpoint stores that, never the object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from trace_gym.tree import RolloutTree

__all__ = ["Predictor", "State", "UncertainPredictor", "serialize", "states_from_tree"]

#: separators of the shared serialisation (kept stable: predictors are trained on it)
PROMPT_TAG, ACTION_TAG, OBS_TAG = "<|prompt|>", "<|action|>", "<|observation|>"


@dataclass(frozen=True)
class State:
    """What a predictor sees: the prompt and the (action, observation) turns so far."""

    prompt_id: str
    prompt: str
    turns: tuple[tuple[str, str], ...] = ()
    env_id: str = ""

    @property
    def depth(self) -> int:
        return len(self.turns)

    def serialize(self, max_chars: int | None = None) -> str:
        return serialize(self, max_chars)


def serialize(state: State, max_chars: int | None = None) -> str:
    """Prompt + history as one string; left-truncates the history, always keeps the prompt."""
    head = f"{PROMPT_TAG}{state.prompt}"
    body = "".join(f"{ACTION_TAG}{a}{OBS_TAG}{o}" for a, o in state.turns)
    if max_chars is not None and len(head) + len(body) > max_chars:
        keep = max(0, max_chars - len(head))
        body = body[len(body) - keep :] if keep else ""
    return head + body


def states_from_tree(tree: RolloutTree, node_ids: Sequence[int] | None = None) -> list[State]:
    """The `State` at each requested node (default: every node) of a tree."""
    ids = range(len(tree.nodes)) if node_ids is None else node_ids
    out = []
    for i in ids:
        turns = tuple((t.action, t.observation) for t in tree.turns(i))
        out.append(State(tree.prompt_id, tree.prompt, turns, tree.env_id))
    return out


@runtime_checkable
class Predictor(Protocol):
    """Success-probability estimator for prompts and prefixes."""

    name: ClassVar[str]

    def predict(self, states: Sequence[State]) -> np.ndarray:
        """P(success) for each state, in [0, 1] (float array, same order)."""
        ...

    def update(
        self, states: Sequence[State], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        """One online update on bottom-up targets; returns training metrics (loss, ...)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What the predictor has learned (a picklable copy; constructor options excluded)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output into a predictor built with the same options."""
        ...


@runtime_checkable
class UncertainPredictor(Predictor, Protocol):
    """A predictor that also says how sure it is, and whether it has seen any data.

    Its belief about a state's success probability is Beta(a, b) with mean
    ``predict(states)`` and ``a + b = concentration(states)`` (``inf``: a point value).
    The runner copies the concentration into `trace_gym.alloc.base.Candidate` /
    `PrefixCandidate` records, where the posterior objective reads it. ``has_data`` is
    False until the first `update` with any weight: with no data the runner allocates
    roots as the uniform baseline does instead of ranking on a constant.
    """

    @property
    def has_data(self) -> bool: ...

    def concentration(self, states: Sequence[State]) -> np.ndarray:
        """a + b of each state's Beta belief (float array, same order; > 0, may be inf)."""
        ...
