"""Build `math_default.jsonl`, the embedded problem set of trace/Math-v0.

Deterministic: ``python -m trace_gym.corpora.build_math`` (or ``python corpora/build_math.py``)
rewrites the same file byte for byte. Each generator draws parameters from a seeded
`random.Random`, computes the answer with sympy, and cross-checks it with an
independent brute-force computation; a problem whose two answers disagree aborts the
build. Answers are written as LaTeX strings in the DeepScaleR format
(``problem`` / ``answer`` / ``solution``) plus ``id`` and ``topic``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import sympy as sp

OUT = Path(__file__).with_name("math_default.jsonl")
PER_GENERATOR = 48
SEED = 20240601


def _tex(value: sp.Expr | int | Fraction) -> str:
    if isinstance(value, Fraction):
        value = sp.Rational(value.numerator, value.denominator)
    return sp.latex(sp.nsimplify(value) if not isinstance(value, int) else sp.Integer(value))


def _check(a, b) -> None:
    if sp.simplify(sp.sympify(a) - sp.sympify(b)) != 0:
        raise AssertionError(f"generator cross-check failed: {a} != {b}")


# ------------------------------------------------------------------ number theory
def divisor_sum(r: random.Random) -> dict:
    n = r.randint(200, 20000)
    want = int(sp.divisor_sigma(n))
    _check(want, sum(d for d in range(1, n + 1) if n % d == 0))
    return {
        "problem": f"What is the sum of all positive divisors of {n}?",
        "answer": str(want),
        "solution": f"sympy.divisor_sigma({n}) = {want}",
    }


def power_mod(r: random.Random) -> dict:
    a, b, m = r.randint(2, 99), r.randint(50, 5000), r.randint(7, 997)
    want = pow(a, b, m)
    _check(want, (a**b) % m)
    return {
        "problem": f"Find the remainder when ${a}^{{{b}}}$ is divided by ${m}$.",
        "answer": str(want),
        "solution": f"pow({a}, {b}, {m}) = {want}",
    }


def totient(r: random.Random) -> dict:
    n = r.randint(100, 5000)
    want = int(sp.totient(n))
    _check(want, sum(1 for k in range(1, n + 1) if math.gcd(k, n) == 1))
    return {
        "problem": f"How many positive integers not exceeding {n} are relatively prime to {n}?",
        "answer": str(want),
        "solution": f"Euler's totient: phi({n}) = {want}",
    }


def modular_inverse(r: random.Random) -> dict:
    while True:
        m = r.randint(50, 2000)
        a, b = r.randint(2, m - 1), r.randint(1, m - 1)
        if math.gcd(a, m) == 1:
            break
    want = (b * pow(a, -1, m)) % m
    _check(want, next(x for x in range(m) if (a * x - b) % m == 0))
    return {
        "problem": f"Find the smallest nonnegative integer $x$ such that ${a}x \\equiv {b} \\pmod{{{m}}}$.",
        "answer": str(want),
        "solution": f"x = {b} * {a}^(-1) mod {m} = {want}",
    }


def largest_prime_factor(r: random.Random) -> dict:
    n = r.randint(10**4, 10**7)
    want = max(sp.factorint(n))
    d, k, best = 2, n, 1
    while d * d <= k:
        while k % d == 0:
            best, k = d, k // d
        d += 1
    _check(want, max(best, k) if k > 1 else best)
    return {
        "problem": f"What is the largest prime factor of {n}?",
        "answer": str(want),
        "solution": f"sympy.factorint({n}) = {dict(sp.factorint(n))}",
    }


# ------------------------------------------------------------------ combinatorics
def lattice_paths(r: random.Random) -> dict:
    a, b = r.randint(3, 12), r.randint(3, 12)
    want = math.comb(a + b, a)
    grid = [[1] * (b + 1) for _ in range(a + 1)]
    for i, j in itertools.product(range(1, a + 1), range(1, b + 1)):
        grid[i][j] = grid[i - 1][j] + grid[i][j - 1]
    _check(want, grid[a][b])
    return {
        "problem": f"How many lattice paths go from $(0,0)$ to $({a},{b})$ using unit steps right or up?",
        "answer": str(want),
        "solution": f"C({a + b}, {a}) = {want}",
    }


def word_arrangements(r: random.Random) -> dict:
    word = r.choice(
        [
            "MISSISSIPPI",
            "BANANA",
            "COMMITTEE",
            "STATISTICS",
            "ALGEBRA",
            "PEPPER",
            "BOOKKEEPER",
            "ARRANGEMENT",
            "LETTER",
            "CALCULUS",
            "PARABOLA",
            "TENNESSEE",
        ]
    )
    word = word[: r.randint(5, len(word))]
    counts = [word.count(c) for c in sorted(set(word))]
    want = math.factorial(len(word)) // math.prod(math.factorial(c) for c in counts)
    brute = len(set(itertools.permutations(word))) if len(word) <= 8 else want
    _check(want, brute)
    return {
        "problem": f"How many distinct arrangements of the letters of the word {word} are there?",
        "answer": str(want),
        "solution": f"{len(word)}! / prod(counts!) = {want}",
    }


def stars_and_bars(r: random.Random) -> dict:
    n, k, low = r.randint(6, 20), r.randint(2, 5), r.randint(0, 1)
    want = math.comb(n - low * k + k - 1, k - 1)
    brute = (
        sum(1 for xs in itertools.product(range(low, n + 1), repeat=k) if sum(xs) == n)
        if k <= 4
        else want
    )
    _check(want, brute)
    kind = "positive" if low else "nonnegative"
    return {
        "problem": f"How many ordered {k}-tuples of {kind} integers sum to {n}?",
        "answer": str(want),
        "solution": f"stars and bars: C({n - low * k + k - 1}, {k - 1}) = {want}",
    }


def derangements(r: random.Random) -> dict:
    n = r.randint(4, 12)
    want = int(sp.subfactorial(n))
    brute = (
        sum(1 for p in itertools.permutations(range(n)) if all(p[i] != i for i in range(n)))
        if n <= 7
        else round(math.factorial(n) / math.e)
    )
    _check(want, brute)
    return {
        "problem": f"In how many ways can {n} letters be put into their {n} addressed envelopes so that no letter is in its own envelope?",
        "answer": str(want),
        "solution": f"!{n} = {want}",
    }


def partitions(r: random.Random) -> dict:
    n = r.randint(8, 60)
    want = int(sp.partition(n))
    ways = [1] + [0] * n
    for part in range(1, n + 1):
        for total in range(part, n + 1):
            ways[total] += ways[total - part]
    _check(want, ways[n])
    return {
        "problem": f"In how many ways can {n} be written as a sum of positive integers, ignoring order?",
        "answer": str(want),
        "solution": f"p({n}) = {want}",
    }


# ------------------------------------------------------------------ algebra
def linear_equation(r: random.Random) -> dict:
    x = sp.Symbol("x")
    a, b, c, d = (r.choice([k for k in range(-15, 16) if k]) for _ in range(4))
    if a == c:
        c += 1
    sol = sp.solve(sp.Eq(a * x + b, c * x + d), x)[0]
    _check(sol, Fraction(d - b, a - c))
    return {
        "problem": f"Solve for $x$: ${sp.latex(a * x + b)} = {sp.latex(c * x + d)}$.",
        "answer": _tex(sol),
        "solution": f"x = ({d} - {b}) / ({a} - {c}) = {sol}",
    }


def root_power_sum(r: random.Random) -> dict:
    x = sp.Symbol("x")
    roots = [r.randint(-9, 9) for _ in range(3)]
    p = sp.expand(sp.prod([x - t for t in roots]))
    k = r.randint(2, 4)
    want = sum(sp.Pow(t, k) for t in sp.roots(sp.Poly(p, x), multiple=True))
    _check(want, sum(t**k for t in roots))
    return {
        "problem": f"Let $r_1, r_2, r_3$ be the roots of ${sp.latex(p)} = 0$. Compute $r_1^{k} + r_2^{k} + r_3^{k}$.",
        "answer": str(int(want)),
        "solution": f"roots {sorted(roots)}; power sum {want}",
    }


def linear_system(r: random.Random) -> dict:
    x, y = sp.symbols("x y")
    while True:
        a, b, c, d = (r.randint(-9, 9) for _ in range(4))
        if a * d - b * c != 0:
            break
    e, f = r.randint(-30, 30), r.randint(-30, 30)
    sol = sp.solve([a * x + b * y - e, c * x + d * y - f], [x, y])
    want = sp.nsimplify(sol[x] + sol[y])
    det = a * d - b * c
    _check(want, Fraction(e * d - b * f, det) + Fraction(a * f - c * e, det))
    return {
        "problem": f"If ${sp.latex(a * x + b * y)} = {e}$ and ${sp.latex(c * x + d * y)} = {f}$, what is $x + y$?",
        "answer": _tex(want),
        "solution": f"x = {sol[x]}, y = {sol[y]}",
    }


def quadratic_product(r: random.Random) -> dict:
    x = sp.Symbol("x")
    a = r.choice([k for k in range(-6, 7) if k])
    b, c = r.randint(-20, 20), r.randint(-20, 20)
    sols = sp.solve(a * x**2 + b * x + c, x)
    want = sp.nsimplify(sp.expand(sp.prod(sols)) if len(sols) == 2 else sols[0] ** 2)
    _check(want, Fraction(c, a))
    return {
        "problem": f"Find the product of the roots (with multiplicity, complex roots allowed) of ${sp.latex(a * x**2 + b * x + c)} = 0$.",
        "answer": _tex(want),
        "solution": f"Vieta: c/a = {want}",
    }


# ------------------------------------------------------------------ calculus
def definite_integral(r: random.Random) -> dict:
    x = sp.Symbol("x")
    poly = sum(r.randint(-5, 5) * x**k for k in range(r.randint(2, 4) + 1))
    lo, hi = sorted(r.sample(range(-3, 5), 2))
    want = sp.integrate(poly, (x, lo, hi))
    anti = sp.Poly(poly, x).integrate().as_expr()
    _check(want, anti.subs(x, hi) - anti.subs(x, lo))
    return {
        "problem": f"Evaluate $\\int_{{{lo}}}^{{{hi}}} \\left({sp.latex(poly)}\\right)\\,dx$.",
        "answer": _tex(want),
        "solution": f"antiderivative {anti}; value {want}",
    }


def derivative_value(r: random.Random) -> dict:
    x = sp.Symbol("x")
    a, b, c = r.randint(1, 6), r.randint(1, 5), r.randint(-3, 3)
    f = x**a * sp.exp(b * x) if r.random() < 0.5 else x**a * (1 + x) ** b
    at = r.randint(0, 2) if c >= 0 else 1
    want = sp.simplify(sp.diff(f, x).subs(x, at))
    h = sp.Rational(1, 10**8)
    approx = (f.subs(x, at + h) - f.subs(x, at - h)) / (2 * h)
    if abs(float(approx) - float(want)) > 1e-4 * max(1, abs(float(want))):
        raise AssertionError("derivative cross-check failed")
    return {
        "problem": f"Let $f(x) = {sp.latex(f)}$. Compute $f'({at})$.",
        "answer": sp.latex(want),
        "solution": f"f'(x) = {sp.diff(f, x)}; f'({at}) = {want}",
    }


def series_sum(r: random.Random) -> dict:
    k = sp.Symbol("k", integer=True, positive=True)
    n, p, a = r.randint(10, 60), r.randint(1, 3), r.randint(1, 5)
    term = a * k**p + r.randint(-3, 3)
    want = sp.summation(term, (k, 1, n))
    _check(want, sum(term.subs(k, i) for i in range(1, n + 1)))
    return {
        "problem": f"Compute $\\sum_{{k=1}}^{{{n}}} \\left({sp.latex(term)}\\right)$.",
        "answer": str(int(want)),
        "solution": f"closed form of the sum gives {want}",
    }


def limit_ratio(r: random.Random) -> dict:
    x = sp.Symbol("x")
    a, b = r.randint(1, 9), r.randint(1, 9)
    f = r.choice(
        [
            sp.sin(a * x) / sp.tan(b * x),
            (sp.exp(a * x) - 1) / sp.sin(b * x),
            (1 - sp.cos(a * x)) / (b * x**2),
        ]
    )
    want = sp.limit(f, x, 0)
    approx = f.subs(x, sp.Rational(1, 10**6)).evalf(30)
    if abs(float(approx) - float(want)) > 1e-4:
        raise AssertionError("limit cross-check failed")
    return {
        "problem": f"Compute $\\lim_{{x \\to 0}} {sp.latex(f)}$.",
        "answer": _tex(want),
        "solution": f"Taylor expansion gives {want}",
    }


GENERATORS: dict[str, tuple[str, Callable[[random.Random], dict]]] = {
    "divisor-sum": ("number_theory", divisor_sum),
    "power-mod": ("number_theory", power_mod),
    "totient": ("number_theory", totient),
    "mod-inverse": ("number_theory", modular_inverse),
    "prime-factor": ("number_theory", largest_prime_factor),
    "lattice-paths": ("combinatorics", lattice_paths),
    "arrangements": ("combinatorics", word_arrangements),
    "stars-bars": ("combinatorics", stars_and_bars),
    "derangements": ("combinatorics", derangements),
    "partitions": ("combinatorics", partitions),
    "linear-eq": ("algebra", linear_equation),
    "root-powers": ("algebra", root_power_sum),
    "linear-system": ("algebra", linear_system),
    "quadratic": ("algebra", quadratic_product),
    "integral": ("calculus", definite_integral),
    "derivative": ("calculus", derivative_value),
    "series": ("calculus", series_sum),
    "limit": ("calculus", limit_ratio),
}


def build(per_generator: int = PER_GENERATOR, seed: int = SEED) -> list[dict]:
    """All problems, in a fixed order, with unique problem texts."""
    rows = []
    for g, (name, (topic, gen)) in enumerate(GENERATORS.items()):
        r = random.Random(seed * 1000 + g)
        seen: set[str] = set()
        tries = 0
        while len(seen) < per_generator and tries < per_generator * 20:
            tries += 1
            row = gen(r)
            if row["problem"] in seen:
                continue
            seen.add(row["problem"])
            rows.append({"id": f"{name}-{len(seen):03d}", "topic": topic, **row})
    return rows


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0]) if argv else OUT
    rows = build()
    with open(out, "w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    print(f"wrote {len(rows)} problems to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
