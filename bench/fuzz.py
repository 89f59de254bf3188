"""`trace-gym bench fuzz`: hostile actions into every env, timed, counting exceptions.

Model text is hostile, so every env must answer any string with an observation. This
benchmark makes each env by its registered id (`gym.make`; the core knows envs only by
id) and sends it a seeded stream of actions (`fuzz_action`): the env's own plausible
actions, mutations of them, random Unicode (lone surrogates, Arabic-Indic digits,
controls, right-to-left marks), tag and bracket floods, deep nesting, digit runs and
messages over the env's `max_action_chars`. An episode that ends is reset; an exception
is recorded and the env is reset (or re-made) so the run goes on.

It reports per env: actions, exceptions, step time (mean, p50, p99, max) and the max step
time against the env's configured step limit + 1 s (`step_limit_s`). Figures are
reported, never asserted (the fuzz tests under tests/fuzz assert no exception).
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from trace_gym.cli import Parser
from trace_gym.core import TraceEnv, unwrap
from trace_gym.errors import ConfigError

__all__ = ["FuzzReport", "fuzz_action", "fuzz_env", "main", "step_limit_s"]

#: fragments of the protocols of every env: tags, fences, calls, answers, brackets
FRAGMENTS = (
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "```python\n",
    "```",
    "\\boxed{",
    "}",
    "{",
    "[",
    "]",
    "(",
    ")",
    '"',
    "'",
    "\\",
    "action ",
    "answer",
    "print(",
    "import os\n",
    "\n",
    " ",
    "\u202e",
    "\x00",
    "\ud800",
    "\u0663",
)
#: code-point ranges random text is drawn from (ASCII, Latin-1, Arabic-Indic digits,
#: combining marks, bidi controls, surrogates, CJK, private use, astral emoji)
_RANGES = (
    (0x20, 0x7F),
    (0x00, 0x20),
    (0xA0, 0x100),
    (0x660, 0x66A),
    (0x300, 0x370),
    (0x200B, 0x2030),
    (0xD800, 0xE000),
    (0x4E00, 0x4F00),
    (0xE000, 0xE100),
    (0x1F600, 0x1F650),
)


def _text(rng: np.random.Generator, n: int) -> str:
    lo, hi = _RANGES[int(rng.integers(len(_RANGES)))]
    return "".join(map(chr, rng.integers(lo, hi, size=n)))


def _mutate(rng: np.random.Generator, text: str) -> str:
    chars = list(text) or [" "]
    for _ in range(int(rng.integers(1, 6))):
        i = int(rng.integers(len(chars)))
        op = int(rng.integers(3))
        if op == 0:
            del chars[i]
        elif op == 1:
            chars.insert(i, _text(rng, 1))
        else:
            chars[i] = FRAGMENTS[int(rng.integers(len(FRAGMENTS)))]
        chars = chars or [" "]
    text = "".join(chars)
    return text[: int(rng.integers(len(text) + 1))] if rng.random() < 0.2 else text  # cut short


def _flood(rng: np.random.Generator, limit: int) -> str:
    """A long run of protocol fragments (a regex or parser gone quadratic shows here)."""
    n = int(rng.choice([10, 1_000, 10_000, max(1, limit // 4)]))
    parts = rng.integers(len(FRAGMENTS), size=int(rng.integers(1, 4)))
    return "".join(FRAGMENTS[int(p)] for p in parts) * max(1, n // 8)


def _deep(rng: np.random.Generator, limit: int) -> str:
    k = int(rng.choice([100, 1_000, max(1, limit // 4)]))
    opener, closer = [("[", "]"), ('{"a":', "}"), ("f(", ")"), ("\\boxed{", "}"), ("((", "))")][
        int(rng.integers(5))
    ]
    return (
        opener * k + ("1" if rng.random() < 0.5 else "") + closer * (k if rng.random() < 0.5 else 0)
    )


def fuzz_action(rng: np.random.Generator, env: TraceEnv) -> str:
    """One hostile (or plausible) action for `env`'s current state, drawn with `rng`."""
    limit = int(env.max_action_chars)
    kind = rng.random()
    if kind < 0.25:
        return env.example_action(rng)
    if kind < 0.45:
        return _mutate(rng, env.example_action(rng))
    if kind < 0.65:
        return _text(rng, int(rng.integers(0, 200)))
    if kind < 0.75:
        return (
            "action " + "9" * int(rng.choice([1, 12, 5_000]))
            if rng.random() < 0.5
            else "action " + _text(rng, 3)
        )
    if kind < 0.83:
        return _flood(rng, limit)
    if kind < 0.91:
        return _deep(rng, limit)
    if kind < 0.96:
        return ["", " ", "\n" * 50, "\t\r\x0b\x0c", "\x00" * 10][int(rng.integers(5))]
    return "x" * (limit + int(rng.integers(1, 1000)))  # over the cap: an observation, not parsed


