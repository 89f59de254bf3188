"""`clue`: a Bayesian logistic model of the clue-to-success map, refit on every label so far.

The predictor of docs/alloc.md ("The cold start and the `clue` predictor"), built to
learn within the first few steps on prompts it has never seen. Three choices make it
fast where `features` (online AdaGrad on one pass of a 6%-prefix batch) is slow:

- **every outcome is a label**: the runner hands it every root and every inner prefix
  of every finished tree (``label_all = True``, `trace_gym.predict.training.every_label`),
  each a binomial observation (its success rate over its leaves, weighted by the leaf
  count; prefix labels by ``prefix_weight`` x that, since they re-count their root's
  leaves). The prompt's words are features of every prefix too, so prefix outcomes
  teach the prompt-level map as well;
- **refit, not a step**: the MAP of an L2-regularised (Gaussian-prior) logistic model
  over all labels kept so far is found by a few Newton steps (conjugate gradient on
  Hessian-vector products, numpy only), warm-started; so a label counts fully the step
  it arrives, whatever a learning rate would have allowed;
- **generic features**: binary word uni- and bigrams of the prompt and of the last turn,
  unigrams of the earlier history, every "word a/b" fraction (in the prompt and the last
  observation) as its smoothed log-odds keyed by the word, a depth bucket and a bias.
  The same code for every env; tokens that look like nonces are dropped
  (`trace_gym.predict.features`). The state's ``prompt_id`` is never read.

Uncertainty: a Laplace approximation with the diagonal of the Hessian at the MAP gives
each logit a Gaussian N(mu, s^2), s^2 = sum_j x_j^2 / H_jj over the features seen in
training (a feature never seen carries no evidence either way and adds nothing).
`predict` returns E[sigmoid(logit)] and `concentration` the a + b of the Beta with the
same mean and variance (Gauss-Hermite quadrature), so the belief widens only where the
features are thinly observed. Drift: every update multiplies the weights of the labels
already held by ``decay`` (1: no forgetting); ``max_labels`` drops the oldest beyond it.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.predict.base import State
from trace_gym.predict.features import FRACTION, ngrams

__all__ = ["CluePredictor", "clue_features"]

#: namespaces of `clue_features`, in the order of their prior variances
NAMESPACES = ("prompt", "last", "history", "fraction", "bias")

_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(24)
_GH_W = _GH_W / _GH_W.sum()


#: hashed index -> (value, namespace code) of one part of a state
_Part = dict[int, tuple[float, int]]
_MEMO: dict[str, int] = {}


def _hashes(ns: str, grams: Sequence[str], dim: int) -> list[int]:
    """crc32 hashes of "ns|gram" mod `dim` (memoised: the vocabulary repeats)."""
    if len(_MEMO) > 1_000_000:
        _MEMO.clear()
    out = []
    for g in grams:
        key = f"{ns}|{g}|{dim}"
        h = _MEMO.get(key)
        if h is None:
            h = _MEMO[key] = zlib.crc32(f"{ns}|{g}".encode()) % dim
        out.append(h)
    return out


def _fractions(text: str, ns: str, dim: int) -> _Part:
    """Every "word a/b" as its smoothed log-odds log((a + 0.5) / (b - a + 0.5)), keyed by the word."""
    out: _Part = {}
    for w, a, b in FRACTION.findall(text):
        a, b = int(a), int(b)
        if b > 0:
            a = min(a, b)
            h = _hashes(ns, [w.lower()], dim)[0]
            out[h] = (out.get(h, (0.0, 3))[0] + math.log((a + 0.5) / (b - a + 0.5)), 3)
    return out


@functools.lru_cache(maxsize=65536)
def _prompt_part(prompt: str, dim: int, ngram: int) -> _Part:
    words = {h: (1.0, 0) for h in _hashes("cp", ngrams(prompt, ngram), dim)}
    return {**words, **_fractions(prompt, "cpf", dim)}


@functools.lru_cache(maxsize=262144)
def _turn_part(action: str, obs: str, dim: int, ngram: int) -> tuple[frozenset[int], _Part]:
    """(history unigram hashes, last-turn features: uni+bigrams and fractions) of one turn."""
    text = f"{action} {obs}"
    last = {h: (1.0, 1) for h in _hashes("cl", ngrams(text, ngram), dim)}
    hist = frozenset(_hashes("ch", ngrams(text, 1), dim))
    return hist, {**last, **_fractions(obs, "clf", dim)}


@functools.lru_cache(maxsize=64)
def _extras(depth: int, dim: int) -> _Part:
    bucket = depth if depth < 4 else 4 + int(np.log2(depth / 4 + 1) * 2)
    keys = (b"clue|bias", f"clue|depth|{bucket}".encode())
    return {zlib.crc32(k) % dim: (1.0, 4) for k in keys}


@functools.lru_cache(maxsize=65536)
def clue_features(
    state: State, dim: int = 1 << 20, ngram: int = 2, max_turns: int = 64
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hashed indices, values, namespace codes) of one state; indices unique (cached).

    Namespace codes index `NAMESPACES`; on a hash collision the later part wins. Reads
    the prompt text and the turns, never the prompt id.
    """
    feats: _Part = {}
    recent = state.turns[-max_turns:] if max_turns > 0 else ()
    hashed = [_turn_part(a, o, dim, ngram) for a, o in recent]
    for h in frozenset().union(*[h for h, _ in hashed[:-1]]):
        feats[h] = (1.0, 2)
    feats.update(_prompt_part(state.prompt, dim, ngram))
    if hashed:
        feats.update(hashed[-1][1])
    feats.update(_extras(min(len(state.turns), 63), dim))
    idx = np.fromiter(feats.keys(), dtype=np.int64, count=len(feats))
    val = np.fromiter((v for v, _ in feats.values()), dtype=float, count=len(feats))
    ns = np.fromiter((c for _, c in feats.values()), dtype=np.int64, count=len(feats))
    return idx, val, ns


