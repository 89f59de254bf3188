"""`trace-gym`: the command-line entry point.

Each sub-command lives in the module that owns the feature and exposes
``main(argv: list[str]) -> int``; this file only routes, so ``trace-gym envs`` never
imports torch. Unknown commands list the known ones.

Errors are reported in one place (`run_command`): a `TraceGymError` (a bad config,
file or value), a usage error of a command's `Parser`, a gymnasium error (an unknown
env id) or an OS error on a user's file becomes one line on stderr and exit code 2,
never a traceback. Anything else is a bug and keeps its traceback. Every command builds
its arguments with `Parser`, and both help tables (`trace-gym --help`, `trace-gym bench
--help`) come from `help_table`.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import importlib
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

from trace_gym.errors import ConfigError, TraceGymError, UsageError, did_you_mean

__all__ = [
    "BENCHMARKS",
    "COMMANDS",
    "Parser",
    "UsageError",
    "bench_main",
    "envs_main",
    "help_table",
    "json_object",
    "main",
    "parse_env_kwargs",
    "run_command",
]

#: command -> "module:function" (function takes argv, returns an exit code)
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("trace_gym.cli:envs_main", "list the registered environments"),
    "demo": ("trace_gym.bench.demo:main", "run the main job on the embedded defaults"),
    "bench": ("trace_gym.cli:bench_main", "run a benchmark (see `trace-gym bench --help`)"),
    "corpus": (
        "trace_gym.corpora.cli:main",
        "build retrieval indexes (`trace-gym corpus build ...`)",
    ),
    "serve-retriever": (
        "trace_gym.envs.hotpotqa.serve:main",
        "serve an index over HTTP (Search-R1 /retrieve), N worker processes",
    ),
    "serve-openenv": (
        "trace_gym.envs.openenv.cli:main",
        "serve a trace env as an OpenEnv environment (WebSocket /ws, checkpoint calls)",
    ),
    "data": (
        "trace_gym.envs.hotpotqa.datacli:main",
        "convert or fetch HotpotQA data (`trace-gym data convert ...`)",
    ),
    "rollout": (
        "trace_gym.agents.rollout:main",
        "collect rollout trees with a policy and an allocator",
    ),
    "eval": ("trace_gym.agents.evaluate:main", "evaluate a policy on an env's evaluation split"),
    "train": ("trace_gym.trainers.cli:main", "train a policy from a config file"),
    "view": (
        "trace_gym.bench.view:main",
        "write an offline HTML page of rollout trees (`trace-gym view TREES.jsonl`)",
    ),
    "report": (
        "trace_gym.bench.report_html:main",
        "write an HTML report of a training run directory",
    ),
    "sim-calibrate": (
        "trace_gym.sim.calibrate:main",
        "simulator calibration figures; --fit: fit the v2 preset families",
    ),
}

#: benchmark -> "module:function"
BENCHMARKS: dict[str, tuple[str, str]] = {
    "alloc-speed": (
        "trace_gym.bench.alloc_speed:main",
        "exact allocation solvers: fast vs reference DP",
    ),
    "alloc": (
        "trace_gym.bench.alloc:main",
        "every allocation policy on the simulator or a real env",
    ),
    "view": (
        "trace_gym.bench.view_bench:main",
        "tree viewer at 1,000 trees x 50 nodes: page write and render time",
    ),
    "math-env": (
        "trace_gym.envs.math.bench:main",
        "sandboxed interpreter: cells/s, fork vs replay restore",
    ),
    "judge": (
        "trace_gym.envs.math.bench_judge:main",
        "math answer judge vs math-verify on pairs from real data",
    ),
    "retrieval": (
        "trace_gym.envs.hotpotqa.bench:main",
        "BM25 and dense retrieval speed and recall",
    ),
    "retriever-server": (
        "trace_gym.envs.hotpotqa.bench_server:main",
        "serve-retriever under 64 clients vs the old server",
    ),
    "bfcl": ("trace_gym.envs.bfcl.bench:main", "BFCL env checkpoint/restore latency and steps/s"),
    "bfcl-parse": (
        "trace_gym.envs.bfcl.bench_parse:main",
        "BFCL action parse+check time by size and format (linear, bounded)",
    ),
    "wrap-restore": (
        "trace_gym.bench.wrap_restore:main",
        "trace_gym.wrap restore (replay, deepcopy) vs a native checkpoint",
    ),
    "openenv-restore": (
        "trace_gym.envs.openenv.bench:main",
        "an env served over OpenEnv, wrapped back: restore by server handle vs replay",
    ),
    "fuzz": (
        "trace_gym.bench.fuzz:main",
        "hostile actions into every env: exceptions and step times",
    ),
    "replay-cost": (
        "trace_gym.bench.replay_cost:main",
        "measured replay cost by depth (vLLM prefix cache, HF)",
    ),
    "generate": (
        "trace_gym.bench.generate:main",
        "tokens/s: raw generate vs HFPolicy / VLLMPolicy",
    ),
    "learn": (
        "trace_gym.bench.learn_cli:main",
        "RL on the simulator at equal cost: held-out success vs cost per arm",
    ),
    "async": (
        "trace_gym.bench.async_bench:main",
        "asynchronous rollouts (staleness 0, 1, 2): steps per hour vs synchronous",
    ),
    "train": (
        "trace_gym.bench.train:main",
        "FSDP2 sharded training vs one process: diffs, step time, memory per rank",
    ),
    "trl-dist": (
        "trace_gym.bench.trl_dist:main",
        "TRL on TRACE trees under accelerate: 2 processes vs 1 (trees, advantages, weights)",
    ),
}


def help_table(usage: str, heading: str, table: Mapping[str, tuple[str, str]]) -> str:
    """A help page: the usage line, then one row per entry of a routing table.

    Both tables share one name column (as wide as the longest name of either, plus two),
    so ``trace-gym --help`` and ``trace-gym bench --help`` line up, and a long name never
    pushes its help out of the column.
    """
    width = max(map(len, [*COMMANDS, *BENCHMARKS, *table])) + 2
    rows = [f"  {name:<{width}}{help_}" for name, (_, help_) in table.items()]
    return "\n".join([f"usage: {usage}", "", f"{heading}:", *rows])


def _load(target: str):
    module, func = target.split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            raise SystemExit(
                f"trace-gym: this command is not available in this build ({module} is missing)"
            ) from e
        raise
    return getattr(mod, func)


def json_object(flag: str, text: str) -> dict[str, Any]:
    """The JSON object a ``--...-kwargs`` flag holds, or a one-line `ConfigError` naming the flag."""
    how = f"{flag} must be a JSON object with double-quoted keys, e.g. '{{\"seed\": 1}}'"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{how}; got {text!r} ({e.msg} at column {e.colno})") from e
    if not isinstance(value, dict):
        raise ConfigError(f"{how}; got {text!r}")
    return value


def envs_main(argv: list[str]) -> int:
    """List the registered env ids, one line each."""
    Parser(prog="trace-gym envs", description=envs_main.__doc__).parse_args(argv)
    from trace_gym.registration import BUILTIN_ENVS

    width = max(len(e.id) for e in BUILTIN_ENVS)
    for e in BUILTIN_ENVS:
        print(f"{e.id:<{width}}  {e.summary}")
    return 0


def bench_main(argv: list[str]) -> int:
    """Dispatch `trace-gym bench NAME ...`."""
    if not argv or argv[0] in ("-h", "--help"):
        print(help_table("trace-gym bench NAME [options]", "benchmarks", BENCHMARKS))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(
            f"trace-gym bench: unknown benchmark {name!r}{did_you_mean(name, BENCHMARKS)}; "
            f"choose one of: {', '.join(BENCHMARKS)}",
            file=sys.stderr,
        )
        return 2
    return run_command(f"trace-gym bench {name}", _load(BENCHMARKS[name][0]), rest)


#: True while `run_command` runs a command: its parsers raise instead of exiting
_IN_COMMAND: contextvars.ContextVar[bool] = contextvars.ContextVar("in_command", default=False)


#: argparse's refusal of a `choices` value (Python 3.11-3.13 wording)
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<name>[^']*)' \(choose from (?P<known>.*)\)")


class Parser(argparse.ArgumentParser):
    """The argument parser of every command: a usage error raises `UsageError`.

    Under `run_command` (every ``trace-gym ...`` command) the error is raised, so the
    command ends the way every user error does: one line ``PROG: error: ...`` on stderr
    and exit code 2. A module run directly (``python -m ...``) keeps argparse's usage
    message and exit code 2. Sub-parsers made by `add_subparsers` are `Parser`s too.
    """

    def error(self, message: str) -> NoReturn:
        choice = _INVALID_CHOICE.search(message)
        if choice:  # argparse lists the choices; add the close ones
            name, known = choice["name"], re.findall(r"'([^']*)'", choice["known"])
            message += did_you_mean(name, known)
        if _IN_COMMAND.get():
            raise UsageError(f"{message} (see {self.prog} --help)")
        super().error(message)


def parse_env_kwargs(text: str) -> dict[str, Any]:
    """``--env-kwargs`` as a dict, or a one-line `ConfigError` that names the flag."""
    return json_object("--env-kwargs", text)


@contextlib.contextmanager
def _in_command() -> Iterator[None]:
    token = _IN_COMMAND.set(True)
    try:
        yield
    finally:
        _IN_COMMAND.reset(token)


def _is_user_error(e: BaseException) -> bool:
    """Ours, an OS error on a user's path, or gymnasium's (an id `gym.make` does not know)."""
    return isinstance(e, (TraceGymError, OSError)) or type(e).__module__ == "gymnasium.error"


def run_command(prog: str, func: Callable[[list[str]], int | None], argv: list[str]) -> int:
    """Run one command; a user error becomes one line ``PROG: error: ...`` on stderr and exit 2."""
    try:
        with _in_command():
            return int(func(argv) or 0)
    except Exception as e:
        if not _is_user_error(e):
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(help_table("trace-gym COMMAND [options]", "commands", COMMANDS))
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(
            f"trace-gym: unknown command {cmd!r}{did_you_mean(cmd, COMMANDS)}; "
            f"choose one of: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    return run_command(f"trace-gym {cmd}", _load(COMMANDS[cmd][0]), rest)


if __name__ == "__main__":
    # run the imported module's `main`: the commands' parsers read *its* `_IN_COMMAND`
    from trace_gym.cli import main as imported_main

    raise SystemExit(imported_main())