def step_limit_s(env: TraceEnv) -> float:
    """The longest one step may take by the env's configuration (0 when nothing can stall).

    An env declares it as ``step_time_limit_s``; the sandboxed Math env's cell timeout
    (``config.cell_timeout_s``) is read until it declares one.
    """
    declared = getattr(env, "step_time_limit_s", None)
    if declared is None:
        declared = getattr(getattr(env, "config", None), "cell_timeout_s", None)
    return float(declared or 0.0)


@dataclass
class FuzzReport:
    """What one env did with `actions` fuzzed actions."""

    env_id: str
    actions: int
    seed: int
    exceptions: int = 0
    #: the first few exceptions: (action index, one-line error, the action's first 200 characters)
    examples: list[tuple[int, str, str]] = field(default_factory=list)
    episodes: int = 0
    rejected_too_long: int = 0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_s: float = 0.0
    limit_s: float = 0.0
    wall_s: float = 0.0

    @property
    def within_limit(self) -> bool:
        """Whether the slowest step took at most the configured limit + 1 s."""
        return self.max_s <= self.limit_s + 1.0


def _record(report: FuzzReport, i: int, action: str, error: BaseException) -> None:
    report.exceptions += 1
    if len(report.examples) < 5:
        line = traceback.format_exception_only(type(error), error)[-1].strip()
        report.examples.append((i, line, ascii(action[:200])))


def fuzz_env(
    env_id: str, actions: int = 10_000, seed: int = 0, make: Callable[[], gym.Env] | None = None
) -> FuzzReport:
    """Send `actions` fuzzed actions to a fresh `env_id` env; never raises for an env's fault."""
    make = make or (lambda: gym.make(env_id))
    rng = np.random.default_rng(seed)
    report = FuzzReport(env_id, actions, seed)
    env = make()
    base = unwrap(env)
    report.limit_s = step_limit_s(base)
    env.reset(seed=seed)
    times: list[float] = []
    start = time.perf_counter()
    try:
        for i in range(actions):
            action, t0 = "", time.perf_counter()
            try:  # example_action is env code too: its exceptions count
                action = fuzz_action(rng, base)
                t0 = time.perf_counter()
                _, _, term, trunc, info = env.step(action)
            except Exception as e:  # noqa: BLE001 - counting them is the point
                times.append(time.perf_counter() - t0)
                _record(report, i, action, e)
                env, base = _recover(env, make, seed + i)
                continue
            times.append(time.perf_counter() - t0)
            report.rejected_too_long += info.get("error") == "action_too_long"
            if term or trunc:
                report.episodes += 1
                env.reset(seed=int(rng.integers(2**31)))
    finally:
        env.close()
    report.wall_s = time.perf_counter() - start
    if times:
        report.mean_ms = 1e3 * statistics.fmean(times)
        report.p50_ms = 1e3 * float(np.quantile(times, 0.5))
        report.p99_ms = 1e3 * float(np.quantile(times, 0.99))
        report.max_s = max(times)
    return report


def _recover(env: gym.Env, make: Callable[[], gym.Env], seed: int) -> tuple[gym.Env, TraceEnv]:
    """After an exception: reset the env, or make a new one if it cannot even reset."""
    try:
        env.reset(seed=seed)
        return env, unwrap(env)
    except Exception:  # noqa: BLE001
        env.close()
        env = make()
        env.reset(seed=seed)
        return env, unwrap(env)


def _print_table(reports: list[FuzzReport]) -> None:
    head = f"{'env':<20} {'actions':>8} {'exceptions':>10} {'too long':>8} {'mean ms':>8} {'p50 ms':>8} {'p99 ms':>8} {'max s':>7} {'limit+1 s':>9}  ok"
    print(head)
    for r in reports:
        ok = "yes" if r.exceptions == 0 and r.within_limit else "NO"
        print(
            f"{r.env_id:<20} {r.actions:>8} {r.exceptions:>10} {r.rejected_too_long:>8} {r.mean_ms:>8.2f} "
            f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.max_s:>7.3f} {r.limit_s + 1:>9.1f}  {ok}"
        )
        for i, line, action in r.examples:
            print(f"    action {i}: {line}  <- {action[:100]}")


def main(argv: list[str] | None = None) -> int:
    """Fuzz every registered env (or --envs) and print step times and exception counts."""
    from trace_gym.registration import env_ids

    p = Parser(prog="trace-gym bench fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--envs",
        default=",".join(env_ids()),
        help="comma-separated env ids (default: every registered id)",
    )
    p.add_argument("--actions", type=int, default=10_000, help="actions per env")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the reports here as JSON")
    args = p.parse_args(argv)
    if args.actions < 1:
        raise ConfigError(f"--actions must be >= 1, got {args.actions}")
    ids = [e.strip() for e in args.envs.split(",") if e.strip()]
    from trace_gym.registration import check_env_id

    for env_id in ids:
        check_env_id(env_id)
    reports = [fuzz_env(env_id, args.actions, args.seed) for env_id in ids]
    _print_table(reports)
    if args.json:
        rows: list[dict[str, Any]] = [
            {**asdict(r), "within_limit": r.within_limit} for r in reports
        ]
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0
