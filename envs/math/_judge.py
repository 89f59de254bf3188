"""Our own answer judge: a LaTeX grammar that builds sympy objects, never `eval`.

This module imports nothing from trace_gym, so the verifier worker can run it inside the
sandbox (``python -s _judge.py``). Model text is only ever *parsed*: `Parser` is a
recursive-descent reader of the usual final-answer LaTeX (numbers, fractions, radicals,
powers, factorials, a fixed list of functions and constants, single-letter variables,
intervals, tuples, sets, matrices, equations) that calls sympy constructors itself. No
text reaches `eval`, `sympify` or `parse_expr`, so ``__import__('os')`` is just the
product of the letters i, m, p, o, r, t. Sizes are bounded before sympy sees them
(literal digits, exponents, factorials, nesting), so a number like ``9^{9^{9^9}}`` is
refused in microseconds instead of hanging the worker.

Equality (`same`): integers and other exact rationals compare exactly; a decimal in an
answer is read as the exact number it writes unless the problem asks for a decimal or a
precision (`decide`, `stated_precision`), so ``0.5`` is 1/2 and ``0.333333`` is not 1/3;
against a decimal reference (itself rounded) a relative tolerance of 1e-6 applies; symbolic
answers must simplify to the same thing. `decide` puts the rules first (hedges, a set for a
tuple, an equation with a wrong side) and names the rule that decided; the order is in
docs/math.md, "How an answer is judged".
"""

from __future__ import annotations

import contextlib
import math
import re
from fractions import Fraction
from typing import Any, NamedTuple

MAX_ANSWER_CHARS = 2000
MAX_DIGITS = 400
MAX_POWER_BITS = 20_000
MAX_FACTORIAL = 500
MAX_DEPTH = 60
REL_TOL = 1e-6
#: significant digits a decimal needs when the problem asks for one without a precision
MIN_DECIMAL_DIGITS = 3

# --------------------------------------------------------------------------- normalise
_UNIT_WORDS = (
    r"units?|cm|m|km|mm|inch(?:es)?|feet|foot|ft|yards?|miles?|meters?|centimeters?|degrees?|"
    r"seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|years?|dollars?|cents?|square|sq|cubic|mph|pounds?|"
    r"ounces?|kg|g|grams?|people|students?|ways|dots|points?|cookies|marbles|coins"
)
# words that change what a number says ("5 or more", "about 5"): never stripped as a unit
_NOT_UNITS = frozenset(
    "or and not no nor less more than at least most about approximately roughly nearly almost "
    "around over under plus minus times wait maybe perhaps either each per of off up to "
    "squared cubed i guess think is was answer".split()
)
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf|boldsymbol|mbox|textrm)\s*\{([^{}]*)\}")
# a closed-form number: digits, operators, brackets, \pi, \sqrt, \frac (no variable, no text)
_NUMBER = r"[+-]?(?:[0-9.,{}()+\-*/^]|\s|\\(?:pi|sqrt|[dt]?frac|cdot|times)(?![a-zA-Z]))+?"
# a unit after a number that ends the answer: "5 cm", "21\text{ dogs}", "6\text{ cm}^2"
_UNIT_TAIL = re.compile(
    rf"^({_NUMBER})(?:\s|~|\\[ ,;!])*"
    rf"(?:\\(?:text|mbox|mathrm)\{{\s*([a-zA-Z]+(?:\s+[a-zA-Z]+){{0,2}})\s*\}}"
    rf"|((?:{_UNIT_WORDS})(?:\s+(?:{_UNIT_WORDS}))?)|\^\{{?\\circ\}}?)(?:\^\{{?[23]\}}?)?$"
)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")


def _strip_unit(s: str) -> str:
    """`s` without a trailing unit, only when what remains is exactly a number."""
    m = _UNIT_TAIL.match(s)
    if m is None or not re.search(r"\d|\\pi", m.group(1)):
        return s
    words = (m.group(2) or m.group(3) or "").lower().split()
    return s if any(w in _NOT_UNITS for w in words) else m.group(1)


def normalize(ans: str) -> str:
    """A canonical string form: no $, spacing commands, \\left/\\right, trailing units or dfrac.

    It never changes an answer's mathematics: a unit goes only when a bare number is left
    (``5 cm`` is 5, ``5 m - 3`` stays), and no digit, variable, operator or relation is dropped.
    """
    s = ans.strip()
    s = s.strip("$").strip().rstrip(".").strip()
    s = s.replace("{,}", "").replace("\\textnormal", "\\text")
    s = re.sub(r",\\!(?=\d{3})", "", s)  # 29,\!322 -> 29322
    s = re.sub(r"^\\boxed\s*\{(.*)\}$", r"\1", s, flags=re.S)
    s = _strip_unit(s.replace("\\$", "").strip())
    for a, b in (
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\%", ""),
        ("%", ""),
        ("\\displaystyle", ""),
    ):
        s = s.replace(a, b)
    s = _TEXT.sub(r"\1", s)
    s = re.sub(r"\\phantom\s*(?:\{[^{}]*\}|.)", "", s)  # an invisible placeholder: \phantom -1 is 1
    s = re.sub(r"^(\d+)\s*:\s*(\d+)$", r"\\frac{\1}{\2}", s)  # a ratio 3:5
    s = re.sub(r"\s+", "", s).rstrip(".")
    if _THOUSANDS.fullmatch(s):  # 1,000,000 -> 1000000 (a whole answer written with separators)
        s = s.replace(",", "")
    return s


