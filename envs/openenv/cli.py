"""`trace-gym serve-openenv ENV_ID`: serve a trace env as an OpenEnv environment.

Arguments are checked before OpenEnv is imported, so a usage error needs no extra
installed; the server itself is `trace_gym.envs.openenv.server`.
"""

from __future__ import annotations

from trace_gym.cli import Parser, parse_env_kwargs
from trace_gym.errors import ConfigError
from trace_gym.optional import require

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Serve a trace env as an OpenEnv environment (WebSocket /ws, HTTP /reset /step /state)."""
    ap = Parser(prog="trace-gym serve-openenv", description=main.__doc__)
    ap.add_argument("env_id", help="a registered env id, e.g. trace/Math-v0")
    ap.add_argument("--env-kwargs", default="{}", help="JSON object of gym.make kwargs")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument(
        "--max-sessions", type=int, default=64, help="concurrent WebSocket sessions (64)"
    )
    args = ap.parse_args(argv)
    if args.max_sessions < 1:
        raise ConfigError(f"--max-sessions must be >= 1, got {args.max_sessions}")
    from trace_gym.envs.openenv.server import make_app

    app = make_app(args.env_id, parse_env_kwargs(args.env_kwargs), max_sessions=args.max_sessions)
    uvicorn = require("uvicorn", "openenv")
    print(f"serving {args.env_id} as OpenEnv at ws://{args.host}:{args.port}/ws", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
