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

Equality (`same`): integers and other exact rationals compare exactly; an answer with a
decimal compares with a relative tolerance (``1e-6`` of the larger magnitude, for every
magnitude), except against an exact irrational (a decimal is never accepted for
``\\pi`` or ``\\sqrt{2}``); symbolic answers must simplify to the same thing.
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any

MAX_ANSWER_CHARS = 2000
MAX_DIGITS = 400
MAX_POWER_BITS = 20_000
MAX_FACTORIAL = 500
MAX_DEPTH = 60
REL_TOL = 1e-6

# --------------------------------------------------------------------------- normalise
_UNIT_WORDS = (
    r"units?|cm|m|km|mm|inch(?:es)?|feet|foot|ft|yards?|miles?|meters?|centimeters?|degrees?|"
    r"seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|years?|dollars?|cents?|square|sq|cubic|mph|pounds?|"
    r"ounces?|kg|g|grams?|people|students?|ways|dots|points?|cookies|marbles|coins|times"
)
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf|boldsymbol|mbox|textrm)\s*\{([^{}]*)\}")
_TRAILING_UNITS = re.compile(
    rf"(?:\s|\\[ ,;!])*(?:\\(?:text|mbox)\{{\s*(?:{_UNIT_WORDS})\b[^{{}}]*\}}(?:\^\{{?[23]\}}?)?|\s(?:{_UNIT_WORDS})\b.*)$",
    re.I,
)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")


def normalize(ans: str) -> str:
    """A canonical string form: no $, spacing commands, \\left/\\right, units or dfrac."""
    s = ans.strip()
    s = s.strip("$").strip().rstrip(".").strip()
    s = s.replace("{,}", "").replace("\\textnormal", "\\text")
    s = re.sub(r",\\!(?=\d{3})", "", s)  # 29,\!322 -> 29322
    s = re.sub(r"^\\boxed\s*\{(.*)\}$", r"\1", s, flags=re.S)
    s = _TRAILING_UNITS.sub("", s)
    s = re.sub(
        r"(?<=\d)(?:\s|\\[ ,;!])*\\(?:text|mbox)\{\s*[a-zA-Z]+\s*\}$", "", s
    )  # 21\text{ dogs}
    for a, b in (
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("^\\circ", ""),
        ("^{\\circ}", ""),
        ("\\%", ""),
        ("%", ""),
        ("\\$", ""),
        ("\\displaystyle", ""),
    ):
        s = s.replace(a, b)
    s = _TEXT.sub(r"\1", s)
    s = re.sub(r"\\phantom\s*(?:\{[^{}]*\}|.)", "", s)  # an invisible placeholder: \phantom -1 is 1
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 5" -> "5"
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
    """Recursive descent over one normalised answer; `parse` returns a sympy expression."""

    def __init__(self, s: str):
        self.s, self.i, self.depth = s, 0, 0
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


def parse_math(text: str) -> Any:
    """One expression of a final answer as a sympy object (ParseError if not readable)."""
    if len(text) > MAX_ANSWER_CHARS:
        raise ParseError("answer too long")
    return Parser(text).parse()


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


def to_sympy(ans: str) -> Any:
    """A sympy object for an answer: a number/expression, a tuple, set, interval or matrix."""
    sp = _sympy()
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
        return sp.ImmutableMatrix([[parse_math(c) for c in r.split("&")] for r in rows])
    if "\\cup" in s:
        return sp.Union(*(to_sympy(part) for part in s.split("\\cup")))
    if s.startswith("\\{") and s.endswith("\\}"):
        return sp.FiniteSet(*(parse_math(p) for p in _expand_pm(_split_top(s[2:-2]))))
    if s.count("=") == 1:
        lhs, rhs = s.split("=")
        return sp.Eq(parse_math(lhs), parse_math(rhs), evaluate=False)
    interval = re.fullmatch(r"([\[(])([^,]+),([^,]+)([\])])", s)
    if interval and not re.search(r"[\[(].*[\[(]", s[1:]):
        lo, hi = parse_math(interval.group(2)), parse_math(interval.group(3))
        if bool((lo < hi) == sp.true):  # "(2,-3)" is a point, not an empty interval
            return sp.Interval(lo, hi, interval.group(1) == "(", interval.group(4) == ")")
        return (lo, hi)
    if "," in s or "\\pm" in s:
        bracketed = s[0] in "([" and s[-1] in ")]" and "," in s
        values = (parse_math(p) for p in _expand_pm(_split_top(s[1:-1] if bracketed else s)))
        return tuple(values) if bracketed else Solutions(values)
    return parse_math(s)


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
    if sp.simplify(a - b) == 0:
        return True
    if a.is_number and b.is_number:  # exact forms simplify could not match: 30 digits must agree
        va, vb = complex(sp.N(a, 40)), complex(sp.N(b, 40))
        return all(math.isfinite(v) for v in (va.real, va.imag)) and abs(va - vb) <= 1e-25 * max(
            abs(va), abs(vb), 1e-300
        )
    return False