# --------------------------------------------------------------------------- grammar
_FUNCS = (
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "sin",
    "cos",
    "tan",
    "sec",
    "csc",
    "cot",
    "ln",
    "log",
    "exp",
)
_CONSTS = ("pi", "infty", "e")
_OPS = {"cdot": "*", "times": "*", "div": "/"}
_GREEK = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
)
_COMMANDS = sorted(
    (*_FUNCS, *_CONSTS, *_GREEK, *_OPS, "frac", "binom", "sqrt"), key=len, reverse=True
)


class ParseError(ValueError):
    """The text is not an answer this grammar reads (or it is too large to evaluate)."""


def _sympy():
    import sympy

    return sympy


class Parser:
    """Recursive descent over one normalised answer; `parse` returns a sympy expression.

    ``exact_decimals`` reads ``0.333333`` as the rational 333333/1000000 (what it says),
    not as a float, so it can only equal a number it equals exactly.
    """

    def __init__(self, s: str, exact_decimals: bool = False):
        self.s, self.i, self.depth = s, 0, 0
        self.exact_decimals = exact_decimals
        self.sp = _sympy()

    # -- scanning
    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def command(self) -> str | None:
        """The known command at the cursor (longest known prefix of \\letters), not consumed."""
        m = re.match(r"\\([a-zA-Z]+)", self.s[self.i :])
        if not m:
            return None
        name = m.group(1)
        return next((c for c in _COMMANDS if name.startswith(c)), None) or f"?{name}"

    def eat(self, text: str) -> bool:
        if self.s.startswith(text, self.i):
            self.i += len(text)
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.eat(text):
            raise ParseError(f"expected {text!r} at {self.i}")

    # -- grammar
    def parse(self) -> Any:
        value = self.expr()
        if self.i != len(self.s):
            raise ParseError(f"unexpected {self.s[self.i : self.i + 10]!r}")
        return value

    def expr(self) -> Any:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError("answer nested too deeply")
        try:
            value = self.term()
            while self.peek() in ("+", "-"):
                sign = self.s[self.i]
                self.i += 1
                rhs = self.term()
                value = value + rhs if sign == "+" else value - rhs
            return value
        finally:
            self.depth -= 1

    def term(self) -> Any:
        value = self.unary()
        while True:
            cmd = self.command()
            if self.peek() in ("*", "/") or cmd in _OPS:
                op = _OPS[cmd] if cmd in _OPS else self.s[self.i]
                self.i += 1 + (len(cmd) if cmd in _OPS else 0)  # type: ignore[arg-type]
                rhs = self.unary()
                value = value * rhs if op == "*" else value / rhs
            elif self.starts_atom():
                value = value * self.power()  # implicit multiplication: 2x, 3\sqrt{2}, (a)(b)
            else:
                return value

    def starts_atom(self) -> bool:
        c = self.peek()
        if not c:
            return False
        if c.isdigit() or c == "." or c.isalpha() or c in "({":
            return True
        cmd = self.command()
        return cmd is not None and cmd not in _OPS and not cmd.startswith("?")

    def unary(self) -> Any:
        if self.eat("-"):
            return -self.unary()
        if self.eat("+"):
            return self.unary()
        return self.power()

    def power(self) -> Any:
        base = self.postfix()
        if self.eat("^\\circ") or self.eat("^{\\circ}"):  # degrees inside an expression: cos(6°)
            return base * self.sp.pi / 180
        if self.eat("^"):
            exp = self.exponent()
            return _checked_pow(self.sp, base, exp)
        return base

    def exponent(self) -> Any:
        if self.peek() == "{":
            return self.group("{", "}")
        if self.eat("-"):
            return -self.exponent()
        return self.single()

    def postfix(self) -> Any:
        value = self.atom()
        while self.eat("!"):
            if not (value.is_Integer and 0 <= int(value) <= MAX_FACTORIAL):
                raise ParseError("factorial argument too large or not a small integer")
            value = self.sp.factorial(value)
        return value

    def group(self, open_: str, close: str) -> Any:
        self.expect(open_)
        value = self.expr()
        self.expect(close)
        return value

    def single(self) -> Any:
        """One LaTeX argument without braces: a single digit, letter or command (\\frac12)."""
        c = self.peek()
        if c.isdigit():
            self.i += 1
            return self.sp.Integer(int(c))
        return self.atom()

    def arg(self) -> Any:
        return self.group("{", "}") if self.peek() == "{" else self.single()

    def atom(self) -> Any:
        sp, c = self.sp, self.peek()
        if c == "(":
            return self.group("(", ")")
        if c == "{":
            return self.group("{", "}")
        if c.isdigit() or c == ".":
            return self.number()
        if c == "\\":
            return self.command_atom()
        if c.isalpha() and c.isascii():
            self.i += 1
            return {"e": sp.E, "i": sp.I}.get(c) or sp.Symbol(c)
        raise ParseError(f"unexpected {c!r}")

    def number(self) -> Any:
        m = re.match(r"\d*\.?\d*", self.s[self.i :])
        text = m.group(0) if m else ""
        if not text or text == ".":
            raise ParseError("bad number")
        if len(text) > MAX_DIGITS:
            raise ParseError("number literal too long")
        self.i += len(text)
        base = re.match(r"_(?:\{(\d{1,2})\}|(\d))", self.s[self.i :]) if "." not in text else None
        if base:  # a numeral in another base: 52_8, 4210_{5}
            self.i += len(base.group(0))
            try:
                return self.sp.Integer(int(text, int(base.group(1) or base.group(2))))
            except ValueError as e:
                raise ParseError(
                    f"not a base-{base.group(1) or base.group(2)} numeral: {text}"
                ) from e
        if "." in text and self.exact_decimals:
            value = Fraction(text)
            return self.sp.Rational(value.numerator, value.denominator)
        if "." in text:
            # a Float remembers that the answer was written as a decimal (see `same`)
            return self.sp.Float(text, max(15, len(text)))
        return self.sp.Integer(int(text))  # int("033") == 33: leading zeros are not octal

    def command_atom(self) -> Any:
        sp, cmd = self.sp, self.command()
        if cmd is None or cmd.startswith("?") or cmd in _OPS:
            raise ParseError(f"unknown command {cmd!r}")
        self.i += 1 + len(cmd)
        if cmd == "frac":
            num, den = self.arg(), self.arg()
            return num / den
        if cmd == "binom":
            n, k = self.arg(), self.arg()
            if not (n.is_Integer and k.is_Integer and 0 <= int(n) <= 10_000):
                raise ParseError("binomial of non-integers or too large")
            return sp.binomial(n, k)
        if cmd == "sqrt":
            root = self.group("[", "]") if self.peek() == "[" else sp.Integer(2)
            return _checked_pow(sp, self.arg(), 1 / root)
        if cmd == "pi":
            return sp.pi
        if cmd == "infty":
            return sp.oo
        if cmd == "e":
            return sp.E
        if cmd in _GREEK:  # a variable named by a Greek letter (\\pi is the constant above)
            return sp.Symbol(cmd)
        return self.function(cmd)

    def function(self, name: str) -> Any:
        sp = self.sp
        base = None
        if name == "log" and self.eat("_"):
            base = self.arg()
        power = None
        if base is None and self.eat(
            "^"
        ):  # \\sin^2 x is (\\sin x)^2; \\sin^{-1} is ambiguous, refused
            power = self.exponent()
            if not (power.is_Integer and 1 <= int(power) <= 10):
                raise ParseError("a function power other than 1..10 (\\sin^{-1} is ambiguous)")
        arg = self.group("(", ")") if self.peek() == "(" else self.power()
        fn = {"arcsin": sp.asin, "arccos": sp.acos, "arctan": sp.atan, "ln": sp.log}.get(
            name
        ) or getattr(sp, name)
        value = sp.log(arg, base) if base is not None else fn(arg)
        return value if power is None else value**power


