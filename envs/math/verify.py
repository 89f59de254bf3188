"""Answer checking for trace/Math-v0: math-verify in a killable worker, sympy fallback.

`math_verify` bounds its own work with ``signal.alarm``, which only works in a main
thread and can still hang on adversarial input (a tower of exponents, a huge
factorial). So every check runs in a separate worker process (`VerifierPool`) with a
hard wall-clock deadline; a worker that overruns is killed and replaced, and the answer
counts as wrong with ``timed_out`` in the details.

Two judges run side by side: math-verify (the reward when it gives a verdict) and our
own canonicaliser (`canonical_equal`: string normalisation, then a small LaTeX-to-sympy
reader with exact and numeric comparison), which is the fallback when math-verify is
not installed, errors or times out.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, NamedTuple

from trace_gym.errors import ConfigError, TraceGymError

__all__ = ["Verdict", "VerifierPool", "canonical_equal", "judge", "normalize", "verify_answer"]

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- normalise
_UNIT_WORDS = (
    r"units?|cm|m|km|mm|inch(?:es)?|feet|foot|ft|yards?|miles?|meters?|centimeters?|degrees?|"
    r"seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|years?|dollars?|cents?|square|sq|cubic|mph|pounds?|"
    r"ounces?|kg|g|grams?|people|students?|ways|dots|points?|cookies|marbles|coins|times"
)
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox|textrm)\s*\{([^{}]*)\}")
_TRAILING_UNITS = re.compile(
    rf"(?:\s|\\[ ,;!])*(?:\\(?:text|mbox)\{{\s*(?:{_UNIT_WORDS})\b[^{{}}]*\}}(?:\^\{{?[23]\}}?)?|\s(?:{_UNIT_WORDS})\b.*)$", re.I
)


def normalize(ans: str) -> str:
    """A canonical string form: no $, spacing commands, \\left/\\right, units or dfrac."""
    s = ans.strip()
    s = s.strip("$").strip().rstrip(".").strip()
    s = s.replace("{,}", "").replace("\\textnormal", "\\text")
    s = re.sub(r",\\!(?=\d{3})", "", s)  # 29,\!322 -> 29322
    s = re.sub(r"^\\boxed\s*\{(.*)\}$", r"\1", s, flags=re.S)
    s = _TRAILING_UNITS.sub("", s)
    s = re.sub(r"(?<=\d)(?:\s|\\[ ,;!])*\\(?:text|mbox)\{\s*[a-zA-Z]+\s*\}$", "", s)  # 21\text{ dogs}
    for a, b in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""),
                 ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("^\\circ", ""), ("^{\\circ}", ""),
                 ("\\%", ""), ("%", ""), ("\\$", ""), ("\\displaystyle", "")):
        s = s.replace(a, b)
    s = _TEXT.sub(r"\1", s)
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 5" -> "5"
    s = re.sub(r"^(\d+)\s*:\s*(\d+)$", r"\\frac{\1}{\2}", s)  # a ratio 3:5
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"(\d),(\d{3})(?!\d)", r"\1\2", s) if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", s) else s
    return s


# --------------------------------------------------------------------------- sympy reader
def _braced(s: str, i: int) -> tuple[str, int]:
    """The content of the brace group starting at s[i] == '{' and the index after it."""
    depth, j = 0, i
    while j < len(s):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1 : j], j + 1
        j += 1
    raise ValueError("unbalanced braces")


def _arg(s: str, i: int) -> tuple[str, int]:
    """One LaTeX argument: a brace group or a single character."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] == "{":
        return _braced(s, i)
    m = re.match(r"\\[a-zA-Z]+", s[i:])
    if m:
        return m.group(0), i + len(m.group(0))
    return s[i : i + 1], i + 1


def latex_to_python(s: str) -> str:
    """Translate the LaTeX of a typical final answer into a sympy-parsable string."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("\\frac", i) or s.startswith("\\binom", i):
            binom = s.startswith("\\binom", i)
            a, i = _arg(s, i + (6 if binom else 5))
            b, i = _arg(s, i)
            a, b = latex_to_python(a), latex_to_python(b)
            out.append(f"binomial({a},{b})" if binom else f"(({a})/({b}))")
        elif s.startswith("\\sqrt", i):
            i += 5
            root = "2"
            if i < len(s) and s[i] == "[":
                j = s.index("]", i)
                root, i = latex_to_python(s[i + 1 : j]), j + 1
            a, i = _arg(s, i)
            out.append(f"(({latex_to_python(a)})**(1/({root})))")
        elif s[i] == "{":
            a, i = _braced(s, i)
            out.append(f"({latex_to_python(a)})")
        elif s[i] == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[i:])
            name = m.group(1) if m else ""
            i += 1 + len(name) if m else 2
            out.append({"pi": "pi", "cdot": "*", "times": "*", "infty": "oo", "div": "/",
                        "ln": "log", "log": "log", "sin": "sin", "cos": "cos", "tan": "tan",
                        "exp": "exp", "e": "E"}.get(name, " " if not m else name))
        elif s[i] == "^":
            out.append("**")
            i += 1
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def to_sympy(ans: str) -> Any:
    """A sympy object for an answer: a number/expression, a tuple, or an interval."""
    import sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    s = normalize(ans)
    if not s:
        raise ValueError("empty answer")
    if re.fullmatch(r"[A-Za-z][a-z]{2,}", s):  # a word answer ("Monday", "gray")
        return sympy.Symbol(s.lower())
    tf = (*standard_transformations, implicit_multiplication_application, convert_xor)

    def one(x: str) -> Any:
        return parse_expr(latex_to_python(x), transformations=tf, evaluate=True, local_dict=names)

    # single letters are variables (sympy would read N, S, Q, O as its own functions)
    names = {c: sympy.Symbol(c) for c in "abcdfghjklmnopqrstuvwxyzABCDFGHJKLMNOPQRSTUVWXYZ"}
    names.update({"e": sympy.E, "E": sympy.E, "pi": sympy.pi, "i": sympy.I, "I": sympy.I})

    s = re.sub(r"^[a-zA-Z]\\in", "", s)  # "x \in [a, b]"
    matrix = re.fullmatch(r"\\begin\{[pbv]?matrix\}(.*)\\end\{[pbv]?matrix\}", s)
    if matrix:
        rows = [r for r in matrix.group(1).split("\\\\") if r]
        return sympy.ImmutableMatrix([[one(c) for c in r.split("&")] for r in rows])
    if "\\cup" in s:
        return sympy.Union(*(to_sympy(part) for part in s.split("\\cup")))
    if s.count("=") == 1:
        lhs, rhs = s.split("=")
        return sympy.Eq(one(lhs), one(rhs), evaluate=False)
    interval = re.fullmatch(r"([\[(])([^,]+),([^,]+)([\])])", s)
    if interval and not re.search(r"[\[(].*[\[(]", s[1:]):
        lo, hi = one(interval.group(2)), one(interval.group(3))
        if bool((lo < hi) == sympy.true):  # "(2,-3)" is a point, not an empty interval
            return sympy.Interval(lo, hi, interval.group(1) == "(", interval.group(4) == ")")
        return (lo, hi)
    if "," in s:
        inner = s[1:-1] if s[0] in "([{" and s[-1] in ")]}" else s
        depth, parts, cur = 0, [], ""
        for ch in inner:
            depth += ch in "([{" and 1 or ch in ")]}" and -1 or 0
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        return tuple(one(p) for p in parts)
    return one(s)


def _same(a: Any, b: Any) -> bool:
    import sympy

    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) != len(b):
            return False
        if all(_same(x, y) for x, y in zip(a, b, strict=True)):
            return True
        rest = list(b)  # unordered match (a list of solutions)
        for x in a:
            hit = next((k for k, y in enumerate(rest) if _same(x, y)), None)
            if hit is None:
                return False
            rest.pop(hit)
        return True
    if isinstance(a, sympy.Set) or isinstance(b, sympy.Set):
        return a == b
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        return getattr(a, "shape", None) == getattr(b, "shape", None) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, sympy.Equality) or isinstance(b, sympy.Equality):
        if not (isinstance(a, sympy.Equality) and isinstance(b, sympy.Equality)):
            return False
        da, db = a.lhs - a.rhs, b.lhs - b.rhs  # the same equation up to a constant factor
        ratio = sympy.simplify(da / db)
        return bool(ratio.is_number and ratio != 0)
    if a == b:
        return True
    if isinstance(a, sympy.Rational) and isinstance(b, sympy.Rational):
        return False  # exact numbers: no tolerance
    try:
        diff = sympy.simplify(a - b)
        if diff == 0:
            return True
        va, vb = complex(sympy.N(a)), complex(sympy.N(b))
        if not all(math.isfinite(v) for v in (va.real, va.imag, vb.real, vb.imag)):
            return False
        return abs(va - vb) <= 1e-6 * max(1.0, abs(vb))
    except (TypeError, ValueError, AttributeError, ArithmeticError):
        return False


def canonical_equal(pred: str, ref: str, string_match: bool = True) -> bool:
    """Our own canonicaliser's verdict: normalised strings, then sympy equivalence.

    ``string_match=False`` skips the string shortcut, so both sides must be read as
    mathematics (used to measure how much of a data set the sympy reader understands).
    """
    if string_match and normalize(pred) == normalize(ref):
        return True
    try:
        return bool(_same(to_sympy(pred), to_sympy(ref)))
    except Exception:  # noqa: BLE001 - unparsable means "not shown equal"
        return False


# --------------------------------------------------------------------------- judges
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


def judge(pred: str, ref: str, inner_timeout_s: int = 3, string_match: bool = True) -> dict[str, Any]:
    """Both verdicts for one answer (runs in the worker; also callable in-process)."""
    out: dict[str, Any] = {"math_verify": None, "canonical": None, "error": None}
    try:
        out["math_verify"] = _math_verify(pred, ref, inner_timeout_s)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"math_verify: {type(e).__name__}: {e}"[:300]
    try:
        out["canonical"] = canonical_equal(pred, ref, string_match)
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
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        pred, ref, inner, string_match = json.loads(line)
        out.write(json.dumps(judge(pred, ref, inner, string_match)) + "\n")
        out.flush()


class Verdict(NamedTuple):
    """The outcome of checking one final answer."""

    correct: bool
    method: str
    """'exact' (normalised strings equal), 'math_verify', 'canonical' or 'timeout'"""
    math_verify: bool | None
    canonical: bool | None
    timed_out: bool
    error: str | None

    def to_info(self) -> dict[str, Any]:
        return dict(self._asdict())


class _Worker:
    """One verifier process and its pipes."""

    def __init__(self, start_timeout_s: float):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from trace_gym.envs.math.verify import worker_main; worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        if self.readline(start_timeout_s) is None:
            self.kill()
            raise VerifierUnavailable("the math verifier worker did not start")

    def readline(self, timeout_s: float) -> dict | None:
        ready = select.select([self.proc.stdout], [], [], timeout_s)[0]
        if not ready:
            return None
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()  # type: ignore[union-attr]


class VerifierUnavailable(TraceGymError, RuntimeError):
    """The verifier worker process could not be started."""


class VerifierPool:
    """Worker processes that run `judge` under a hard deadline (killed when they overrun)."""

    def __init__(self, workers: int = 1, timeout_s: float = 10.0, inner_timeout_s: int = 3, start_timeout_s: float = 60.0):
        if workers < 1 or timeout_s <= 0 or inner_timeout_s < 1:
            raise ConfigError("VerifierPool needs workers >= 1, timeout_s > 0 and inner_timeout_s >= 1")
        self.timeout_s, self.inner_timeout_s, self.start_timeout_s = timeout_s, inner_timeout_s, start_timeout_s
        self._free: list[_Worker] = []
        self._slots = threading.Semaphore(workers)
        self._lock = threading.Lock()
        self._all: list[_Worker] = []

    def _take(self) -> _Worker:
        with self._lock:
            if self._free:
                return self._free.pop()
        worker = _Worker(self.start_timeout_s)
        with self._lock:
            self._all.append(worker)
        return worker

    def check(self, pred: str, ref: str, string_match: bool = True) -> dict[str, Any]:
        """Both verdicts, or ``{"timed_out": True}`` if the worker had to be killed."""
        with self._slots:
            worker = self._take()
            result = None
            try:
                worker.proc.stdin.write(json.dumps([pred, ref, self.inner_timeout_s, string_match]) + "\n")  # type: ignore[union-attr]
                worker.proc.stdin.flush()  # type: ignore[union-attr]
                result = worker.readline(self.timeout_s)
            except (OSError, ValueError):
                result = None
            if result is not None:
                with self._lock:
                    self._free.append(worker)
                return result
            worker.kill()
            with self._lock:
                self._all.remove(worker)
            return {"timed_out": True}

    def close(self) -> None:
        """Stop every worker."""
        with self._lock:
            workers, self._all, self._free = self._all, [], []
        for worker in workers:
            worker.kill()


_SHARED: dict[float, VerifierPool] = {}
_SHARED_LOCK = threading.Lock()


def default_pool(timeout_s: float = 10.0) -> VerifierPool:
    """The process-wide verifier pool for a deadline (started on first use, stopped at exit)."""
    with _SHARED_LOCK:
        pool = _SHARED.get(timeout_s)
        if pool is None:
            pool = _SHARED[timeout_s] = VerifierPool(timeout_s=timeout_s)
            atexit.register(pool.close)
        return pool


def verify_answer(pred: str, ref: str, pool: VerifierPool | None = None) -> Verdict:
    """Is `pred` mathematically equivalent to the reference `ref`?"""
    if normalize(pred) == normalize(ref) and normalize(ref):
        return Verdict(True, "exact", None, None, False, None)
    t0 = time.monotonic()
    res = (pool or default_pool()).check(pred, ref)
    if res.get("timed_out"):
        log.info("math verifier timed out after %.1fs on %r", time.monotonic() - t0, pred[:80])
        return Verdict(False, "timeout", None, None, True, None)
    mv, canon = res.get("math_verify"), res.get("canonical")
    if mv is not None:
        return Verdict(bool(mv), "math_verify", mv, canon, False, res.get("error"))
    return Verdict(bool(canon), "canonical", mv, canon, False, res.get("error"))
