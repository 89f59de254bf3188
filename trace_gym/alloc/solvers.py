"""Exact solvers for TRACE's two allocation problems (pure numpy, no state).

Root problem (docs/alloc.md "The solvers"): given success probabilities
v_1..v_P, a budget B and a cap m_max, choose m_i in {0} U {2..m_max} with
sum m_i = B maximising sum f(v_i, m_i), where

    f(v, m) = 1 - v^m - (1 - v)^m   for m >= 2,      f(v, 0) = 0.

(The literal formula gives -1 at m = 0; a skipped prompt contributes nothing.)

- `solve_roots_reference`: the textbook DP, O(P * B * m_max), vectorised over the
  budget axis. Slow but obviously right; the tests and the benchmark check the fast
  solver against it.
- `solve_roots`: the fast exact solver. Let h_i be the concave extension of f_i that
  also allows m = 1 with h(1) = v(1 - v): its increments per unit of budget are
  d_1 = d_2 = d_3 = v(1 - v) >= d_4 >= d_5 >= ... . Maximising sum h_i is solved by
  taking the B largest increments ("the relaxation"). With ties broken by
  (value, prompt, step) a prompt's three equal first increments are adjacent in that
  order, so at most one prompt -- call it p -- ends at the forbidden m = 1. If none
  does, the relaxation is feasible and therefore optimal. Otherwise let g be the
  relaxation for B - 1 (= the greedy solution without p's unit; it is feasible). An
  exchange argument (docs/alloc.md, "Why the fast root solver is exact") shows that an
  optimum for B differs from g by one of two moves:

    1. one more unit on a prompt that g already opened;
    2. open an unopened prompt at 2 and take one unit back from a prompt at >= 3;

  (the argument's third pattern, "close a prompt at 2 and open another at 3", never
  beats move 1 on the prompt it would close). Each move's best instance is an
  argmax/argmin over prompts, so the repair is O(P).
  Total cost: one `np.partition` over P * m_max increments plus O(P * m_max) numpy.

Prefix problem (the same section): a prompt's continuation budget K is split over its
visited prefixes, maximising sum (1 - q_j^{k_j}) with q = r V + (1 - r)(1 - V), the
chance that one replay repeats the known outcome r. Gains q^(k-1)(1 - q) shrink with
k, so a max-heap greedy is exact for equal replay costs; `costs=` switches to an
exact knapsack DP over integerised costs (`resolution` units per unit of cost, costs
rounded *up* so the plan never overspends).

Values at exactly 0 or 1 are legal: every solver clips them to
[`VALUE_EPS`, 1 - `VALUE_EPS`] first (`clip_values`), so a prompt the predictor is
sure about still has a tiny positive gain, never outranks an uncertain one, and ties
among sure prompts fall to the lower index. Returned objectives are computed on the
clipped values.
"""

from __future__ import annotations

import heapq
import math
import numbers
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trace_gym.errors import AllocationError

__all__ = [
    "MAX_CAPPED_CELLS",
    "MAX_KNAPSACK_CELLS",
    "OBJECTIVES",
    "VALUE_EPS",
    "PrefixSolution",
    "RootSolution",
    "check_root_budget",
    "beta_moments",
    "check_concentrations",
    "clip_values",
    "greedy_counts",
    "posterior_prefix_value",
    "posterior_root_value",
    "prefix_value",
    "repair_counts",
    "root_increments",
    "root_value",
    "solve_prefixes",
    "solve_roots",
    "solve_roots_costed",
    "solve_roots_costed_reference",
    "solve_roots_reference",
    "split_budget",
    "split_costed_budget",
    "whole_number",
]

#: values are clipped into [VALUE_EPS, 1 - VALUE_EPS] before solving
VALUE_EPS = 1e-6

#: root/prefix objectives: the plug-in value of the gain at the predicted v, or its
#: expectation under each record's Beta belief (docs/alloc.md, "The posterior objective")
OBJECTIVES = ("plugin", "posterior")

#: largest (prompts x max_prompts x budget) table the capped root DP builds
MAX_CAPPED_CELLS = 50_000_000


class RootSolution(NamedTuple):
    """Rollouts per prompt (int64, each 0 or in [2, m_max]) and sum f(v_i, m_i)."""

    counts: np.ndarray
    objective: float


class PrefixSolution(NamedTuple):
    """Replays per prefix (int64) and sum (1 - q_j^k_j)."""

    counts: np.ndarray
    objective: float


class PrefixBatch(NamedTuple):
    """`solve_prefixes_batch`'s answer: every prompt's replays per prefix, one flat array.

    Prompt g's counts are ``counts[bounds[g]:bounds[g + 1]]`` and its objective
    ``objectives[g]``; `split()` gives them as one `PrefixSolution` per prompt.
    """

    counts: np.ndarray
    objectives: np.ndarray
    bounds: np.ndarray

    def per_prompt(self) -> list[np.ndarray]:
        """Each prompt's counts, in order: views of `counts` (plain slices: `np.split` costs
        a Python-level step per piece, 0.2 s for 30k prompts)."""
        b = self.bounds.tolist()
        return [self.counts[lo:hi] for lo, hi in zip(b[:-1], b[1:], strict=True)]

    def split(self) -> list[PrefixSolution]:
        """One `PrefixSolution` per prompt, in order."""
        return [
            PrefixSolution(c, o)
            for c, o in zip(self.per_prompt(), self.objectives.tolist(), strict=True)
        ]


# ----------------------------------------------------------------------------- checks
def _as_values(values, what: str = "values") -> np.ndarray:
    try:
        v = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as e:
        raise AllocationError(f"{what} must be numbers in [0, 1]; got {values!r:.80}") from e
    if v.ndim != 1:
        raise AllocationError(
            f"{what} must be a flat sequence (one per candidate); got shape {v.shape}"
        )
    if v.size == 0:
        raise AllocationError(
            f"{what} is empty: there is nothing to allocate to; pass at least one candidate"
        )
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise AllocationError(
            f"{what} contain NaN/inf at positions {bad[:5].tolist()}; check the predictor's output "
            "(a predictor must return probabilities in [0, 1])"
        )
    bad = np.flatnonzero((v < 0) | (v > 1))
    if bad.size:
        raise AllocationError(
            f"{what} must lie in [0, 1]; positions {bad[:5].tolist()} hold {v[bad[:5]].tolist()} "
            "(pass probabilities, not logits or rewards)"
        )
    return v


def clip_values(values) -> np.ndarray:
    """Validate probabilities and clip them into [VALUE_EPS, 1 - VALUE_EPS]."""
    return np.clip(_as_values(values), VALUE_EPS, 1.0 - VALUE_EPS)


def _root_problem(values, budget, m_max: int, exact_budget: bool) -> tuple[np.ndarray, int, int]:
    """Validated (clipped values, budget, m_max) shared by both root solvers."""
    v = clip_values(values)
    budget = whole_number(budget, "root budget")
    m_max = _check_m_max(m_max)
    if exact_budget:
        check_root_budget(v.size, budget, m_max)
    else:
        budget = min(budget, v.size * m_max)
    return v, budget, m_max