def _checked_pow(sp: Any, base: Any, exp: Any) -> Any:
    """base**exp, refusing numbers too large to build (a tower of exponents)."""
    if exp.is_number and base.is_number:
        bits = 0.0
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            e = abs(complex(sp.N(exp, 15)))
            b = abs(complex(sp.N(base, 15)))
            bits = e * math.log2(b) if b > 1 else (e if b < 1 and b != 0 else 0.0)
        if not bits <= MAX_POWER_BITS:  # also NaN
            raise ParseError("power too large to evaluate")
        if exp.has(sp.oo, sp.zoo, sp.nan):
            raise ParseError("power with an infinite exponent")
    return sp.Pow(base, exp)


def parse_math(text: str, exact_decimals: bool = False) -> Any:
    """One expression of a final answer as a sympy object (ParseError if not readable)."""
    if len(text) > MAX_ANSWER_CHARS:
        raise ParseError("answer too long")
    return Parser(text, exact_decimals).parse()


# --------------------------------------------------------------------------- structure
def _split_top(s: str) -> list[str]:
    depth, parts, cur = 0, [], []
    for ch in s:
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _expand_pm(parts: list[str]) -> list[str]:
    """``a \\pm b`` stands for the two answers ``a + b`` and ``a - b``."""
    out = []
    for part in parts:
        if part.count("\\pm") == 1:
            out += [part.replace("\\pm", "+"), part.replace("\\pm", "-")]
        else:
            out.append(part)
    return out


