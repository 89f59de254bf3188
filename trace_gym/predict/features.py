"""`features`: hashed text n-grams of the shared serialisation + online logistic regression.

The state (the parts of the shared serialisation, `trace_gym.predict.base.serialize`)
becomes one sparse vector over hashed namespaces; the text namespaces are each
L2-normalised on their own, so a long history cannot drown the parts that matter most:

- ``p``: word unigrams and bigrams of the prompt (task features, difficulty clues, id);
- ``h``: word unigrams of the whole history (what happened so far);
- ``l``: unigrams and bigrams of the *last* turn (action and observation: the freshest
  clue about the state), plus a depth bucket and a bias;
- ``frac``: every "word a/b" in the last observation ("gauge 6/9", "3/5 tests passed")
  as a real-valued feature keyed by the word, its smoothed log-odds
  log((a + 0.5) / (b - a + 0.5)), so an ordinal reading is one weight to learn (on the
  logit scale the model predicts on) instead of one per value;
- ``id``: the state's prompt id at value 1 (``prompt_id=True``), a per-prompt bias that
  lets a revisited prompt be remembered quickly while unseen prompts are judged by text.

A logistic regression on these features is fitted online with AdaGrad on soft
targets (bottom-up success rates), weighted by the leaf counts behind each target.
Everything is numpy; nothing is learned about the env beyond what its text says.
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.predict.base import State

__all__ = ["FeaturePredictor", "featurize"]

_WORD = re.compile(r"[a-z0-9]+(?:[-/.][a-z0-9]+)*")
_NONCE = re.compile(r"^(?=[a-z0-9]*[0-9])[a-z0-9]+$")
#: "gauge 6/9", "3/5 tests", "turn 2/4": a word and the fraction right after it
FRACTION = re.compile(r"([A-Za-z]+)\W{0,2}(\d+)\s*/\s*(\d+)")


def ngrams(text: str, n: int) -> list[str]:
    # long unseparated tokens with digits (hashes, nonces, draft ids) never recur: drop them
    words = [w for w in _WORD.findall(text.lower()) if len(w) < 6 or not _NONCE.match(w)]
    out = list(words)
    for k in range(2, n + 1):
        out += [" ".join(words[i : i + k]) for i in range(len(words) - k + 1)]
    return out


_HASHES: dict[tuple[str, int], int] = {}


def _hash(namespace: str, grams: Sequence[str], dim: int) -> np.ndarray:
    """Hashed indices of `grams` (the vocabulary repeats, so hashes are memoised)."""
    if len(_HASHES) > 1_000_000:
        _HASHES.clear()
    out = np.empty(len(grams), np.int64)
    for i, g in enumerate(grams):
        key = (f"{namespace}|{g}", dim)
        h = _HASHES.get(key)
        if h is None:
            h = _HASHES[key] = zlib.crc32(key[0].encode()) % dim
        out[i] = h
    return out


def _normalised(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique indices with their counts scaled to unit L2 norm."""
    if idx.size == 0:
        return idx, np.zeros(0)
    idx, counts = np.unique(idx, return_counts=True)
    return idx, counts / np.sqrt(np.sum(counts.astype(float) ** 2))