def whole_number(x, what: str) -> int:
    """`x` as a non-negative int (an integral float is fine); `AllocationError` naming `what` else."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        if isinstance(x, numbers.Real) and float(x).is_integer():
            x = int(float(x))
        else:
            raise AllocationError(f"{what} must be a whole number; got {x!r}")
    x = int(x)
    if x < 0:
        raise AllocationError(f"{what} must be >= 0; got {x}")
    return x


def _check_m_max(m_max) -> int:
    m_max = whole_number(m_max, "m_max")
    if m_max < 2:
        raise AllocationError(
            f"m_max must be >= 2 (a kept prompt needs at least 2 rollouts); got {m_max}"
        )
    return m_max


def check_root_budget(num_candidates: int, budget: int, m_max: int) -> None:
    """Raise `AllocationError` unless some m in {0, 2..m_max}^P sums exactly to `budget`."""
    if budget == 1:
        raise AllocationError(
            "a root budget of 1 is infeasible: a kept prompt needs at least 2 rollouts; "
            "use a budget of 0 or >= 2 (or exact_budget=False)"
        )
    if budget > num_candidates * m_max:
        raise AllocationError(
            f"root budget {budget} exceeds {num_candidates} candidates x m_max {m_max} = "
            f"{num_candidates * m_max}; offer more candidates, raise m_max, or pass exact_budget=False"
        )
    if m_max == 2 and budget % 2:
        raise AllocationError(
            f"with m_max = 2 every kept prompt takes exactly 2 rollouts, so the odd budget {budget} "
            "is infeasible; use an even budget, m_max >= 3, or exact_budget=False"
        )


# ----------------------------------------------------------------------------- values
def root_value(v, m) -> np.ndarray:
    """Chance that m rollouts of a prompt with success probability v are mixed; f(v, 0) = 0."""
    v = np.asarray(v, dtype=float)
    m = np.asarray(m)
    out = 1.0 - v**m - (1.0 - v) ** m
    return np.where(m == 0, 0.0, out)


def prefix_value(q, k) -> np.ndarray:
    """Chance that at least one of k replays flips an outcome that one replay repeats w.p. q."""
    return 1.0 - np.asarray(q, dtype=float) ** np.asarray(k)


def root_increments(v: np.ndarray, m_max: int) -> np.ndarray:
    """(P, m_max) per-unit gains of the concave extension h: column s-1 holds h(s) - h(s-1)."""
    u = 1.0 - v
    a = v * u
    inc = np.empty((v.size, m_max))
    inc[:, : min(3, m_max)] = a[:, None]
    if m_max > 3:
        # step s >= 3 gains a (v^(s-2) + u^(s-2)); columns 3.. are steps 4.. (powers 2..)
        vp = np.cumprod(np.broadcast_to(v[:, None], (v.size, m_max - 2)), axis=1)[:, 1:]
        up = np.cumprod(np.broadcast_to(u[:, None], (u.size, m_max - 2)), axis=1)[:, 1:]
        inc[:, 3:] = a[:, None] * (vp + up)
        # rounding can make a later gain exceed an earlier one by an ulp; keep h concave
        np.minimum.accumulate(inc, axis=1, out=inc)
    return inc


# ----------------------------------------------------------------------------- posterior
def check_concentrations(concentrations, n: int) -> np.ndarray | None:
    """a + b of each record's Beta belief as floats (None -> inf); None when all are point values.

    Raises `AllocationError` unless there is one per record and each is > 0 (inf allowed).
    """
    if concentrations is None:
        return None
    if isinstance(concentrations, np.ndarray) and concentrations.dtype.kind == "f":
        c = concentrations.astype(float, copy=False).ravel()  # columns: inf for None already
    else:
        raw = list(concentrations)
        try:
            c = np.array([math.inf if x is None else float(x) for x in raw], dtype=float)
        except (TypeError, ValueError) as e:
            raise AllocationError(
                f"concentrations must be numbers > 0 or None; got {raw!r:.80}"
            ) from e
    if c.size != n:
        raise AllocationError(f"need one concentration per record: {c.size} for {n} values")
    if np.any(np.isnan(c)) or np.any(c <= 0):
        raise AllocationError(
            "concentrations (a + b of a Beta belief) must be > 0, inf or None (a point value); "
            f"got {c[np.isnan(c) | (c <= 0)][:5].tolist()}"
        )
    return None if np.all(np.isinf(c)) else c


def beta_moments(mean: np.ndarray, conc: np.ndarray, kmax: int) -> np.ndarray:
    """(P, kmax + 1) E[v^k], k = 0..kmax, for v ~ Beta(mean c, (1 - mean) c).

    E[v^k] = prod_{i<k} (a + i) / (a + b + i); rows with c = inf are mean^k exactly.
    """
    mean, conc = np.asarray(mean, dtype=float), np.asarray(conc, dtype=float)
    out = np.ones((mean.size, kmax + 1))
    if kmax == 0:
        return out
    finite = np.isfinite(conc)
    i = np.arange(kmax, dtype=float)[None, :]
    c = np.where(finite, conc, 1.0)[:, None]
    ratio = np.where(finite[:, None], (mean[:, None] * c + i) / (c + i), mean[:, None])
    out[:, 1:] = np.cumprod(ratio, axis=1)
    return out


def posterior_root_value(v, conc, m) -> np.ndarray:
    """E[1 - v^m - (1 - v)^m] under each prompt's Beta(v c, (1 - v) c); 0 at m = 0.

    `conc` = inf gives `root_value` exactly.
    """
    v, c, m = np.broadcast_arrays(np.asarray(v, float), np.asarray(conc, float), np.asarray(m))
    vf, cf, mf = v.ravel(), c.ravel(), m.ravel().astype(np.int64)
    kmax = int(mf.max()) if mf.size else 0
    rows = np.arange(vf.size)
    ev, eu = beta_moments(vf, cf, kmax), beta_moments(1.0 - vf, cf, kmax)
    post = np.where(mf == 0, 0.0, 1.0 - ev[rows, mf] - eu[rows, mf])
    out = np.where(np.isfinite(cf), post, root_value(vf, mf))
    return out.reshape(v.shape)


def _posterior_increments(v: np.ndarray, conc: np.ndarray, m_max: int) -> np.ndarray:
    """(P, m_max) per-unit gains of the posterior objective's concave extension.

    With A = E[v (1 - v)] the extension sets h(1) = A, so d_1 = d_2 = d_3 = A exactly
    (f(2) = 2A, f(3) - f(2) = E[v (1 - v)(v + 1 - v)] = A), and for s >= 2
    d_s = E[v (1 - v)(v^(s-2) + (1 - v)^(s-2))]: non-increasing in s because the bracket
    is, pointwise in v. The shape `solve_roots`' exactness argument needs (three equal
    first gains, then concave) is therefore the plug-in one, and the same greedy + repair
    is exact. Rows with c = inf are the plug-in `root_increments` bit for bit.
    """
    inc = root_increments(v, m_max)
    finite = np.isfinite(conc)
    if not finite.any():
        return inc
    vf, c = v[finite], conc[finite]
    a_, b_ = vf * c, (1.0 - vf) * c
    first = a_ * b_ / (c * (c + 1.0))  # E[v (1 - v)]
    post = np.empty((vf.size, m_max))
    post[:, : min(3, m_max)] = first[:, None]
    if m_max > 3:
        ev, eu = beta_moments(vf, c, m_max - 1), beta_moments(1.0 - vf, c, m_max - 1)
        s1 = np.arange(3, m_max, dtype=float)[None, :]  # s - 1 for steps s = 4..m_max
        cols = np.arange(3, m_max)
        post[:, 3:] = (b_[:, None] * ev[:, cols] + a_[:, None] * eu[:, cols]) / (c[:, None] + s1)
        np.minimum.accumulate(post, axis=1, out=post)
    inc[finite] = post
    return inc


def _root_objective(v: np.ndarray, conc: np.ndarray | None, counts: np.ndarray) -> float:
    if conc is None:
        return float(root_value(v, counts).sum())
    return float(posterior_root_value(v, conc, counts).sum())


def greedy_counts(inc: np.ndarray, budget: int) -> np.ndarray:
    """Counts of the relaxation: the `budget` largest increments, ties to lower (prompt, step)."""
    flat = inc.ravel()
    n = flat.size
    if budget <= 0:
        return np.zeros(inc.shape[0], dtype=np.int64)
    if budget >= n:
        return np.full(inc.shape[0], inc.shape[1], dtype=np.int64)
    kth = np.partition(flat, n - budget)[n - budget]  # the budget-th largest gain
    take = flat > kth
    need = budget - int(np.count_nonzero(take))
    take[np.flatnonzero(flat == kth)[:need]] = True
    return take.reshape(inc.shape).sum(axis=1, dtype=np.int64)


def repair_counts(inc: np.ndarray, g: np.ndarray, m_max: int) -> tuple[np.ndarray, float] | None:
    """Best of the two moves that turn the feasible B-1 relaxation `g` into a B solution.

    Returns (counts, gain over g), or None when neither move is feasible.
    """
    rows = np.arange(g.size)
    best: tuple[float, int, int, int] | None = None  # (gain, move, i, j)

    opened_below_cap = (g >= 2) & (g < m_max)
    if opened_below_cap.any():  # move 1: one more unit on an opened prompt
        gains = np.where(opened_below_cap, inc[rows, np.minimum(g, m_max - 1)], -np.inf)
        i = int(np.argmax(gains))
        best = (float(gains[i]), 1, i, -1)

    closed, above_two = g == 0, g >= 3
    if (
        closed.any() and above_two.any()
    ):  # move 2: open at 2, take a unit back from a prompt at >= 3
        i = int(np.argmax(np.where(closed, inc[:, 0], -np.inf)))
        loss = np.where(above_two, inc[rows, np.maximum(g - 1, 0)], np.inf)
        j = int(np.argmin(loss))
        gain2 = 2 * inc[i, 0] - loss[j]
        if best is None or gain2 > best[0]:
            best = (float(gain2), 2, i, j)

    if best is None:
        return None
    gain, move, i, j = best
    out = g.copy()
    if move == 1:
        out[i] += 1
    else:
        out[i], out[j] = 2, out[j] - 1
    return out, gain


def solve_roots(
    values: Sequence[float] | np.ndarray,
    budget: int,
    m_max: int = 16,
    exact_budget: bool = True,
    *,
    concentrations: Sequence[float | None] | np.ndarray | None = None,
    max_prompts: int | None = None,
) -> RootSolution:
    """Fast exact root allocation (see the module docstring for why it is exact).

    `exact_budget=False` allows sum m_i <= budget (then any budget >= 0 is accepted and
    the best total is chosen, preferring to spend more on ties). `concentrations` (a + b
    of each prompt's Beta belief; None or inf: a point value) switch to the posterior
    objective sum E[f(v_i, m_i)], solved by the same method (`_posterior_increments` says
    why it stays exact). `max_prompts` opens at most that many prompts (`_solve_capped`).
    """
    v, budget, m_max = _root_problem(values, budget, m_max, exact_budget)
    conc = check_concentrations(concentrations, v.size)
    if max_prompts is not None:
        return _solve_capped(v, conc, budget, m_max, exact_budget, max_prompts)
    if budget < 2:
        counts = np.zeros(v.size, dtype=np.int64)
        return RootSolution(counts, 0.0)
    inc = root_increments(v, m_max) if conc is None else _posterior_increments(v, conc, m_max)
    counts = greedy_counts(inc, budget)
    partial = np.flatnonzero(counts == 1)
    if partial.size:  # at most one prompt sits at the forbidden m = 1
        counts[partial[0]] = 0  # the feasible relaxation for budget - 1
        repaired = repair_counts(inc, counts, m_max)
        if repaired is not None and (exact_budget or repaired[1] >= 0):
            counts = repaired[0]
        elif exact_budget:  # pragma: no cover - excluded by check_root_budget
            raise AllocationError(f"root budget {budget} is infeasible for m_max {m_max}")
    return RootSolution(counts, _root_objective(v, conc, counts))


def _value_table(v: np.ndarray, conc: np.ndarray | None, m_max: int) -> np.ndarray:
    """(P, m_max + 1) objective of m rollouts per prompt; m = 1 is -inf (not allowed)."""
    ms = np.arange(m_max + 1)[None, :]
    if conc is None:
        table = root_value(v[:, None], ms)
    else:
        table = posterior_root_value(v[:, None], conc[:, None], ms)
    table[:, 1] = -np.inf
    return table


def _solve_capped(
    v: np.ndarray,
    conc: np.ndarray | None,
    budget: int,
    m_max: int,
    exact_budget: bool,
    max_prompts: int,
) -> RootSolution:
    """The root problem with at most `max_prompts` prompts opened, exactly.

    An unconstrained optimum that opens few enough prompts is optimal here too. Under
    the plug-in objective f(v, m) is, for every m, increasing in v (1 - v), so the top
    `max_prompts` prompts by v (1 - v) dominate every other prompt at every m: some
    optimum uses only them (swap any other opened prompt for an unused top one), and
    `solve_roots` on that subset is exact. The posterior objective has no such order
    (two Beta beliefs' gains can cross in m): a DP over (prompts opened, budget) solves
    it on the prompts that fewer than `max_prompts` others dominate (`_undominated`),
    ties to the smaller m, prompts in order.
    """
    k = whole_number(max_prompts, "max_prompts")
    if budget > k * m_max:
        if exact_budget:
            raise AllocationError(
                f"root budget {budget} exceeds max_prompts {k} x m_max {m_max} = {k * m_max}; "
                "raise max_prompts or m_max, or pass exact_budget=False"
            )
        budget = k * m_max
    free = solve_roots(v, budget, m_max, exact_budget, concentrations=conc)
    if np.count_nonzero(free.counts) <= k:
        return free
    if conc is None:
        top = np.sort(np.argsort(-(v * (1.0 - v)), kind="stable")[:k])
        sub = solve_roots(v[top], budget, m_max, exact_budget)
    else:
        top = _undominated(_value_table(v, conc, m_max), k)
        sub = _capped_dp(v[top], conc[top], budget, m_max, exact_budget, k)
    counts = np.zeros(v.size, dtype=np.int64)
    counts[top] = sub.counts
    return RootSolution(counts, _root_objective(v, conc, counts))


def _undominated(table: np.ndarray, k: int, max_cells: int = 20_000_000) -> np.ndarray:
    """Prompts not dominated by `k` others (some optimum with <= k opened uses only them).

    Prompt i dominates j when its objective is >= j's at every m (identical rows: the
    lower index dominates). A prompt dominated by k others can be dropped: in a
    solution that opens it, at most k - 1 others are open, so one of its dominators is
    free to take its rollouts for no less. Skipped (all kept) above `max_cells`.
    """
    p = table.shape[0]
    if p <= k or p * p * table.shape[1] > max_cells:
        return np.arange(p)
    t = np.where(np.isfinite(table), table, 0.0)
    geq = np.all(t[:, None, :] >= t[None, :, :], axis=2)  # geq[i, j]: i >= j everywhere
    same = geq & geq.T
    lower = np.arange(p)[:, None] < np.arange(p)[None, :]
    dominates = geq & (~same | lower)
    np.fill_diagonal(dominates, False)
    return np.flatnonzero(dominates.sum(axis=0) < k)


def _capped_dp(
    v: np.ndarray, conc: np.ndarray, budget: int, m_max: int, exact_budget: bool, k: int
) -> RootSolution:
    """dp[j, b] = best objective of the prompts so far opening j of them with budget b."""
    cells = v.size * (k + 1) * (budget + 1)
    if cells > MAX_CAPPED_CELLS:
        raise AllocationError(
            f"the max_prompts DP needs {cells:.3g} cells (limit {MAX_CAPPED_CELLS:.3g}); "
            "offer fewer candidates, lower the budget, or use the plug-in objective"
        )
    table = _value_table(v, conc, m_max)
    dp = np.full((k + 1, budget + 1), -np.inf)
    dp[0, 0] = 0.0
    choice = np.zeros((v.size, k + 1, budget + 1), dtype=np.int16)
    pad = np.full((k + 1, m_max), -np.inf)
    for i in range(v.size):
        # window[j, b, m] = dp[j, b - m]; opening prompt i at m >= 2 moves j -> j + 1
        window = sliding_window_view(np.concatenate([pad, dp], axis=1), m_max + 1, axis=1)
        cand = window[:-1, :, m_max - 2 :: -1] + table[i, 2:]  # (k, budget + 1, m_max - 1): m = 2..
        best = cand.argmax(axis=2)  # first maximum = smallest m
        gain = np.take_along_axis(cand, best[:, :, None], axis=2)[:, :, 0]
        better = gain > dp[1:]  # ties: leave the prompt closed
        new = dp.copy()
        new[1:][better] = gain[better]
        choice[i, 1:][better] = best[better] + 2
        dp = new
    if exact_budget:
        j, b = int(np.argmax(dp[:, budget])), budget
    else:  # the best total, preferring to spend more, then fewer prompts
        flat = dp[:, ::-1].T.ravel()
        b_rev, j = divmod(int(np.argmax(flat)), k + 1)
        b = budget - b_rev
    if not np.isfinite(dp[j, b]):  # pragma: no cover - excluded by the budget checks
        raise AllocationError(f"root budget {b} is infeasible for m_max {m_max}")
    counts = np.zeros(v.size, dtype=np.int64)
    for i in range(v.size - 1, -1, -1):
        counts[i] = m = int(choice[i, j, b])
        b, j = b - m, j - (m > 0)
    return RootSolution(counts, _root_objective(v, conc, counts))


def solve_roots_reference(
    values: Sequence[float],
    budget: int,
    m_max: int = 16,
    exact_budget: bool = True,
    *,
    concentrations: Sequence[float | None] | None = None,
) -> RootSolution:
    """Reference DP over (prompt, budget): dp[b] = best objective of the prompts so far using b.

    Ties go to the smaller m of each prompt, prompts taken in order. O(P * B * m_max).
    `concentrations` as for `solve_roots` (the posterior objective).
    """
    v, budget, m_max = _root_problem(values, budget, m_max, exact_budget)
    conc = check_concentrations(concentrations, v.size)
    P = v.size
    table = _value_table(v, conc, m_max)  # (P, m_max + 1); one rollout is not allowed
    dp = np.full(budget + 1, -np.inf)
    dp[0] = 0.0
    choice = np.zeros((P, budget + 1), dtype=np.int8 if m_max < 128 else np.int32)
    pad = np.full(m_max, -np.inf)
    rows = np.arange(budget + 1)
    for i in range(P):
        # window[b, k] = dp[b + k - m_max]; reversed, column m holds dp[b - m]
        window = sliding_window_view(np.concatenate([pad, dp]), m_max + 1)[:, ::-1]
        cand = window + table[i]  # (budget + 1, m_max + 1)
        best = cand.argmax(axis=1)  # first maximum = smallest m
        dp = cand[rows, best]
        choice[i] = best
    if exact_budget:
        b = budget
    else:
        b = budget - int(np.argmax(dp[::-1]))  # the largest total among the best
    if not np.isfinite(dp[b]):  # pragma: no cover - excluded by check_root_budget
        raise AllocationError(f"root budget {b} is infeasible for m_max {m_max}")
    counts = np.zeros(P, dtype=np.int64)
    for i in range(P - 1, -1, -1):
        counts[i] = choice[i, b]
        b -= counts[i]
    return RootSolution(counts, _root_objective(v, conc, counts))


def _positive_costs(costs, shape: tuple[int, ...]) -> np.ndarray:
    """`costs` as floats, one finite cost > 0 per prompt, or `AllocationError`."""
    try:
        c = np.asarray(costs, dtype=float)
    except (TypeError, ValueError) as e:
        raise AllocationError(f"rollout costs must be positive numbers; got {costs!r:.80}") from e
    if c.shape != shape or not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise AllocationError(
            f"need one finite cost > 0 per prompt: got {c.shape} costs for {shape} prompts"
        )
    return c


def _costed_problem(values, costs, budget, m_max, resolution, concentrations):
    """Checked inputs of the costed root problem: (v, conc, unit costs, budget units, m_max)."""
    v = clip_values(values)
    conc = check_concentrations(concentrations, v.size)
    c = _positive_costs(costs, v.shape)
    m_max = _check_m_max(m_max)
    if not np.isfinite(budget) or budget < 0 or isinstance(resolution, bool) or resolution < 1:
        raise AllocationError(
            f"root budget must be finite and >= 0 (got {budget}) and resolution >= 1"
        )
    units = int(np.floor(budget * resolution + 1e-9))
    w = np.ceil(c * resolution - 1e-9).astype(np.int64)
    return v, conc, w, units, m_max


def solve_roots_costed(
    values: Sequence[float] | np.ndarray,
    costs: Sequence[float] | np.ndarray,
    budget: float,
    m_max: int = 16,
    resolution: int = 8,
    *,
    concentrations: Sequence[float | None] | None = None,
) -> RootSolution:
    """The root problem when prompts' rollouts cost differently (a multi-env mixture).

    Maximise sum f(v_i, m_i) over m_i in {0, 2..m_max} subject to sum c_i m_i <= budget
    (`budget` and the costs in the same unit, e.g. "average rollouts"). Costs are
    integerised as in `solve_roots_costed_reference`: ``resolution`` units per unit of
    cost, each prompt's cost rounded *up* (so the plan never overspends), the budget
    rounded down; the result has that DP's objective (ties may pick other counts).

    Built for few distinct costs (a mixture: one cost per env), near-linear in P
    (docs/alloc.md "Mixtures: the cost-class solver"): prompts of equal cost form a
    class, and within a class the best b rollouts are the flat problem (`solve_roots`'s
    increments, greedy + repair). The class counts come from the concave relaxation's LP
    (a ratio threshold), then an exact DP over every class's counts in a box of radius
    2 w_max + 2 around them (w_max: the largest cost in units after dividing out their
    gcd; the proximity bound of the relaxation's integer optimum), re-centred on its
    solution until it is interior. `concentrations`: the posterior objective, as in
    `solve_roots`.
    """
    v, conc, w, units, m_max = _costed_problem(
        values, costs, budget, m_max, resolution, concentrations
    )
    if units < 2 * int(w.min()):  # not even one prompt at m = 2
        return RootSolution(np.zeros(v.size, dtype=np.int64), 0.0)
    g = int(np.gcd.reduce(w))
    w, units = w // g, units // g
    classes, inv = np.unique(w, return_inverse=True)
    if classes.size == 1:  # one cost: the flat problem, best total <= budget
        return solve_roots(
            v, units // int(classes[0]), m_max, exact_budget=False, concentrations=conc
        )
    order = np.argsort(inv, kind="stable")  # prompts grouped by class, in order inside each
    vs, cs = v[order], None if conc is None else conc[order]
    inc = root_increments(vs, m_max) if cs is None else _posterior_increments(vs, cs, m_max)
    counts = np.empty(v.size, dtype=np.int64)
    counts[order] = _CostClasses(inc, np.bincount(inv), classes, units).solve()
    return RootSolution(counts, _root_objective(v, conc, counts))


class _ClassBand(NamedTuple):
    """One cost class's items around the LP threshold, in greedy order (value desc, index)."""

    top: int  # items ranked above the band (all taken; values are relative to their sum)
    top_counts: np.ndarray  # their count per class prompt
    band: np.ndarray  # local flat item indices of the band (prompt * m_max + step), in order
    band_cum: np.ndarray  # F(top + j) - F(top) for j = 0..len(band)
    first: np.ndarray  # per class prompt: band index of its step-0 item (-1: in the top set)
    top_last: float  # least last-taken gain of a top-set prompt at m >= 3 (inf: none)
    first_sorted: np.ndarray  # `first`, sorted
    below_max: np.ndarray  # running max, in that order, of each prompt's first gain below the band
    size: int  # items in the class (prompts x m_max)


class _CostClasses:
    """The cost-class solver of `solve_roots_costed` (see its docstring and docs/alloc.md).

    `inc` holds the prompts' increments grouped by class (`sizes` prompts each, classes
    in the order of `classes`, their costs in units).
    """

    #: largest box DP (states x counts, summed over classes) before the solver gives up
    MAX_BOX_CELLS = 50_000_000
    #: up to this many items (prompts x m_max) the band is every item (no sample)
    SMALL_ITEMS = 16_384

    def __init__(self, inc: np.ndarray, sizes: np.ndarray, classes: np.ndarray, units: int):
        self.m_max = inc.shape[1]
        self.w = classes.astype(np.int64)
        self.units = units
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        self.inc_k = [inc[bounds[k] : bounds[k + 1]] for k in range(classes.size)]  # views
        #: each class's items (prompt-major: local index = prompt * m_max + step)
        self.flat = [x.reshape(-1) for x in self.inc_k]
        self.starts = np.concatenate([[0], np.cumsum([f.size for f in self.flat])])
        self.radius = 2 * int(self.w.max()) + 2

    # ---------------------------------------------------------------- the LP threshold
    def _bracket(self, spread: int) -> tuple[float, float]:
        """Ratios (hi, lo) around the LP threshold, `spread` sample ranks either side."""
        n = int(self.starts[-1])
        lam_hi, lam_lo = np.inf, -np.inf  # small problems: every item is in the band
        if n <= self.SMALL_ITEMS:
            return lam_hi, lam_lo
        idx = np.random.default_rng(0x7ACE).integers(0, n, 4096)
        k_of = np.searchsorted(self.starts, idx, side="right") - 1
        ratio = np.empty(idx.size)
        for k, f in enumerate(self.flat):
            sel = k_of == k
            ratio[sel] = f[idx[sel] - self.starts[k]] / self.w[k]
        order = np.argsort(-ratio, kind="stable")
        sample, cum = ratio[order], np.cumsum(self.w[k_of][order]) * (n / idx.size)
        at = int(np.searchsorted(cum, self.units))
        if at - spread >= 0:
            lam_hi = float(sample[at - spread])
        if at + spread < sample.size:
            lam_lo = float(sample[at + spread])
        return lam_hi, lam_lo

    def _bands(self, spread: int) -> tuple[list[_ClassBand], np.ndarray] | None:
        """Per-class bands around the LP threshold and the LP's class counts; None: widen.

        Above `SMALL_ITEMS` the threshold is bracketed on a fixed-seed sample of the items'
        ratios (value / cost), `spread` sample ranks either side; one pass over all items then checks the
        bracket (the items above it must fit the budget, the band must reach it) and
        keeps the band, sorted. Only the bracket's width depends on the sample: the
        classes' counts and values are exact.
        """
        lam_hi, lam_lo = self._bracket(spread)
        tops, mines = [], []
        above = within = 0
        for k, f in enumerate(self.flat):
            wk = float(self.w[k])
            t = f > lam_hi * wk
            mine = np.flatnonzero(f >= lam_lo * wk)
            mine = mine[~t[mine]]
            tops.append(t)
            mines.append(mine)
            above += int(self.w[k]) * int(np.count_nonzero(t))
            within += int(self.w[k]) * mine.size
        if (np.isfinite(lam_hi) and above > self.units) or (
            np.isfinite(lam_lo) and above + within < self.units
        ):
            return None
        # the LP: band items by ratio (ties: class, then index) until the budget is spent
        cls = np.repeat(np.arange(self.w.size), [x.size for x in mines])
        loc = np.concatenate(mines)
        key = np.concatenate([self.flat[k][x] / self.w[k] for k, x in enumerate(mines)])
        lp_order = np.lexsort((loc, cls, -key))
        spent = np.cumsum(self.w[cls[lp_order]])
        taken = cls[lp_order[: int(np.searchsorted(spent, self.units - above, side="right"))]]
        lp = np.bincount(taken, minlength=self.w.size).astype(np.int64)
        bands = [self._class_band(k, tops[k], mines[k]) for k in range(self.w.size)]
        lp += np.array([cb.top for cb in bands], dtype=np.int64)
        return bands, lp

    def _class_band(self, k: int, t: np.ndarray, mine: np.ndarray) -> _ClassBand:
        """Class k's band record: `t` marks the items above the band, `mine` the band's."""
        x, f, m = self.inc_k[k], self.flat[k], self.m_max
        mine = mine[np.lexsort((mine, -f[mine]))]  # greedy order inside the class
        top_counts = t.reshape(x.shape).view(np.int8).sum(axis=1, dtype=np.int64)
        first = np.full(x.shape[0], np.iinfo(np.int64).max)
        zero = np.flatnonzero(mine % m == 0)
        opened = np.flatnonzero(top_counts > 0)
        first[mine[zero] // m] = zero
        first[opened] = -1
        deep = top_counts >= 3
        top_last = float(x[deep, top_counts[deep] - 1].min()) if deep.any() else float("inf")
        held = top_counts + np.bincount(mine // m, minlength=x.shape[0])
        rows = np.arange(x.shape[0])
        below = np.where(held < m, x[rows, np.minimum(held, m - 1)], -np.inf)
        by_first = np.concatenate([opened, mine[zero] // m])  # `first` ascending
        return _ClassBand(
            int(np.count_nonzero(t)),
            top_counts,
            mine,
            np.concatenate([[0.0], np.cumsum(f[mine])]),
            first,
            top_last,
            first[by_first],
            np.maximum.accumulate(below[by_first]),
            f.size,
        )

    # ---------------------------------------------------------------- exact class values
    def _counts(self, k: int, cb: _ClassBand, b: int) -> np.ndarray:
        """The greedy (relaxed) counts of class k's best b items."""
        extra = cb.band[: b - cb.top] // self.m_max
        return cb.top_counts + np.bincount(extra, minlength=cb.top_counts.size)

    def _exact(self, k: int, cb: _ClassBand, b: int) -> float:
        """Best value of class k with exactly b rollouts, less the top set's (-inf: infeasible).

        The relaxation's best b items, unless they leave a prompt p at m = 1 (the b-th
        item is p's first). Then, as in `solve_roots`, the best of the b - 1 items plus
        the better repair move (`repair_counts`): one more unit on an opened prompt (the
        first later item whose prompt was opened before p; if none is in the band, the
        best first gain below it of a prompt opened before p), or p at 2 for the last
        item taken from a prompt at >= 3 (the latest earlier item that was a third or
        later gain). All are read off the band.
        """
        j = b - cb.top
        if not self._left_at_one(cb, b):
            return float(cb.band_cum[j])
        base = float(cb.band_cum[j - 1])
        band, m = cb.band, self.m_max
        a = float(self.flat[k][band[j - 1]])
        later = band[j:]
        opened = (later % m >= 1) & (cb.first[later // m] < j - 1)
        if opened.any():
            move1 = float(self.flat[k][later[int(np.argmax(opened))]])
        else:  # every prompt opened before p has its next gain below the band
            i = int(np.searchsorted(cb.first_sorted, j - 1, side="left"))
            move1 = float(cb.below_max[i - 1]) if i else -np.inf
        deep = np.flatnonzero(band[: j - 1] % m >= 2)
        last = float(self.flat[k][band[deep[-1]]]) if deep.size else cb.top_last
        move2 = 2 * a - last if np.isfinite(last) else -np.inf
        gain = max(move1, move2)
        return base + gain if np.isfinite(gain) else -np.inf

    def _left_at_one(self, cb: _ClassBand, b: int) -> bool:
        """Whether the class's best b items leave a prompt at m = 1 (the b-th is a first gain)."""
        return b > 0 and cb.band[b - cb.top - 1] % self.m_max == 0

    def _exact_counts(self, k: int, cb: _ClassBand, b: int) -> np.ndarray:
        """Class k's counts for exactly b rollouts (the value `_exact` gives)."""
        if not self._left_at_one(cb, b):
            return self._counts(k, cb, b)
        fixed = repair_counts(self.inc_k[k], self._counts(k, cb, b - 1), self.m_max)
        assert fixed is not None  # the box only keeps feasible counts
        return fixed[0]

    # ---------------------------------------------------------------- the box DP
    def _bands_from(self, spread: int) -> tuple[list[_ClassBand], np.ndarray, int]:
        """`_bands` at `spread`, widened 4x until its bracket holds; (bands, LP counts, spread)."""
        got = self._bands(spread)
        while got is None:
            spread *= 4
            got = self._bands(spread)
        return got[0], got[1], spread

    def solve(self) -> np.ndarray:
        """Counts per prompt (grouped by class, as `inc`)."""
        spread = 16 + 4 * int(np.sqrt(self.units / self.w.mean() * 4096 / self.starts[-1]) + 1)
        bands, centre, spread = self._bands_from(spread)
        caps = np.array(
            [min(cb.size, self.units // int(wk)) for cb, wk in zip(bands, self.w, strict=True)]
        )
        best_value, best_b = -np.inf, None
        for _ in range(64):
            lo = np.maximum(centre - self.radius, 0)
            hi = np.minimum(centre + self.radius, caps)
            if any(
                (lo[k] <= cb.top and cb.top > 0) or hi[k] > cb.top + cb.band.size
                for k, cb in enumerate(bands)
            ):
                bands, _, spread = self._bands_from(spread * 4)  # the box left the band
                best_value = -np.inf  # values are relative to the band
                continue
            value, b = self._box(bands, lo, hi)
            if value <= best_value + 1e-12:
                break
            best_value, best_b = value, b
            edge = ((b == lo) & (lo > 0)) | ((b == hi) & (hi < caps))
            if not edge.any():
                break
            centre = b
        assert best_b is not None
        return np.concatenate(
            [self._exact_counts(k, cb, int(best_b[k])) for k, cb in enumerate(bands)]
        )

    def _box(self, bands: list[_ClassBand], lo: np.ndarray, hi: np.ndarray):
        """Exact best of sum E_k(b_k), sum w_k b_k <= units, lo <= b <= hi; (value, b)."""
        base = int(self.w @ lo)
        span = self.units - base
        if span < 0:
            return -np.inf, lo
        states = min(span, int(self.w @ (hi - lo))) + 1
        cells = states * int((hi - lo + 1).sum())
        if cells > self.MAX_BOX_CELLS:
            raise AllocationError(
                f"the cost-class solver's box needs {cells:.3g} cells (limit "
                f"{self.MAX_BOX_CELLS:.3g}): too many distinct rollout costs; round the costs "
                "to fewer values (a lower resolution)"
            )
        dp = np.full(states, -np.inf)
        dp[0] = 0.0
        picks = []
        for k, cb in enumerate(bands):
            wk = int(self.w[k])
            vals = [self._exact(k, cb, b) for b in range(lo[k], hi[k] + 1)]
            new = np.full(states, -np.inf)
            arg = np.zeros(states, dtype=np.int64)
            for d, val in enumerate(vals):
                shift = d * wk
                if shift >= states or not np.isfinite(val):
                    continue
                cand = dp[: states - shift] + val
                better = cand > new[shift:]
                new[shift:][better] = cand[better]
                arg[shift:][better] = d
            dp = new
            picks.append(arg)
        u = int(np.argmax(dp))
        value = float(dp[u])
        b = np.zeros(len(bands), dtype=np.int64)
        for k in range(len(bands) - 1, -1, -1):
            d = int(picks[k][u])
            b[k] = lo[k] + d
            u -= d * int(self.w[k])
        return value, b


def solve_roots_costed_reference(
    values: Sequence[float],
    costs: Sequence[float],
    budget: float,
    m_max: int = 16,
    resolution: int = 8,
    *,
    concentrations: Sequence[float | None] | None = None,
) -> RootSolution:
    """Reference DP for `solve_roots_costed` over integerised costs, O(P * m_max * budget).

    ``resolution`` units per unit of cost, each prompt's m-rollout cost rounded *up* (so
    the plan never overspends), budget rounded down. Ties go to the smaller m, prompts in
    order. Slow and memory-hungry (a P x budget table), obviously right: the tests and
    `trace-gym bench alloc-speed --mixture` check the class solver against it.
    """
    v, conc, w, units, m_max = _costed_problem(
        values, costs, budget, m_max, resolution, concentrations
    )
    ms = np.array([0, *range(2, m_max + 1)])
    dp = np.full(units + 1, -np.inf)
    dp[0] = 0.0
    choice = np.zeros((v.size, units + 1), dtype=np.int16)
    table = _value_table(v, conc, m_max)
    for i in range(v.size):
        wi = ms * int(w[i])
        gain = table[i, ms]
        best, arg = dp.copy(), np.zeros(units + 1, dtype=np.int16)
        for k in range(1, ms.size):
            if wi[k] > units:
                break
            cand = np.full(units + 1, -np.inf)
            cand[wi[k] :] = dp[: units + 1 - wi[k]] + gain[k]
            better = cand > best
            best[better], arg[better] = cand[better], k
        dp, choice[i] = best, arg
    b = int(np.argmax(dp))  # the best total (first maximum: the least budget)
    counts = np.zeros(v.size, dtype=np.int64)
    for i in range(v.size - 1, -1, -1):
        k = int(choice[i, b])
        counts[i] = ms[k]
        b -= int(ms[k] * w[i])
    return RootSolution(counts, _root_objective(v, conc, counts))


# ----------------------------------------------------------------------------- prefixes
def _repeat_probability(values, rewards) -> np.ndarray:
    v = np.clip(_as_values(values, "prefix values"), VALUE_EPS, 1.0 - VALUE_EPS)
    try:
        r = np.asarray(rewards, dtype=float)
    except (TypeError, ValueError) as e:
        raise AllocationError(
            f"prefix rewards must be numbers in [0, 1]; got {rewards!r:.80}"
        ) from e
    if r.shape != v.shape:
        raise AllocationError(f"need one reward per prefix: {r.shape} rewards for {v.shape} values")
    if not np.all(np.isfinite(r)) or np.any((r < 0) | (r > 1)):
        raise AllocationError(
            "prefix rewards must be finite and in [0, 1] (pass the 0/1 success of the rollout)"
        )
    return r * v + (1.0 - r) * (1.0 - v)


def _heap_split(q: np.ndarray, budget: int) -> np.ndarray:
    counts = [0] * q.size
    qs = q.tolist()
    # max-heap on the next replay's gain q^k (1 - q); ties go to the lower index
    heap = [(q_j - 1.0, j) for j, q_j in enumerate(qs)]
    heapq.heapify(heap)
    for _ in range(budget):
        neg_gain, j = heap[0]
        counts[j] += 1
        heapq.heapreplace(heap, (neg_gain * qs[j], j))
    return np.asarray(counts, dtype=np.int64)


def _next_ratio(q: float, c: float, k: int) -> float:
    """Gain of replay k + 1 over replay k's, q ~ Beta(q c, (1 - q) c): (q c + k - 1) / (c + k)."""
    return q if math.isinf(c) else (q * c + k - 1.0) / (c + k)


def _heap_split_posterior(q: np.ndarray, conc: np.ndarray, budget: int) -> np.ndarray:
    """The max-heap greedy on the posterior gains E[q^(k-1) (1 - q)] (non-increasing in k)."""
    counts = [0] * q.size
    qs, cs = q.tolist(), conc.tolist()
    heap = [(q_j - 1.0, j) for j, q_j in enumerate(qs)]  # first gain: E[1 - q] = 1 - q
    heapq.heapify(heap)
    for _ in range(budget):
        neg_gain, j = heap[0]
        counts[j] += 1
        heapq.heapreplace(heap, (neg_gain * _next_ratio(qs[j], cs[j], counts[j]), j))
    return np.asarray(counts, dtype=np.int64)


def posterior_prefix_value(q, conc, k) -> np.ndarray:
    """1 - E[q^k] for q ~ Beta(q c, (1 - q) c): the chance that k replays flip at least once.

    ``conc`` = inf gives `prefix_value` exactly.
    """
    q, c, k = np.broadcast_arrays(np.asarray(q, float), np.asarray(conc, float), np.asarray(k))
    qf, cf, kf = q.ravel(), c.ravel(), k.ravel().astype(np.int64)
    moments = beta_moments(qf, cf, int(kf.max()) if kf.size else 0)
    post = 1.0 - moments[np.arange(qf.size), kf]
    return np.where(np.isfinite(cf), post, prefix_value(qf, kf)).reshape(q.shape)


#: largest knapsack table (prefixes x capacity cells, 8 bytes each: about 160 MB) the
#: exact DP builds; a bigger problem falls back to `_greedy_cost_split` with a warning
MAX_KNAPSACK_CELLS = 20_000_000


def _greedy_cost_split(
    q: np.ndarray, c: np.ndarray, budget: float, conc: np.ndarray | None = None
) -> np.ndarray:
    """Replays by best gain per unit of cost while they fit (the knapsack DP's fallback)."""
    counts = [0] * q.size
    qs, cs = q.tolist(), c.tolist()
    ks = [math.inf] * q.size if conc is None else conc.tolist()
    heap = [(-(1.0 - q_j) / cs[j], j) for j, q_j in enumerate(qs)]  # next replay's gain / cost
    heapq.heapify(heap)
    left = budget + 1e-9
    while heap:
        neg_ratio, j = heap[0]
        if cs[j] > left:  # costs are fixed: this prefix never fits again
            heapq.heappop(heap)
            continue
        if neg_ratio == 0.0:  # every remaining gain underflowed to 0
            break
        counts[j] += 1
        left -= cs[j]
        heapq.heapreplace(heap, (neg_ratio * _next_ratio(qs[j], ks[j], counts[j]), j))
    return np.asarray(counts, dtype=np.int64)


def _knapsack_split(
    q: np.ndarray, costs, budget: float, resolution: int, conc: np.ndarray | None = None
) -> np.ndarray:
    try:
        c = np.asarray(costs, dtype=float)
    except (TypeError, ValueError) as e:
        raise AllocationError(f"prefix costs must be positive numbers; got {costs!r:.80}") from e
    if c.shape != q.shape:
        raise AllocationError(f"need one cost per prefix: {c.shape} costs for {q.shape} values")
    if not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise AllocationError(
            "prefix costs must be finite and > 0 (cost of one replay, e.g. turns left / turns)"
        )
    if resolution < 1:
        raise AllocationError(
            f"resolution must be >= 1 integer unit per unit of cost; got {resolution}"
        )
    cells = q.size * (math.floor(budget * resolution + 1e-9) + 1)
    if cells > MAX_KNAPSACK_CELLS:
        warnings.warn(
            f"prefix knapsack: budget {budget:g} x resolution {resolution} over {q.size} prefixes "
            f"needs {cells:.3g} table cells (limit {MAX_KNAPSACK_CELLS:.3g}); using the cost-aware "
            "greedy instead (not exact). Lower `resolution` or the budget to keep the exact DP.",
            RuntimeWarning,
            stacklevel=3,
        )
        return _greedy_cost_split(q, c, budget, conc)
    w = np.maximum(1, np.ceil(c * resolution - 1e-9)).astype(
        np.int64
    )  # rounded up: never overspend
    cap = int(math.floor(budget * resolution + 1e-9))
    dp = np.zeros(cap + 1)  # dp[c] = best objective within capacity c (sum <= c)
    choice = np.zeros((q.size, cap + 1), dtype=np.int64)
    for j in range(q.size):
        best, arg = dp.copy(), np.zeros(cap + 1, dtype=np.int64)
        kmax = cap // w[j]
        post = None
        if conc is not None and np.isfinite(conc[j]):  # 1 - E[q^k], k = 0..kmax
            post = 1.0 - beta_moments(q[j : j + 1], conc[j : j + 1], int(kmax))[0]
        for k in range(1, kmax + 1):
            shift = k * w[j]
            gain = (1.0 - q[j] ** k) if post is None else post[k]
            cand = dp[: cap + 1 - shift] + gain
            better = cand > best[shift:]
            best[shift:][better] = cand[better]
            arg[shift:][better] = k
        dp = best
        choice[j] = arg
    counts = np.zeros(q.size, dtype=np.int64)
    b = cap
    for j in range(q.size - 1, -1, -1):
        counts[j] = choice[j, b]
        b -= counts[j] * w[j]
    return counts


def solve_prefixes(
    values: Sequence[float] | np.ndarray,
    rewards: Sequence[float] | np.ndarray,
    budget: float,
    costs: Sequence[float] | np.ndarray | None = None,
    *,
    resolution: int = 100,
    concentrations: Sequence[float | None] | None = None,
) -> PrefixSolution:
    """Exact split of one prompt's continuation budget over its visited prefixes.

    Without `costs`, `budget` is a number of replays and the counts sum to it exactly
    (max-heap greedy). With `costs` (cost of one replay from each prefix, any unit),
    `budget` is in the same unit and the counts maximise the objective subject to
    sum counts_j * cost_j <= budget, solved by a knapsack DP with costs rounded up to
    multiples of 1 / `resolution`. A table over `MAX_KNAPSACK_CELLS` cells (prefixes x
    budget x resolution) is not built: the split falls back to the cost-aware greedy
    with a `RuntimeWarning`.

    `concentrations` (a + b of each prefix's Beta belief about V; None or inf: a point
    value) switch to the posterior objective sum (1 - E[q_j^k_j]): with V ~ Beta, q is
    Beta(q c, (1 - q) c), and the k-th replay's gain E[q^(k-1) (1 - q)] still shrinks
    with k (pointwise in q), so the same greedy and DP stay exact.
    """
    q = _repeat_probability(values, rewards)
    conc = check_concentrations(concentrations, q.size)
    if costs is None:
        b = whole_number(budget, "prefix budget")
        counts = _heap_split(q, b) if conc is None else _heap_split_posterior(q, conc, b)
    else:
        if not np.isfinite(budget) or budget < 0:
            raise AllocationError(f"prefix budget must be finite and >= 0; got {budget!r}")
        counts = _knapsack_split(q, costs, float(budget), int(resolution), conc)
    value = prefix_value(q, counts) if conc is None else posterior_prefix_value(q, conc, counts)
    return PrefixSolution(counts, float(value.sum()))


def _batched_heap_split(
    q: np.ndarray, sizes: np.ndarray, budgets: np.ndarray, conc: np.ndarray | None
) -> np.ndarray:
    """`_heap_split` (or `_heap_split_posterior`) of every group at once, same counts.

    Groups of one size form a (groups, size) table, rows by budget, largest first. Each
    pass gives one replay to every row with budget left (a leading slice of the table):
    to the prefix whose next replay gains most (`argmin` of minus the gain: the lowest
    index on ties, as the heaps order (gain, index)), with the heaps' float operations, so
    the counts are the per-group ones exactly. Passes = the largest budget.
    """
    counts = np.zeros(q.size, dtype=np.int64)
    starts = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64)
    for size in np.unique(sizes[(sizes > 0) & (budgets > 0)]):
        groups = np.flatnonzero((sizes == size) & (budgets > 0))
        groups = groups[np.argsort(-budgets[groups], kind="stable")]
        cells = starts[groups][:, None] + np.arange(size)
        x, qq = q[cells] - 1.0, q[cells]  # minus the first replay's gain, as the heaps store it
        cc = None if conc is None else conc[cells]
        k = np.zeros(cells.shape, dtype=np.int64)
        left = budgets[groups]
        for t in range(int(left[0])):
            live = int(np.searchsorted(-left, -t, side="left"))  # rows whose budget > t
            rows = np.arange(live)
            pick = x[:live].argmin(axis=1)
            k[rows, pick] += 1
            if cc is None:
                ratio = qq[rows, pick]
            else:
                c, kp = cc[rows, pick], k[rows, pick].astype(float)
                with np.errstate(invalid="ignore"):
                    ratio = np.where(
                        np.isinf(c), qq[rows, pick], (qq[rows, pick] * c + kp - 1.0) / (c + kp)
                    )
            x[rows, pick] = x[rows, pick] * ratio
        counts[cells] = k
    return counts


def _batch_shape(sizes, budgets, prefixes: int) -> tuple[np.ndarray, np.ndarray]:
    """`sizes` (int64) and `budgets` (float) of a batch, checked against its prefix count."""
    try:
        n = np.asarray(sizes, dtype=np.int64)
        b = np.asarray(budgets, dtype=float)
    except (TypeError, ValueError) as e:
        raise AllocationError(f"sizes and budgets must be numbers; got {sizes!r:.60}") from e
    if n.ndim != 1 or b.shape != n.shape or np.any(n < 0) or int(n.sum()) != prefixes:
        raise AllocationError(
            f"need one size >= 0 and one budget per prompt, sizes summing to the {prefixes} "
            f"prefixes; got {n.size} sizes (sum {int(n.sum()) if n.ndim == 1 else '?'}) "
            f"and {b.size} budgets"
        )
    return n, b


def solve_prefixes_batch(
    values: Sequence[float] | np.ndarray,
    rewards: Sequence[float] | np.ndarray,
    sizes: Sequence[int],
    budgets: Sequence[float],
    costs: Sequence[float] | np.ndarray | None = None,
    *,
    resolution: int = 100,
    concentrations: Sequence[float | None] | np.ndarray | None = None,
) -> PrefixBatch:
    """`solve_prefixes` for many prompts in one call: the same counts, prompt by prompt.

    The prompts' prefixes come one prompt after another (`sizes[g]` of them for prompt g,
    whose budget is `budgets[g]`). Without `costs` the max-heap greedy of every prompt
    runs at once, vectorised over prompts (one numpy pass per replay of the largest
    budget instead of one Python heap per prompt); with `costs` each prompt's knapsack
    DP runs in turn (the DP is per prompt).
    """
    if len(values) == 0 and len(rewards) == 0:  # no prompt has a prefix: nothing to split
        zero = np.zeros(len(sizes), dtype=np.int64)
        return PrefixBatch(np.zeros(0, dtype=np.int64), zero.astype(float), np.r_[0, zero])
    q = _repeat_probability(values, rewards)
    conc = check_concentrations(concentrations, q.size)
    n, b = _batch_shape(sizes, budgets, q.size)
    bounds = np.r_[0, np.cumsum(n)]
    if costs is None:
        if not np.all(np.isfinite(b)) or np.any(b < 0) or np.any(b != np.round(b)):
            raise AllocationError(
                "prefix budgets must be whole numbers >= 0 (replays) without costs; got "
                f"{b[~np.isfinite(b) | (b < 0) | (b != np.round(b))][:5].tolist()}"
            )
        counts = _batched_heap_split(q, n, b.astype(np.int64), conc)
    else:
        c = np.asarray(costs, dtype=float)
        if c.shape != q.shape:
            raise AllocationError(f"need one cost per prefix: {c.shape} costs for {q.shape} values")
        if not np.all(np.isfinite(b)) or np.any(b < 0):
            raise AllocationError(f"prefix budgets must be finite and >= 0; got {b[:5].tolist()}")
        parts = [
            _knapsack_split(
                q[lo:hi],
                c[lo:hi],
                float(bg),
                int(resolution),
                None if conc is None else conc[lo:hi],
            )
            for lo, hi, bg in zip(bounds[:-1], bounds[1:], b.tolist(), strict=True)
        ]
        counts = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    value = prefix_value(q, counts) if conc is None else posterior_prefix_value(q, conc, counts)
    objectives = np.bincount(np.repeat(np.arange(n.size), n), weights=value, minlength=n.size)
    return PrefixBatch(counts, objectives, bounds)


# ----------------------------------------------------------------------------- splitting
def split_budget(weights: Sequence[float] | np.ndarray, total: int) -> np.ndarray:
    """Split `total` into integers proportional to `weights` (largest remainder, sums exactly).

    Ties in the remainders go to the lower index. Integer weights use exact integer
    arithmetic, so e.g. root counts never suffer rounding noise.
    """
    total = whole_number(total, "total budget")
    try:
        w = np.asarray(weights, dtype=float)
    except (TypeError, ValueError) as e:
        raise AllocationError(f"weights must be numbers; got {weights!r:.80}") from e
    if w.ndim != 1:
        raise AllocationError(f"weights must be a flat sequence; got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise AllocationError("weights must be finite and >= 0")
    if total == 0:
        return np.zeros(w.size, dtype=np.int64)
    if w.size == 0 or w.sum() <= 0:
        raise AllocationError(
            f"cannot split a budget of {total} over weights that are all zero (or none); "
            "give at least one positive weight, or a total of 0"
        )
    if np.all(w == np.round(w)) and w.sum() < 2**62 / max(total, 1):
        wi = w.astype(np.int64)
        s = int(wi.sum())
        base, rem = np.divmod(wi * total, s)
        frac = rem.astype(float) / s
    else:
        quota = w * (total / w.sum())
        base = np.floor(quota).astype(np.int64)
        frac = quota - base
    base = base.astype(np.int64)
    left = total - int(base.sum())
    order = np.lexsort((np.arange(w.size), -frac))  # largest remainder first, then index
    base[order[:left]] += 1
    return base


def split_costed_budget(counts: Sequence[int], costs: Sequence[float], total: int) -> np.ndarray:
    """Replays per prompt when a replay of prompt i costs ``costs[i]`` (a mixture's env cost).

    The step's `total` replays' worth of cost (sum costs[i] * k_i <= total) is shared in
    proportion to the cost-weighted roots costs[i] * counts[i]: prompt i's share of the
    cost is total * c_i m_i / sum c m, i.e. k_i = total * m_i / sum c m replays. The
    floors first, then one more replay each in order of the largest remainder (ties to
    the lower index) while the cost left allows it. Unit costs give `split_budget`'s
    split exactly.
    """
    total = whole_number(total, "total budget")
    try:
        w = np.asarray(counts, dtype=float)
    except (TypeError, ValueError) as e:
        raise AllocationError(f"root counts must be numbers; got {counts!r:.80}") from e
    c = _positive_costs(costs, w.shape)
    if total == 0 or np.all(c == 1.0):
        return split_budget(w, total)
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise AllocationError("root counts must be finite, >= 0 and not all zero")
    quota = w * (total / float(c @ w))
    base = np.floor(quota + 1e-12).astype(np.int64)
    left = total - float(c @ base)
    frac = quota - base
    cheapest = float(c.min())
    for i in np.lexsort((np.arange(w.size), -frac)):
        if frac[i] <= 0 or left < cheapest - 1e-9:
            break  # remainders are sorted: none later, and nothing left to buy
        if left < c[i] - 1e-9:
            continue
        base[i] += 1
        left -= c[i]
    return base