class Solutions(tuple):
    """A bare comma list (``1, 2, 3``, ``a \\pm b``): solutions, compared in any order; ``(1, 2, 3)`` is an ordered tuple."""

    __slots__ = ()


# normalised text has no spaces: "\\le x" is "\\lex", read as \\le then x (\\left is gone by then)
_RELATION = re.compile(r"(\\leq(?:slant)?|\\le|\\geq(?:slant)?|\\ge|\\neq|\\ne(?!g)|<|>|=)")
_REL_OPS = {"\\leq": "<=", "\\le": "<=", "\\geq": ">=", "\\ge": ">=", "\\neq": "!=", "\\ne": "!="}
_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "=": "=", "!=": "!="}


class Relation:
    """An equation or inequality chain: ``x = 3 = 5`` is sides (x, 3, 5) with ops ("=", "=")."""

    __slots__ = ("ops", "sides")

    def __init__(self, sides: tuple, ops: tuple[str, ...]):
        self.sides, self.ops = sides, ops

    def reversed(self) -> Relation:
        return Relation(self.sides[::-1], tuple(_FLIP[o] for o in self.ops[::-1]))

    @property
    def is_equation(self) -> bool:
        return all(o == "=" for o in self.ops)


def _relation(s: str, exact: bool) -> Relation | None:
    """`s` as a relation chain when it has a relation outside brackets and no top-level comma."""
    if len(_split_top(s)) > 1 or not _RELATION.search(s):
        return None
    pieces = _RELATION.split(s)
    sides, ops, depth = [], [], 0
    for k, piece in enumerate(pieces):
        if k % 2 and depth == 0:
            ops.append(_REL_OPS.get(piece, piece))
            sides.append("")
        elif k % 2:  # a relation inside brackets, \{x | x > 0\}: not a chain we read
            return None
        else:
            sides[-1:] = [(sides[-1] if sides else "") + piece]
            depth += sum(1 if c in "([{" else -1 if c in ")]}" else 0 for c in piece)
    return Relation(tuple(parse_math(side, exact) for side in sides), tuple(ops))


def to_sympy(ans: str, exact_decimals: bool = False) -> Any:
    """A sympy object for an answer: a number/expression, a tuple, set, interval, matrix or `Relation`."""
    sp, exact = _sympy(), exact_decimals
    s = normalize(ans)
    if not s:
        raise ParseError("empty answer")
    if len(s) > MAX_ANSWER_CHARS:
        raise ParseError("answer too long")
    if re.fullmatch(r"[A-Za-z][a-z]{2,}", s):  # a word answer ("Monday", "gray")
        return sp.Symbol(s.lower())
    s = re.sub(r"^[a-zA-Z]\\in", "", s)  # "x \in [a, b]"
    matrix = re.fullmatch(r"\\begin\{[pbv]?matrix\}(.*)\\end\{[pbv]?matrix\}", s)
    if matrix:
        rows = [r for r in matrix.group(1).split("\\\\") if r]
        return sp.ImmutableMatrix([[parse_math(c, exact) for c in r.split("&")] for r in rows])
    if "\\cup" in s:
        return sp.Union(*(to_sympy(part, exact) for part in s.split("\\cup")))
    if s.startswith("\\{") and s.endswith("\\}"):
        return sp.FiniteSet(*(parse_math(p, exact) for p in _expand_pm(_split_top(s[2:-2]))))
    relation = _relation(s, exact)
    if relation is not None:
        return relation
    interval = re.fullmatch(r"([\[(])([^,]+),([^,]+)([\])])", s)
    if interval and not re.search(r"[\[(].*[\[(]", s[1:]):
        lo, hi = parse_math(interval.group(2), exact), parse_math(interval.group(3), exact)
        if bool((lo < hi) == sp.true):  # "(2,-3)" is a point, not an empty interval
            return sp.Interval(lo, hi, interval.group(1) == "(", interval.group(4) == ")")
        return (lo, hi)
    if "," in s or "\\pm" in s:
        bracketed = s[0] in "([" and s[-1] in ")]" and "," in s
        parts = _expand_pm(_split_top(s[1:-1] if bracketed else s))
        values = (parse_math(p, exact) for p in parts)
        return tuple(values) if bracketed else Solutions(values)
    return parse_math(s, exact)


