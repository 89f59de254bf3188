"""trace/Math-v0: tool-integrated math with a persistent, sandboxed, snapshottable interpreter.

Modules: `env` (MathEnv), `sandbox` (the sandbox policy: start-up, interpreters,
snapshots), `_proc` (process primitives: channels, kernel-vouched pids, pidfds,
membership), `isolation` (bwrap / namespaces / none), `seccomp` (the filter),
`_sandbox_worker` (the code inside), `protocol` (parsing turns, wrapping output),
`verify` (the sandboxed verifier pool) and `_judge` (our eval-free answer grammar),
`data` (embedded default set and DeepScaleR-format loader), `bench`
(`trace-gym bench math-env`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MathEnv", "MathTask", "Sandbox", "SandboxConfig", "load_dataset", "verify_answer"]

_WHERE = {
    "MathEnv": "trace_gym.envs.math.env",
    "MathTask": "trace_gym.envs.math.data",
    "load_dataset": "trace_gym.envs.math.data",
    "Sandbox": "trace_gym.envs.math.sandbox",
    "SandboxConfig": "trace_gym.envs.math.sandbox",
    "verify_answer": "trace_gym.envs.math.verify",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(name)
