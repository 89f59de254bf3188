"""Statistics of `bench learn`: AUC, cost to target, t intervals, Wilcoxon signed-rank,
the paired t-test, Holm.

Pure numpy (no scipy): the Wilcoxon null is exact (subset-sum counts of the ranks) for
n <= 25 non-zero differences without ties, a tie-corrected normal approximation otherwise;
the t-test's p-value is the regularised incomplete beta function (continued fraction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["auc", "cost_to_target", "holm", "mean_ci95", "paired_t", "t95", "wilcoxon_signed_rank"]

#: two-sided 95% Student-t quantiles, df = 1..30
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% Student-t interval (nan half-width for n < 2)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    if x.size < 2:
        return float(x.mean()), math.nan
    return float(x.mean()), t95(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)


def auc(x: Sequence[float], y: Sequence[float]) -> float:
    """Trapezoid area under y(x) divided by the x range: the mean of y over the x axis."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    span = x[-1] - x[0]
    if x.size < 2 or span <= 0:
        return float(y.mean())
    return float(np.sum(0.5 * (y[1:] + y[:-1]) * np.diff(x)) / span)


def cost_to_target(cost: Sequence[float], success: Sequence[float], target: float) -> float | None:
    """First cost at which `success` reaches `target` (linear interpolation); None if never."""
    c, s = np.asarray(cost, dtype=float), np.asarray(success, dtype=float)
    for i in range(s.size):
        if s[i] >= target:
            if i == 0 or s[i] == s[i - 1]:
                return float(c[i])
            frac = (target - s[i - 1]) / (s[i] - s[i - 1])
            return float(c[i - 1] + frac * (c[i] - c[i - 1]))
    return None


def _exact_null(n: int) -> np.ndarray:
    """counts[w] = number of sign patterns of ranks 1..n with positive-rank sum w."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    return counts


def _ranks(a: np.ndarray) -> np.ndarray:
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(a.size)
    sa = a[order]
    i = 0
    while i < a.size:
        j = i
        while j + 1 < a.size and sa[j + 1] == sa[i]:
            j += 1
        ranks[order[i : j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def wilcoxon_signed_rank(diffs: Sequence[float]) -> float:
    """Two-sided p-value of the Wilcoxon signed-rank test of median(diffs) = 0 (zeros dropped)."""
    d = np.asarray([x for x in diffs if x != 0.0], dtype=float)
    n = d.size
    if n == 0:
        return 1.0
    ranks = _ranks(np.abs(d))
    w = float(ranks[d > 0].sum())
    ties = len(np.unique(np.abs(d))) < n
    if n <= 25 and not ties:
        counts = _exact_null(n)
        total = counts.sum()
        wi = int(round(w))
        lo, hi = counts[: wi + 1].sum() / total, counts[wi:].sum() / total
        return float(min(1.0, 2.0 * min(lo, hi)))
    mean = n * (n + 1) / 4.0
    _, tcounts = np.unique(np.abs(d), return_counts=True)
    var = n * (n + 1) * (2 * n + 1) / 24.0 - float(np.sum(tcounts**3 - tcounts)) / 48.0
    if var <= 0:
        return 1.0
    z = (abs(w - mean) - 0.5) / math.sqrt(var)
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0))))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    lfront = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lfront) / a * _betacf(a, b, x)
    return 1.0 - math.exp(lfront) / b * _betacf(b, a, 1.0 - x)


def paired_t(diffs: Sequence[float]) -> float:
    """Two-sided p-value of the one-sample t-test of mean(diffs) = 0 (1.0 when undefined)."""
    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return 1.0
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return 1.0 if float(d.mean()) == 0.0 else 0.0
    t = float(d.mean()) / (sd / math.sqrt(d.size))
    df = d.size - 1.0
    return float(min(1.0, betainc(0.5 * df, 0.5, df / (df + t * t))))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given)."""
    p = np.asarray(pvalues, dtype=float)
    m = p.size
    order = np.argsort(p)
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return [float(x) for x in adj]