# --------------------------------------------------------------------------- equality
def _close(a: complex, b: complex) -> bool:
    if not all(math.isfinite(v) for v in (a.real, a.imag, b.real, b.imag)):
        return False
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def _same_number(a: Any, b: Any) -> bool:
    sp = _sympy()
    if a == b:
        return True
    if a.is_Rational and b.is_Rational:
        return False  # exact numbers (integers included): no tolerance
    fa, fb = a.has(sp.Float), b.has(sp.Float)
    if fa or fb:
        exact = b if fa else a
        if not (fa and fb) and not exact.is_Rational and exact.is_number:
            return False  # a decimal is never accepted for an exact irrational (3.14159 vs \pi)
        try:
            return _close(complex(sp.N(a, 20)), complex(sp.N(b, 20)))
        except (TypeError, ValueError):
            return False
    diff = sp.simplify(a - b)
    if diff == 0:
        return True
    if diff.is_zero is False:  # sympy proves them different: \pi(1+10^{-30}) is not \pi
        return False
    if a.is_number and b.is_number:  # exact forms simplify could not match: 45 digits must agree
        va, vb = complex(sp.N(a, 60)), complex(sp.N(b, 60))
        gap = complex(sp.N(diff, 60))
        return all(math.isfinite(v) for v in (va.real, va.imag)) and abs(gap) <= 1e-45 * max(
            abs(va), abs(vb), 1e-300
        )
    return False


def _free(x: Any) -> set:
    if isinstance(x, (tuple, Relation)):
        return set().union(*(_free(y) for y in getattr(x, "sides", x)))
    return set(getattr(x, "free_symbols", ()))


def _is_name(side: Any, value: Any) -> bool:
    """A side that only names the answer: ``x``, ``f(2)`` (read 2f), sharing no variable with it."""
    syms = _free(side)
    if not syms or syms & _free(value):
        return False
    return bool(
        side.is_Symbol or (side.is_Mul and all(f.is_Symbol or f.is_number for f in side.args))
    )


def equation_mismatch(rel: Relation, value: Any) -> str | None:
    """Why the equation `rel` is not the answer `value` (None when it is).

    Every side that is not a mere name (``x``, ``f(2)``) must equal the value, and at least
    one must: ``x = 5`` is 5, ``7 = 5`` and ``x = 3 = 5`` are not.
    """
    if not rel.is_equation:
        return "an inequality is not a value"
    matched = False
    for side in rel.sides:
        if _is_name(side, value):
            continue
        if not same(side, value):
            return f"the side {side} of the equation is not the answer"
        matched = True
    return None if matched else "no side of the equation is the answer"


def _named_value(rel: Relation) -> Any:
    """The value of ``name = value`` (either way round), else None."""
    if len(rel.sides) != 2 or not rel.is_equation:
        return None
    lhs, rhs = rel.sides
    for name, value in ((lhs, rhs), (rhs, lhs)):
        if name.is_Symbol and not value.free_symbols:
            return value
    return None


def _same_chain(a: Relation, b: Relation) -> bool:
    sp = _sympy()
    if a.ops != b.ops or len(a.sides) != len(b.sides):
        return False
    if len(a.sides) == 2 and a.is_equation:
        va, vb = _named_value(a), _named_value(b)
        if va is not None and vb is not None:
            return same(va, vb)  # x = 5 and y = 5 both say 5
        ratio = sp.simplify((a.sides[0] - a.sides[1]) / (b.sides[0] - b.sides[1]))
        return bool(ratio.is_number and ratio != 0)  # the same equation up to a constant factor
    return all(same(x, y) for x, y in zip(a.sides, b.sides, strict=True))


def _same_relation(a: Any, b: Any) -> bool:
    if isinstance(a, Relation) and isinstance(b, Relation):
        return _same_chain(a, b) or _same_chain(a.reversed(), b)
    rel, value = (a, b) if isinstance(a, Relation) else (b, a)
    return equation_mismatch(rel, value) is None


def _same_tuple(a: Any, b: Any) -> bool:
    if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) != len(b):
        return False
    if all(same(x, y) for x, y in zip(a, b, strict=True)):
        return True
    if not (isinstance(a, Solutions) and isinstance(b, Solutions)):
        return False  # a tuple (point, ordered pair) matches in order only, even as a bare list
    rest = list(b)  # unordered match (a list of solutions)
    for x in a:
        hit = next((k for k, y in enumerate(rest) if same(x, y)), None)
        if hit is None:
            return False
        rest.pop(hit)
    return True


