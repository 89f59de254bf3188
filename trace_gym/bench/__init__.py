"""Every benchmark of the core (`trace-gym bench ...`): allocation policies, solver speed, Ray throughput, and their reports.

Env benchmarks live with their envs (`trace_gym.envs.<env>.bench`) and are reached only by
their "module:function" strings in `trace_gym.cli.BENCHMARKS`.
"""