def same(a: Any, b: Any) -> bool:
    """Whether two parsed answers are the same mathematical object (see the module doc)."""
    sp = _sympy()
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) != len(b):
            return False
        if all(same(x, y) for x, y in zip(a, b, strict=True)):
            return True
        if not (isinstance(a, Solutions) or isinstance(b, Solutions)):
            return False  # a tuple (point, ordered pair) matches in order only
        rest = list(b)  # unordered match (a list of solutions)
        for x in a:
            hit = next((k for k, y in enumerate(rest) if same(x, y)), None)
            if hit is None:
                return False
            rest.pop(hit)
        return True
    if isinstance(a, sp.Set) or isinstance(b, sp.Set):
        return a == b
    if isinstance(a, sp.MatrixBase) or isinstance(b, sp.MatrixBase):
        return getattr(a, "shape", None) == getattr(b, "shape", None) and all(
            same(x, y) for x, y in zip(a, b, strict=True)
        )
    if isinstance(a, sp.Equality) or isinstance(b, sp.Equality):
        if not (isinstance(a, sp.Equality) and isinstance(b, sp.Equality)):
            return False
        da, db = a.lhs - a.rhs, b.lhs - b.rhs  # the same equation up to a constant factor
        ratio = sp.simplify(da / db)
        return bool(ratio.is_number and ratio != 0)
    try:
        return _same_number(a, b)
    except (TypeError, ValueError, AttributeError, ArithmeticError, RecursionError):
        return False


def canonical_verdict(pred: str, ref: str, string_match: bool = True) -> tuple[bool, bool]:
    """Our judge's verdict and whether it is confident (string-equal, or both sides read as math)."""
    if string_match and normalize(pred) == normalize(ref):
        return True, True
    try:
        a, b = to_sympy(pred), to_sympy(ref)
    except Exception:  # noqa: BLE001 - unparsable means "not shown equal", and not confident
        return False, False
    try:
        return bool(same(a, b)), True
    except Exception:  # noqa: BLE001
        return False, False


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


def judge_parts(
    pred: str, parts: list[str], ordered: bool, inner_timeout_s: int = 3, string_match: bool = True
) -> dict[str, Any]:
    """Both verdicts for a multi-part reference: every part must match (in order unless unordered)."""
    got = split_parts(pred, len(parts))
    if got is None:
        return {
            "math_verify": False,
            "canonical": False,
            "canonical_confident": True,
            "error": f"expected {len(parts)} comma-separated parts",
        }
    n = len(parts)
    pairs = [(i, i) for i in range(n)] if ordered else [(i, j) for i in range(n) for j in range(n)]
    mv: list[list[bool | None]] = [[None] * n for _ in range(n)]
    ours: list[list[bool | None]] = [[False] * n for _ in range(n)]
    confident, errors = True, []
    for i, j in pairs:
        res = judge(got[i], parts[j], inner_timeout_s, string_match)
        mv[i][j], ours[i][j] = res["math_verify"], res["canonical"]
        confident = confident and res["canonical_confident"]
        errors += [res["error"]] if res["error"] else []
    return {
        "math_verify": _match(mv, ordered),
        "canonical": bool(_match(ours, ordered)),
        "canonical_confident": confident,
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
    pred: str, ref: str, inner_timeout_s: int = 3, string_match: bool = True
) -> dict[str, Any]:
    """Both verdicts for one answer (math-verify and ours); runs inside the verifier sandbox."""
    out: dict[str, Any] = {
        "math_verify": None,
        "canonical": None,
        "canonical_confident": False,
        "error": None,
    }
    try:
        out["math_verify"] = _math_verify(pred, ref, inner_timeout_s)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"math_verify: {type(e).__name__}: {e}"[:300]
    try:
        out["canonical"], out["canonical_confident"] = canonical_verdict(pred, ref, string_match)
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
            pred, ref, inner, string_match, *multi = json.loads(line)
            if multi and multi[0]:  # [..., parts, ordered]: a multi-part reference
                reply = judge_parts(
                    str(pred),
                    [str(p) for p in multi[0]],
                    bool(multi[1]),
                    int(inner),
                    bool(string_match),
                )
            else:
                reply = judge(str(pred), str(ref), int(inner), bool(string_match))
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
