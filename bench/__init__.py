"""The application layer: every benchmark (`trace-gym bench ...`), the demo, reports, plots and the HTML viewer.

It stands above the core, envs, agents and trainers and imports them plainly (nothing
below imports it). Env benchmarks that import nothing above their env stay beside it
(`trace_gym.envs.<env>.bench`).
"""
