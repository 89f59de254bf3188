"""`trace-gym bench bfcl-parse`: parse+check time of hostile BFCL actions by size and format.

For every action format the env reads (python calls: many calls, many arguments, deep
nesting, long strings, operator chains, unbalanced brackets; JSON; Hermes blocks; think
blocks; garbage) it builds actions of each size and times `parse_action` with the
default `ParseLimits` (best of several runs), the same parse with no limits (up to
``--unbounded-max`` characters: what the limits save), and one `BFCLEnv.step` of the
action (parse, limits, execution, observation). Per row it reports the time ratio against
the format's smallest size beside the size ratio: linear means the two are about equal,
and a time ratio well under the size ratio means a limit cut the work short.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from trace_gym.envs.bfcl.parsing import ParseLimits, parse_action

from trace_gym.cli import Parser
from trace_gym.errors import ConfigError

__all__ = ["FORMATS", "main", "run"]

_OPEN = ParseLimits(max_calls=10**9, max_depth=10**9, max_tokens=10**9)


def _fill(head: str, unit: str, tail: str, n: int) -> str:
    """`head` + `unit` repeated + `tail`, about `n` characters long."""
    return head + unit * max(1, (n - len(head) - len(tail)) // len(unit)) + tail


def _deep(open_: str, close: str, head: str, tail: str) -> Callable[[int], str]:
    """`head`, `open_` k times, a 1, `close` k times, `tail`: about n characters."""

    def build(n: int) -> str:
        k = max(1, (n - len(head) - len(tail) - 1) // (len(open_) + len(close)))
        return head + open_ * k + "1" + close * k + tail

    return build


#: format -> action of about n characters
FORMATS: dict[str, Callable[[int], str]] = {
    "python_calls": lambda n: _fill("[", "f(a=1), ", "g()]", n),
    "python_kwargs": lambda n: _fill("f(", "a=1, ", "b=2)", n),
    "python_ints": lambda n: _fill("f(a=[", "1,", "1])", n),
    "python_deep": _deep("[", "]", "f(a=", ")"),
    "python_long_string": lambda n: _fill("f(a='", "x", "')", n),
    "python_operators": lambda n: _fill("f(a=", "1<", "1)", n),
    "python_unbalanced": lambda n: _fill("f(a=", "[(", "", n),
    "python_quotes": lambda n: _fill("f(a='", "\\'", "", n),
    "json_call": lambda n: _fill('{"name": "f", "arguments": {"a": [', "1, ", "1]}}", n),
    "json_deep": _deep('{"a": ', "}", '{"name": "f", "arguments": ', "}"),
    "json_calls": lambda n: _fill("[", '{"name": "f"}, ', '{"name": "g"}]', n),
    "hermes_blocks": lambda n: _fill("", '<tool_call>{"name": "f"}</tool_call>\n', "", n),
    "hermes_python": lambda n: _fill("", "<tool_call>f(a=[1, 2])</tool_call>\n", "", n),
    "think_then_call": lambda n: _fill("<think>", "hmm (", "</think>[f(a=1)]", n),
    "garbage": lambda n: _fill("", "a(b[c{d'e\"f\\g<h>i ", "", n),
}


def _best_s(fn: Callable[[], Any], budget_s: float = 0.2, max_runs: int = 30) -> float:
    """The fastest of several runs of `fn` (as many as fit `budget_s`, at least 2)."""
    t0 = time.perf_counter()
    fn()
    best = time.perf_counter() - t0
    for _ in range(min(max_runs, max(1, int(budget_s / max(best, 1e-6)))) - 1):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _outcome(parsed: Any) -> str:
    if parsed.limit:
        return f"refused:{parsed.limit}"
    return f"{parsed.syntax}:{len(parsed.calls)} calls,{len(parsed.errors)} errors"


def run(
    sizes: list[int], formats: list[str] | None = None, unbounded_max: int = 100_000
) -> dict[str, Any]:
    """Time every format at every size; returns the JSON report (rows and a summary)."""
    from trace_gym.envs.bfcl.env import BFCLEnv

    env = BFCLEnv(categories=("base",))
    names = formats or list(FORMATS)
    rows: list[dict[str, Any]] = []
    for name in names:
        first: dict[str, Any] | None = None
        for n in sizes:
            action = FORMATS[name](n)
            parse_s = _best_s(lambda a=action: parse_action(a))
            unbounded_s = (
                _best_s(lambda a=action: parse_action(a, _OPEN), budget_s=0.0)
                if len(action) <= unbounded_max
                else None
            )
            step_s = float("inf")
            for _ in range(3):
                env.reset(options={"task": "multi_turn_base_0"})
                t0 = time.perf_counter()
                env.step(action)
                step_s = min(step_s, time.perf_counter() - t0)
            row = {
                "format": name,
                "chars": len(action),
                "parse_ms": 1e3 * parse_s,
                "unbounded_parse_ms": None if unbounded_s is None else 1e3 * unbounded_s,
                "step_ms": 1e3 * step_s,
                "outcome": _outcome(parse_action(action)),
            }
            first = first or row
            row["size_ratio"] = row["chars"] / first["chars"]
            row["time_ratio"] = row["parse_ms"] / max(first["parse_ms"], 1e-9)
            rows.append(row)
    env.close()
    worst = max(rows, key=lambda r: r["time_ratio"] / r["size_ratio"])
    return {
        "load_avg": list(os.getloadavg()),
        "limits": asdict(ParseLimits()),
        "max_action_chars": env.max_action_chars,
        "sizes": sizes,
        "rows": rows,
        "summary": {
            "max_parse_ms": max(r["parse_ms"] for r in rows),
            "max_step_ms": max(r["step_ms"] for r in rows),
            "worst_time_ratio_over_size_ratio": worst["time_ratio"] / worst["size_ratio"],
            "worst_row": f"{worst['format']}@{worst['chars']}",
        },
    }


def _print(report: dict[str, Any]) -> None:
    load = ", ".join(f"{x:.2f}" for x in report["load_avg"])
    print(f"BFCL action parse+check by size (load average {load}); limits {report['limits']}")
    print(
        f"{'format':<20} {'chars':>8} {'parse ms':>9} {'no-limit ms':>11} {'step ms':>8} "
        f"{'size x':>7} {'time x':>7}  outcome"
    )
    for r in report["rows"]:
        unb = "-" if r["unbounded_parse_ms"] is None else f"{r['unbounded_parse_ms']:.2f}"
        print(
            f"{r['format']:<20} {r['chars']:>8} {r['parse_ms']:>9.3f} {unb:>11} "
            f"{r['step_ms']:>8.2f} {r['size_ratio']:>7.0f} {r['time_ratio']:>7.1f}  {r['outcome']}"
        )
    s = report["summary"]
    print(
        f"max parse {s['max_parse_ms']:.2f} ms, max step {s['max_step_ms']:.2f} ms; worst "
        f"time ratio / size ratio {s['worst_time_ratio_over_size_ratio']:.2f} ({s['worst_row']}; "
        "linear: <= 1 within noise)"
    )


def main(argv: list[str]) -> int:
    """Entry point of ``trace-gym bench bfcl-parse``."""
    p = Parser(prog="trace-gym bench bfcl-parse", description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes",
        default="1000,5000,20000,100000,1000000",
        help="comma-separated action sizes in characters",
    )
    p.add_argument("--formats", default=None, help=f"comma-separated, of: {', '.join(FORMATS)}")
    p.add_argument(
        "--unbounded-max",
        type=int,
        default=100_000,
        help="time the no-limits parse up to this many characters",
    )
    p.add_argument("--json", default=None, help="write the report to this path")
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--sizes must be comma-separated integers, got {args.sizes!r}") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--sizes must be positive integers, got {args.sizes!r}")
    formats = [f.strip() for f in args.formats.split(",")] if args.formats else None
    unknown = sorted(set(formats or ()) - set(FORMATS))
    if unknown:
        raise ConfigError(f"unknown --formats {unknown}; choose from {', '.join(FORMATS)}")
    report = run(sizes, formats, args.unbounded_max)
    _print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    return 0
