"""OpenEnv both ways: serve a trace env as an OpenEnv environment (`server`), and use an
OpenEnv environment as a restorable trace env through `trace_gym.wrap` (`client`).

Needs the `openenv` package (``pip install "trace-gym[openenv]"``); docs/openenv.md.
"""