class CluePredictor:
    """Bayesian logistic regression on generic text features, refit on all labels so far.

    Args:
        prior_var: prior variance of a weight, per namespace (prompt, last turn,
            history, fraction, bias/depth) - one float for all, or five. The prompt's
            is small (0.2) because tokens unique to one prompt (ids) would otherwise
            absorb its outcome as a per-prompt effect, and the shared clue words would
            learn little from the 16 prompts of the cold-start step (chosen on the
            step-0 -> step-1 predictions of math seeds 0-2: ECE 0.11 -> 0.05).
        prefix_weight: a prefix label's weight relative to its leaf count.
        decay: per-update factor on the weights of the labels already held (drift).
        newton: Newton steps per update. cg: conjugate-gradient steps per Newton step.
        max_labels: most labels kept (the oldest go first; None: all).
        dim: hash space. ngram: longest word n-gram. max_turns: history turns read.
        moderate: `predict` returns the posterior mean of P(success) (True) or the
            MAP's sigmoid (False).
    """

    name: ClassVar[str] = "clue"
    #: the runner trains it on every root and inner prefix (`every_label`), not a sample
    label_all: ClassVar[bool] = True

    def __init__(
        self,
        prior_var: float | Sequence[float] = (0.2, 1.0, 0.25, 2.0, 4.0),
        prefix_weight: float = 0.5,
        decay: float = 1.0,
        newton: int = 4,
        cg: int = 25,
        max_labels: int | None = None,
        dim: int = 1 << 20,
        ngram: int = 2,
        max_turns: int = 64,
        moderate: bool = True,
    ):
        pv = np.broadcast_to(np.asarray(prior_var, dtype=float), (len(NAMESPACES),)).copy()
        if np.any(pv <= 0) or prefix_weight < 0 or not 0.0 < decay <= 1.0:
            raise ConfigError(
                "clue predictor needs prior_var > 0, prefix_weight >= 0, 0 < decay <= 1"
            )
        if (
            newton < 1
            or cg < 1
            or dim < 16
            or ngram < 1
            or (max_labels is not None and max_labels < 1)
        ):
            raise ConfigError(
                "clue predictor needs newton >= 1, cg >= 1, dim >= 16, ngram >= 1, max_labels >= 1"
            )
        self.prior_var, self.prefix_weight, self.decay = pv, float(prefix_weight), float(decay)
        self.newton, self.cg, self.max_labels = int(newton), int(cg), max_labels
        self.dim, self.ngram, self.max_turns = int(dim), int(ngram), int(max_turns)
        self.moderate = bool(moderate)
        self._reset()

    def _reset(self) -> None:
        #: hashed index -> column (-1: never seen in training)
        self._col = np.full(self.dim, -1, dtype=np.int64)
        self._prec = np.zeros(0)  # prior precision per column
        self.w = np.zeros(0)  # MAP weights per column
        self._hdiag = np.zeros(0)  # Hessian diagonal at the MAP
        self._rows: list[tuple[np.ndarray, np.ndarray]] = []  # (columns, values) per label
        self._y = np.zeros(0)
        self._n = np.zeros(0)  # label weights (leaf counts, decayed)
        self.updates = 0

    # ------------------------------------------------------------------ protocol
    @property
    def has_data(self) -> bool:
        return bool(self._n.size) and float(self._n.sum()) > 0

    def _logit_moments(self, states: Sequence[State]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of each state's logit under the Laplace posterior.

        A feature seen in training contributes x^2 / H_jj, one never seen its prior
        variance x^2 sigma^2 (so a new word widens the belief; its mean weight is 0).
        """
        var_w = 1.0 / self._hdiag if self._hdiag.size else self._hdiag
        mu, s2 = np.zeros(len(states)), np.zeros(len(states))
        for i, st in enumerate(states):
            idx, val, ns = clue_features(st, self.dim, self.ngram, self.max_turns)
            col = self._col[idx]
            seen = col >= 0
            c, v = col[seen], val[seen]
            mu[i] = self.w[c] @ v
            s2[i] = var_w[c] @ (v * v) + self.prior_var[ns[~seen]] @ (val[~seen] ** 2)
        return mu, s2

    def _beta_moments(self, states: Sequence[State]) -> tuple[np.ndarray, np.ndarray]:
        mu, s2 = self._logit_moments(states)
        z = mu[:, None] + np.sqrt(s2)[:, None] * _GH_X[None, :]
        p = 1.0 / (1.0 + np.exp(-z))
        mean = p @ _GH_W
        var = np.maximum((p * p) @ _GH_W - mean * mean, 1e-12)
        return mean, var

    def predict(self, states: Sequence[State]) -> np.ndarray:
        """E[P(success)] under the Laplace posterior of the logit (``moderate=False``: the
        MAP's sigmoid(mu))."""
        if not states:
            return np.zeros(0)
        if self.moderate:
            v = self._beta_moments(states)[0]
        else:
            v = 1.0 / (1.0 + np.exp(-self._logit_moments(states)[0]))
        return np.clip(v, 1e-6, 1.0 - 1e-6)

    def concentration(self, states: Sequence[State]) -> np.ndarray:
        """a + b of the Beta with the posterior's mean and variance of P(success)."""
        if not states:
            return np.zeros(0)
        mean, var = self._beta_moments(states)
        return np.clip(mean * (1.0 - mean) / var - 1.0, 1e-3, 1e9)

    def update(
        self, states: Sequence[State], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        """Add the labels (decaying the ones held), then refit the MAP by Newton-CG."""
        y = np.clip(np.asarray(targets, dtype=float), 0.0, 1.0)
        n = np.ones(len(states)) if weights is None else np.asarray(weights, dtype=float)
        if y.size != len(states) or n.size != len(states):
            raise ConfigError("update needs one target and one weight per state")
        n = n * np.array([1.0 if s.depth == 0 else self.prefix_weight for s in states])
        self._n = self._n * self.decay
        self._add(states, y, n)
        loss = self._fit()
        self.updates += 1
        return {
            "loss": loss,
            "n": float(len(states)),
            "labels": float(self._y.size),
            "features": float(self.w.size),
        }

    # ------------------------------------------------------------------ fitting
    def _add(self, states: Sequence[State], y: np.ndarray, n: np.ndarray) -> None:
        for s in states:
            idx, val, ns = clue_features(s, self.dim, self.ngram, self.max_turns)
            new = self._col[idx] < 0
            if new.any():
                self._col[idx[new]] = np.arange(self.w.size, self.w.size + int(new.sum()))
                self._prec = np.concatenate([self._prec, 1.0 / self.prior_var[ns[new]]])
                self.w = np.concatenate([self.w, np.zeros(int(new.sum()))])
            self._rows.append((self._col[idx], val))
        self._y, self._n = np.concatenate([self._y, y]), np.concatenate([self._n, n])
        if self.max_labels is not None and self._y.size > self.max_labels:
            drop = self._y.size - self.max_labels
            self._rows, self._y, self._n = self._rows[drop:], self._y[drop:], self._n[drop:]

    def _design(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        row = np.concatenate([np.full(c.size, i) for i, (c, _) in enumerate(self._rows)])
        col = np.concatenate([c for c, _ in self._rows])
        val = np.concatenate([v for _, v in self._rows])
        return row, col, val

    def _fit(self) -> float:
        row, col, val = self._design()
        nl, d = self._y.size, self.w.size
        xv = lambda v: np.bincount(row, weights=val * v[col], minlength=nl)  # noqa: E731
        xtv = lambda r: np.bincount(col, weights=val * r[row], minlength=d)  # noqa: E731

        def loss(w: np.ndarray) -> float:
            z = xv(w)
            return float(
                self._n @ (np.logaddexp(0.0, z) - self._y * z) + 0.5 * self._prec @ (w * w)
            )

        w = self.w
        for _ in range(self.newton):
            z = xv(w)
            p = 1.0 / (1.0 + np.exp(-z))
            g = xtv(self._n * (p - self._y)) + self._prec * w
            curv = self._n * p * (1.0 - p)
            hdiag = np.bincount(col, weights=val * val * curv[row], minlength=d) + self._prec
            step = _pcg(lambda v, c=curv: xtv(c * xv(v)) + self._prec * v, g, hdiag, self.cg)
            if -float(g @ step) < 1e-7 * float(self._n.sum()):  # converged: nothing to gain
                break
            w = _backtrack(loss, w, step, float(g @ step))
        self.w = w
        p = 1.0 / (1.0 + np.exp(-xv(w)))
        self._hdiag = (
            np.bincount(col, weights=val * val * (self._n * p * (1 - p))[row], minlength=d)
            + self._prec
        )
        return loss(w) / max(float(self._n.sum()), 1e-12)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The vocabulary, the labels held and the fitted weights (copies)."""
        seen = np.flatnonzero(self._col >= 0)
        return {
            "hashes": seen,
            "columns": self._col[seen],
            "prec": self._prec.copy(),
            "w": self.w.copy(),
            "hdiag": self._hdiag.copy(),
            "rows": [(c.copy(), v.copy()) for c, v in self._rows],
            "y": self._y.copy(),
            "n": self._n.copy(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if np.size(state["hashes"]) and int(np.max(state["hashes"])) >= self.dim:
            raise ConfigError(
                "clue state was saved with a larger dim; build it with the options it was saved with"
            )
        self._reset()
        self._col[np.asarray(state["hashes"], dtype=np.int64)] = np.asarray(
            state["columns"], dtype=np.int64
        )
        self._prec, self.w, self._hdiag = (
            np.array(state[k], dtype=float) for k in ("prec", "w", "hdiag")
        )
        self._rows = [(np.array(c), np.array(v)) for c, v in state["rows"]]
        self._y, self._n = np.array(state["y"], dtype=float), np.array(state["n"], dtype=float)
        self.updates = int(state["updates"])


def _pcg(matvec, g: np.ndarray, diag: np.ndarray, steps: int) -> np.ndarray:
    """Approximately solve H x = -g by Jacobi-preconditioned conjugate gradient."""
    x = np.zeros_like(g)
    r = -g.copy()
    zr = r / diag
    p = zr.copy()
    rz = float(r @ zr)
    tol = 1e-10 * max(float(g @ g), 1e-30)
    for _ in range(steps):
        hp = matvec(p)
        alpha = rz / max(float(p @ hp), 1e-30)
        x += alpha * p
        r -= alpha * hp
        if float(r @ r) < tol:
            break
        zr = r / diag
        rz, rz_old = float(r @ zr), rz
        p = zr + (rz / rz_old) * p
    return x


def _backtrack(loss, w: np.ndarray, step: np.ndarray, slope: float) -> np.ndarray:
    """Largest of 1, 1/2, 1/4, ... times `step` that decreases `loss` (Armijo)."""
    base = loss(w)
    t = 1.0
    for _ in range(20):
        cand = w + t * step
        if loss(cand) <= base + 1e-4 * t * slope:
            return cand
        t *= 0.5
    return w