@functools.lru_cache(maxsize=65536)
def _prompt_part(prompt: str, dim: int, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    return _normalised(_hash("p", ngrams(prompt, ngram), dim))


@functools.lru_cache(maxsize=262144)
def _turn_part(
    action: str, obs: str, dim: int, ngram: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """History unigram hashes, last-turn n-gram hashes, and fraction features of one turn."""
    text = f"{action} {obs}"
    fracs = [(w.lower(), int(a), int(b)) for w, a, b in FRACTION.findall(obs) if int(b) > 0]
    f_idx = _hash("frac", [w for w, _, _ in fracs], dim)
    f_val = np.array([math.log((min(a, b) + 0.5) / (b - min(a, b) + 0.5)) for _, a, b in fracs])
    return _hash("h", ngrams(text, 1), dim), _hash("l", ngrams(text, ngram), dim), f_idx, f_val


@functools.lru_cache(maxsize=64)
def _extras(depth: int, dim: int) -> np.ndarray:
    bucket = depth if depth < 4 else 4 + int(np.log2(depth / 4 + 1) * 2)
    return np.array([zlib.crc32(b"bias") % dim, zlib.crc32(f"depth|{bucket}".encode()) % dim])


@functools.lru_cache(maxsize=32768)
def featurize(
    state: State, dim: int = 1 << 18, ngram: int = 2, max_turns: int = 64, prompt_id: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(feature indices, values) of one state (indices may repeat across namespaces; cached)."""
    parts = [_prompt_part(state.prompt, dim, ngram)]
    recent = state.turns[-max_turns:] if max_turns > 0 else ()
    if recent:
        hashed = [_turn_part(a, o, dim, ngram) for a, o in recent]
        parts.append(_normalised(np.concatenate([h[0] for h in hashed])))
        parts.append(_normalised(hashed[-1][1]))
        parts.append(hashed[-1][2:])  # fractions in the last observation, centred values
    extra = _extras(min(len(state.turns), 63), dim)
    if prompt_id:
        pid = zlib.crc32(f"id|{state.prompt_id}".encode()) % dim
        extra = np.append(extra, pid)
    idx = np.concatenate([p[0] for p in parts] + [extra])
    vals = np.concatenate([p[1] for p in parts] + [np.ones(extra.size)])
    return idx, vals


class FeaturePredictor:
    """Hashed n-gram logistic regression, trained online on bottom-up targets.

    Args:
        dim: hash space size. ngram: longest word n-gram (prompt and last turn).
        lr: AdaGrad step size. l2: L2 penalty on touched weights.
        epochs: passes over each update batch. batch_size: minibatch size.
        max_turns: history turns read (the most recent ones).
        prompt_id: add the per-prompt bias feature.
        weighting: "leaves" (leaf counts), "sqrt" or "none": how the update's weights
            become sample weights. seed: shuffling seed.
    """

    name: ClassVar[str] = "features"

    def __init__(
        self,
        dim: int = 1 << 18,
        ngram: int = 2,
        lr: float = 0.5,
        l2: float = 1e-3,
        epochs: int = 3,
        batch_size: int = 32,
        max_turns: int = 64,
        prompt_id: bool = True,
        weighting: str = "leaves",
        seed: int = 0,
    ):
        if dim < 16 or ngram < 1 or lr <= 0 or l2 < 0 or epochs < 1 or batch_size < 1:
            raise ConfigError(
                "features predictor needs dim >= 16, ngram >= 1, lr > 0, l2 >= 0, epochs >= 1, batch_size >= 1"
            )
        self.dim, self.ngram, self.lr, self.l2 = int(dim), int(ngram), float(lr), float(l2)
        self.epochs, self.batch_size, self.max_turns = int(epochs), int(batch_size), int(max_turns)
        self.prompt_id = bool(prompt_id)
        if weighting not in _WEIGHTING:
            raise ConfigError(f"weighting must be one of {sorted(_WEIGHTING)}, got {weighting!r}")
        self.weighting = weighting
        self.w = np.zeros(self.dim)
        self.g2 = np.full(self.dim, 1e-8)
        self.rng = np.random.default_rng(seed)
        self.updates = 0

    def _rows(self, states: Sequence[State]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [featurize(s, self.dim, self.ngram, self.max_turns, self.prompt_id) for s in states]

    def _logits(self, rows: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        return np.array([float(self.w[i] @ v) for i, v in rows])

    def predict(self, states: Sequence[State]) -> np.ndarray:
        if not states:
            return np.zeros(0)
        return 1.0 / (1.0 + np.exp(-self._logits(self._rows(states))))

    def update(
        self, states: Sequence[State], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        """AdaGrad on weighted cross-entropy; weights are normalised to mean 1 in the batch."""
        n = len(states)
        if n == 0:
            return {"loss": float("nan"), "n": 0.0}
        y = np.clip(np.asarray(targets, dtype=float), 0.0, 1.0)
        sw = (
            np.ones(n)
            if weights is None
            else _WEIGHTING[self.weighting](np.asarray(weights, float))
        )
        sw = sw / max(sw.mean(), 1e-12)
        rows = self._rows(states)
        loss_before = _bce(self._logits(rows), y, sw)
        for _ in range(self.epochs):
            order = self.rng.permutation(n)
            for start in range(0, n, self.batch_size):
                batch = order[start : start + self.batch_size]
                self._step([rows[i] for i in batch], y[batch], sw[batch])
        self.updates += 1
        return {"loss": loss_before, "loss_after": _bce(self._logits(rows), y, sw), "n": float(n)}

    def state_dict(self) -> dict[str, Any]:
        """Weights, AdaGrad accumulators, the shuffling generator's state and the update count."""
        return {
            "w": self.w.copy(),
            "g2": self.g2.copy(),
            "rng": self.rng.bit_generator.state,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if np.shape(state["w"]) != (self.dim,):
            raise ConfigError(
                f"features state has {np.shape(state['w'])[0]} weights but this predictor has dim={self.dim}; "
                "build it with the options the state was saved with"
            )
        self.w, self.g2 = np.array(state["w"], dtype=float), np.array(state["g2"], dtype=float)
        self.rng.bit_generator.state = state["rng"]
        self.updates = int(state["updates"])

    def _step(self, rows, y: np.ndarray, sw: np.ndarray) -> None:
        p = 1.0 / (1.0 + np.exp(-self._logits(rows)))
        resid = (p - y) * sw / len(rows)  # d loss / d logit, per row
        idx = np.concatenate([i for i, _ in rows])
        val = np.concatenate([v * r for (_, v), r in zip(rows, resid, strict=True)])
        u, inv = np.unique(idx, return_inverse=True)
        g = np.bincount(inv, weights=val, minlength=u.size) + self.l2 * self.w[u]
        self.g2[u] += g * g
        self.w[u] -= self.lr * g / np.sqrt(self.g2[u])


#: how leaf-count weights become sample weights ("leaves" trusts well-supported targets
#: most; it beat "sqrt" and "none" on held-out simulator trees, prefixes included)
_WEIGHTING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "leaves": lambda w: w,
    "sqrt": np.sqrt,
    "none": np.ones_like,
}


def _bce(logits: np.ndarray, y: np.ndarray, sw: np.ndarray) -> float:
    # log(1 + e^z) - y z, computed stably
    return float(np.mean(sw * (np.logaddexp(0.0, logits) - y * logits)))