def _same_set(a: Any, b: Any) -> bool:
    """Sets compared through `same`, so a decimal endpoint meets its exact value: [0.5, 1) is [1/2, 1)."""
    sp = _sympy()
    if isinstance(a, sp.Interval) and isinstance(b, sp.Interval):
        return (a.left_open, a.right_open) == (b.left_open, b.right_open) and all(
            same(x, y) for x, y in ((a.start, b.start), (a.end, b.end))
        )
    if isinstance(a, sp.FiniteSet) and isinstance(b, sp.FiniteSet):
        return _same_tuple(Solutions(a.args), Solutions(b.args))
    if isinstance(a, sp.Union) and isinstance(b, sp.Union) and len(a.args) == len(b.args):
        return all(_same_set(x, y) for x, y in zip(a.args, b.args, strict=True))
    return a == b


def same(a: Any, b: Any) -> bool:
    """Whether two parsed answers are the same mathematical object (see the module doc)."""
    sp = _sympy()
    if isinstance(a, Relation) or isinstance(b, Relation):
        return _same_relation(a, b)
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Solutions) and isinstance(y, sp.FiniteSet):
            return _same_tuple(x, Solutions(y.args))  # a bare list of solutions is a set
    if isinstance(a, tuple) or isinstance(b, tuple):
        return _same_tuple(a, b)
    if isinstance(a, sp.Set) or isinstance(b, sp.Set):
        return _same_set(a, b)
    if isinstance(a, sp.MatrixBase) or isinstance(b, sp.MatrixBase):
        return getattr(a, "shape", None) == getattr(b, "shape", None) and all(
            same(x, y) for x, y in zip(a, b, strict=True)
        )
    try:
        return _same_number(a, b)
    except (TypeError, ValueError, AttributeError, ArithmeticError, RecursionError):
        return False


# --------------------------------------------------------------------------- the judge's rules
class Decision(NamedTuple):
    """Our judge's verdict on one answer, and the rule that reached it."""

    correct: bool
    #: the answer and the reference were both read (else math-verify decides, if it can)
    confident: bool
    #: 'exact' (normalised strings equal), 'symbolic', 'numeric' or 'refused'
    rule: str
    why: str


_HEDGES = re.compile(
    r"\\approx|\\sim(?![a-z])|\\lor\b|\\vee\b|\?|\b(?:or|either|maybe|perhaps|probably|approx(?:imately)?"
    r"|about|roughly|around|nearly|almost|wait|not|no|guess)\b",
    re.I,
)
_DECIMAL = re.compile(r"(?<![\d.])\d*\.\d")
_PLAIN_DECIMAL = re.compile(r"[+-]?\d*\.(\d+)")
_PLACES = {"tenth": 1, "hundredth": 2, "thousandth": 3, "ten-thousandth": 4, "tenthousandth": 4}
_COUNT_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_NEAREST = re.compile(r"nearest\s+(ten[- ]?thousandth|tenth|hundredth|thousandth)", re.I)
_N_PLACES = re.compile(r"\b(\d|one|two|three|four|five|six)\s+decimal\s+(?:places?|digits?)", re.I)
_ASKS_DECIMAL = re.compile(
    r"\bas\s+a\s+decimal\b|\bdecimal\s+(?:form|approximation|number)\b|\bin\s+decimals?\b"
    r"|\bsignificant\s+(?:figures|digits)\b|\bround(?:ed|ing)?\s+(?:your\s+answer\s+)?(?:to|off)\b",
    re.I,
)


def stated_precision(problem: str | None) -> int | None:
    """Decimal places a problem asks for (0: a decimal, no precision stated); None: exact only."""
    if not problem:
        return None
    if m := _NEAREST.search(problem):
        return _PLACES[m.group(1).lower().replace(" ", "")]
    if m := _N_PLACES.search(problem):
        word = m.group(1).lower()
        return int(word) if word.isdigit() else _COUNT_WORDS[word]
    return 0 if _ASKS_DECIMAL.search(problem) else None


def _hedge(pred: str, ref: str) -> str | None:
    """A hedge in `pred` that the reference does not share ("5 or 7", "\\approx 5", "5?")."""
    low = ref.lower()
    return next((m.group(0) for m in _HEDGES.finditer(pred) if m.group(0).lower() not in low), None)


def _refusal(a: Any, b: Any) -> str | None:
    """A structural reason `a` cannot be the answer `b`, decided before any comparison."""
    sp = _sympy()
    for x, y in ((a, b), (b, a)):
        if isinstance(x, sp.FiniteSet) and (
            isinstance(y, sp.Interval) or (isinstance(y, tuple) and not isinstance(y, Solutions))
        ):
            return "a set never matches a tuple or an interval"
    if isinstance(a, Relation) and not isinstance(b, Relation):
        return equation_mismatch(a, b)
    if isinstance(b, Relation) and not b.is_equation and not isinstance(a, Relation):
        return "a value is not an inequality"
    return None


