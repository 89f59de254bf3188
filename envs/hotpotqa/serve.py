"""`trace-gym serve-retriever`: serve an index over HTTP (Search-R1's /retrieve), N workers.

The index is loaded once (memory-mapped when it is a directory), its kernels compiled,
and ``--workers`` processes forked from it by a `Supervisor` that health-checks them and
takes them all down with it (`trace_gym.envs.hotpotqa.supervisor`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from trace_gym.envs.hotpotqa.server import ServerLimits
from trace_gym.envs.hotpotqa.supervisor import Supervisor, SupervisorOptions, WorkerFailed

from trace_gym.cli import Parser
from trace_gym.errors import ConfigError

__all__ = ["main"]


def _limit_flags(ap: argparse.ArgumentParser) -> None:
    for name, value in ServerLimits().__dict__.items():
        flag = "--" + name.replace("_", "-")
        ap.add_argument(flag, type=type(value), default=value, help=f"(default: {value})")


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="trace-gym serve-retriever", description=main.__doc__)
    ap.add_argument(
        "--index",
        default="bm25",
        help="an index directory from `trace-gym corpus build` (memory-mapped), or a kind (bm25, "
        "dense-flat, dense-hnsw, pyserini) to index the bundled corpus (default: bm25)",
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes sharing the index and the socket (default: 1)",
    )
    _limit_flags(ap)
    return ap


def main(argv: list[str]) -> int:
    """Serve a retrieval index over HTTP (Search-R1's /retrieve)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from trace_gym.envs.hotpotqa.data import load_bundled
    from trace_gym.envs.hotpotqa.retrievers import KINDS, load_retriever, open_retriever

    try:
        limits = ServerLimits(**{k: getattr(args, k) for k in ServerLimits().__dict__})
        options = SupervisorOptions(workers=args.workers)
        if args.index in KINDS:
            retriever = open_retriever(args.index, load_bundled()[1])
        elif Path(args.index).is_dir():
            retriever = load_retriever(args.index, mmap=True)
        else:
            retriever = open_retriever(args.index)  # says what it expected
        retriever.warm_up()  # before the fork: no worker waits for a JIT compile
        supervisor = Supervisor(retriever, args.host, args.port, limits, options)
    except (ConfigError, OSError, ImportError) as e:
        print(f"trace-gym serve-retriever: {e}", file=sys.stderr)
        return 2
    try:
        supervisor.start()
    except (OSError, WorkerFailed) as e:
        supervisor.stop()
        print(f"trace-gym serve-retriever: {e}", file=sys.stderr)
        return 2
    print(
        f"serving {retriever.describe()} at {supervisor.url}/retrieve with {args.workers} "
        f"worker{'s' if args.workers > 1 else ''} (Ctrl-C to stop)",
        flush=True,
    )
    supervisor.serve_forever()
    return 0