def _approximation(pred: str, b: Any, places: int) -> Decision | None:
    """A plain decimal judged as a rounding of `b` (the problem asks for a decimal or a precision)."""
    sp = _sympy()
    m = _PLAIN_DECIMAL.fullmatch(pred)
    if m is None or not (isinstance(b, sp.Expr) and b.is_number and b.is_real):
        return None
    k = len(m.group(1))
    if k < places:
        return Decision(
            False, True, "refused", f"{k} decimal places where the problem asks {places}"
        )
    if places == 0 and len(re.sub(r"\D", "", pred).lstrip("0")) < MIN_DECIMAL_DIGITS:
        return Decision(False, True, "refused", "too few significant digits for a decimal")
    value = Fraction(pred)
    gap = sp.N(abs(sp.Rational(value.numerator, value.denominator) - b), 30)
    ok = bool(gap <= sp.Rational(1, 2 * 10**k) * (1 + sp.Rational(1, 10**12)))
    return Decision(ok, True, "numeric", f"within half a unit of its last place: {ok}")


def decide(pred: str, ref: str, string_match: bool = True, places: int | None = None) -> Decision:
    """Our judge: string equality, then the rules (hedges, structure, equations), then equality.

    `places` comes from the problem (`stated_precision`): None means exact answers only, so
    a decimal is read as the exact number it writes (``0.5`` is 1/2, ``0.333333`` is not 1/3);
    otherwise a plain decimal may be a rounding of the reference to its own last place.
    """
    p, r = normalize(pred), normalize(ref)
    if string_match and p == r:
        return Decision(True, True, "exact", "the normalised strings are equal")
    hedge = _hedge(pred, ref)
    if hedge:
        return Decision(False, True, "refused", f"the answer hedges ({hedge!r})")
    try:
        b = to_sympy(ref)
        a = to_sympy(pred, exact_decimals=places is None)
    except Exception as e:  # noqa: BLE001 - unparsable means "not shown equal", and not confident
        return Decision(False, False, "refused", f"our reader cannot read it: {str(e)[:80]}")
    try:
        why = _refusal(a, b)
        if why:
            return Decision(False, True, "refused", why)
        if places is not None and (approx := _approximation(p, b, places)) is not None:
            return approx
        ok = bool(same(a, b))
    except Exception as e:  # noqa: BLE001
        return Decision(False, False, "refused", f"comparison failed: {type(e).__name__}")
    rule = "numeric" if _DECIMAL.search(p) or _DECIMAL.search(r) else "symbolic"
    return Decision(ok, True, rule, "equal" if ok else "not equal")


def canonical_verdict(
    pred: str, ref: str, string_match: bool = True, places: int | None = None
) -> tuple[bool, bool]:
    """Our judge's verdict and whether it is confident (string-equal, or both sides read as math)."""
    d = decide(pred, ref, string_match, places)
    return d.correct, d.confident


def canonical_equal(pred: str, ref: str, string_match: bool = True) -> bool:
    """Our own judge's verdict: normalised strings, then the parsed answers compared.

    ``string_match=False`` skips the string shortcut, so both sides must be read as
    mathematics (used to measure how much of a data set the reader understands).
    """
    return canonical_verdict(pred, ref, string_match)[0]


# --------------------------------------------------------------------------- multi-part
_AND = re.compile(r"\\text\{\s*(?:and|or)\s*\}|\s+(?:and|or)\s+|;")
_WRAPPERS = (("\\{", "\\}"), ("(", ")"), ("[", "]"))


def _unwrap(s: str) -> str | None:
    """The inside of one bracket pair that encloses all of `s`, else None."""
    for open_, close in _WRAPPERS:
        if s.startswith(open_) and s.endswith(close) and len(s) > len(open_) + len(close):
            inner = s[len(open_) : -len(close)]
            depth = 0
            for ch in inner:
                depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
                if depth < 0:
                    return None
            return inner if depth == 0 else None
    return None


def split_parts(pred: str, n: int) -> list[str] | None:
    """A predicted multi-part answer as `n` parts ("3, 5", "(3, 5)", "\\{3, 5\\}", "3 and 5"), else None."""
    s = pred.strip().strip("$").strip().replace("\\left", "").replace("\\right", "")
    s = re.sub(r"^\\boxed\s*\{(.*)\}$", r"\1", s, flags=re.S)
    s = _AND.sub(",", s)
    for candidate in (s, _unwrap(s.strip())):
        if candidate is not None:
            parts = [p.strip() for p in _split_top(candidate)]
            if len(parts) == n and all(parts):
                return parts
    return None


def _match(cells: list[list[bool | None]], ordered: bool) -> bool | None:
    """All parts matched (in order, or one-to-one in any order); None if a needed verdict is missing."""
    n = len(cells)
    if ordered:
        diag = [cells[i][i] for i in range(n)]
        return None if None in diag else all(diag)
    if any(None in row for row in cells):
        return None
    free = list(range(n))

    def assign(i: int) -> bool:  # backtracking: n is small (the parts of one answer)
        if i == n:
            return True
        for j in list(free):
            if cells[i][j]:
                free.remove(j)
                if assign(i + 1):
                    return True
                free.append(j)
        return False

    return assign(0)


def _parts_rule(rules: set[str], correct: bool) -> str:
    """The rule named for a multi-part verdict: the weakest rule any part needed."""
    if not correct and "refused" in rules:
        return "refused"
    return next(r for r in ("numeric", "symbolic", "exact") if r in rules or r == "exact")


def judge_parts(
    pred: str,
    parts: list[str],
    ordered: bool,
    inner_timeout_s: int = 3,
    string_match: bool = True,
    places: int | None = None,
) -> dict[str, Any]:
    """Both verdicts for a multi-part reference: every part must match (in order unless unordered)."""
    got = split_parts(pred, len(parts))
    if got is None:
        why = f"expected {len(parts)} comma-separated parts"
        return {
            "math_verify": False,
            "canonical": False,
            "canonical_confident": True,
            "rule": "refused",
            "why": why,
            "error": why,
        }
    n = len(parts)
    pairs = [(i, i) for i in range(n)] if ordered else [(i, j) for i in range(n) for j in range(n)]
    mv: list[list[bool | None]] = [[None] * n for _ in range(n)]
    ours: list[list[bool | None]] = [[False] * n for _ in range(n)]
    confident, errors, rules = True, [], set()
    for i, j in pairs:
        res = judge(got[i], parts[j], inner_timeout_s, string_match, places)
        mv[i][j], ours[i][j] = res["math_verify"], res["canonical"]
        confident = confident and res["canonical_confident"]
        errors += [res["error"]] if res["error"] else []
        rules.add(res["rule"])
    correct = bool(_match(ours, ordered))
    return {
        "math_verify": _match(mv, ordered),
        "canonical": correct,
        "canonical_confident": confident,
        "rule": _parts_rule(rules, correct),
        "why": f"{len(parts)} parts, {'in order' if ordered else 'in any order'}: {correct}",
        "error": "; ".join(errors)[:300] or None,
    }


# --------------------------------------------------------------------------- worker
def _math_verify(pred: str, ref: str, timeout_s: int) -> bool | None:
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    gold = parse(f"\\boxed{{{ref}}}", parsing_timeout=timeout_s)
    got = parse(f"\\boxed{{{pred}}}", parsing_timeout=timeout_s)
    if not gold or not got:
        return None if not gold else False
    return bool(verify(gold, got, timeout_seconds=timeout_s))


def judge(
    pred: str,
    ref: str,
    inner_timeout_s: int = 3,
    string_match: bool = True,
    places: int | None = None,
) -> dict[str, Any]:
    """Both verdicts for one answer (math-verify and ours, with our rule); runs in the verifier sandbox."""
    out: dict[str, Any] = {
        "math_verify": None,
        "canonical": None,
        "canonical_confident": False,
        "rule": "refused",
        "why": None,
        "error": None,
    }
    try:
        out["math_verify"] = _math_verify(pred, ref, inner_timeout_s)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"math_verify: {type(e).__name__}: {e}"[:300]
    try:
        d = decide(pred, ref, string_match, places)
        out.update(canonical=d.correct, canonical_confident=d.confident, rule=d.rule, why=d.why)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"canonical: {type(e).__name__}: {e}"[:300]
    return out


def worker_main() -> None:
    """The verifier worker: JSON requests on stdin, JSON verdicts on stdout."""
    import json
    import sys

    with contextlib.suppress(ImportError):
        import math_verify  # noqa: F401 - warm import before the first request
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints of a parser must not corrupt the protocol
    # sympy imports much of itself lazily on the first simplify: pay that before "ready", under
    # the start-up deadline, not under the first answer's
    judge("x^2+2x+1", "(x+1)^2", 3)
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            pred, ref, inner, string_match, *rest = json.loads(line)
            # optional [parts, ordered, places]: a multi-part reference, the problem's precision
            parts, ordered, places = [*rest, *[None, True, None][len(rest) :]][:3]
            places = None if places is None else int(places)
            if parts:  # [..., parts, ordered, places]: a multi-part reference
                reply = judge_parts(
                    str(pred),
                    [str(p) for p in parts],
                    bool(ordered),
                    int(inner),
                    bool(string_match),
                    places,
                )
            else:
                reply = judge(str(pred), str(ref), int(inner), bool(string_match), places)
        except (ValueError, TypeError) as e:
            reply = {"math_verify": None, "canonical": False, "error": f"bad request: {e}"[:300]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    import resource
    import sys

    sys.path.pop(0)  # run as a script: import sympy and math_verify, never this file's neighbours
    if len(sys.argv) > 1:  # the address-space cap (MiB) of this worker
        limit = int(sys.argv[1]) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    worker_main()
