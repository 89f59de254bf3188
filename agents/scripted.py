"""Scripted policies: noisy oracles with a tunable skill, one per environment.

Each is a `Policy` (batched ``generate``) seeded only by ``Conversation.seed``: the same
conversation always gives the same turn. ``skill`` in [0, 1] is the chance that a
decision is the oracle's; otherwise the policy errs in an env-typical way (a vague
search, a wrong answer, a malformed tool call, a code cell with a bug), so trees mix
successes and failures and allocation has something to do.

- ``trace/Sim-v0``: the simulator's own `SimPolicy` (its skill is the preset's, so that
  ``env.true_value()`` describes it; ``skill`` is not applied);
- ``trace/HotpotQA-v0``: searches the supporting-fact titles, then answers (the gold
  answer with probability ``skill``);
- ``trace/BFCL-v0``: replays the ground-truth calls, each corrupted with
  probability ``1 - skill``;
- ``trace/Math-v0``: writes a code cell that prints the reference answer, then boxes
  what the interpreter printed (a perturbed answer with probability ``1 - skill``).

`SCRIPTED[env_id]` holds the classes; `make_scripted(env_id, skill=..., env=...)` builds
one (the env, or a fresh one, gives access to the task's reference data).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from trace_gym.errors import ConfigError, unknown
from trace_gym.policy import Conversation, PolicyOutput

__all__ = ["SCRIPTED", "ScriptedPolicy", "make_env", "make_scripted"]


def make_env(env_id: str, **kwargs: Any) -> Any:
    """`gym.make(env_id)` for registered ids, plus the test env ``trace/Countdown-v0``."""
    if env_id == "trace/Countdown-v0":
        from trace_gym.testing import CountdownEnv

        return CountdownEnv(**kwargs)
    import gymnasium as gym

    import trace_gym  # noqa: F401  (registers the ids)

    return gym.make(env_id, **kwargs)


class ScriptedPolicy:
    """Base: per-conversation seeded decisions; subclasses write one turn's text."""

    env_id = ""

    def __init__(self, env: Any = None, skill: float = 0.8, **kwargs: Any):
        if not 0.0 <= skill <= 1.0:
            raise ConfigError(f"skill must be in [0, 1], got {skill}")
        self.skill = float(skill)
        self.env = env if env is not None else make_env(self.env_id, **kwargs)
        self.calls = 0

    @property
    def unwrapped(self) -> Any:
        return self.env.unwrapped

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        self.calls += 1
        out = []
        for conv in conversations:
            rng = np.random.default_rng(conv.seed)
            try:
                out.append(PolicyOutput(text=self.turn(conv, rng)))
            except Exception as e:  # a scripted bug must not take the batch down
                out.append(PolicyOutput(text="", error=f"scripted: {e!r}"))
        return out

    def ok(self, rng: np.random.Generator) -> bool:
        """One decision: the oracle's with probability `skill`."""
        return bool(rng.random() < self.skill)

    def turn(self, conv: Conversation, rng: np.random.Generator) -> str:
        raise NotImplementedError


class CountdownScripted(ScriptedPolicy):
    """`CountdownEnv` (tests): adds toward the target, answers the total."""

    env_id = "trace/Countdown-v0"

    def turn(self, conv: Conversation, rng: np.random.Generator) -> str:
        target = int(re.search(r"Reach (\d+)", conv.prompt).group(1))  # type: ignore[union-attr]
        total = 0
        for t in conv.turns:
            if m := re.search(r"total=(-?\d+)", t.observation):
                total = int(m.group(1))
        if total >= target:
            return f"answer {total}"
        step = min(3, target - total) if self.ok(rng) else int(rng.integers(1, 4))
        return f"add {step}"


class SimScripted:
    """`trace/Sim-v0` through the simulator's own `SimPolicy` (the preset's skill; `skill` is recorded only)."""

    env_id = "trace/Sim-v0"

    def __init__(self, env: Any = None, skill: float = 0.8, **kwargs: Any):
        from trace_gym.sim import SimPolicy

        preset = kwargs.get("preset")
        if env is not None:
            preset = getattr(env.unwrapped, "preset", preset)
        self.skill = float(skill)
        self.inner = SimPolicy(preset)

    def set_step(self, step: int) -> None:
        self.inner.set_step(step)

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        # token ids of SimPolicy are fake (word hashes): drop them so token backends
        # downstream (SFT, critics) tokenise the text themselves
        return [PolicyOutput(text=o.text, error=o.error) for o in self.inner.generate(conversations)]


#: env id -> scripted policy class (filled below as env modules are importable)
SCRIPTED: dict[str, type] = {
    "trace/Countdown-v0": CountdownScripted,
    "trace/Sim-v0": SimScripted,
}


def make_scripted(env_id: str, *, skill: float = 0.8, env: Any = None, **kwargs: Any) -> Any:
    """A scripted policy for `env_id` (`env` gives it the task data; else it makes one)."""
    _register_env_policies()
    if env_id not in SCRIPTED:
        raise unknown("scripted policy (env id)", env_id, SCRIPTED)
    return SCRIPTED[env_id](env=env, skill=skill, **kwargs)


def _register_env_policies() -> None:
    """Add the real envs' scripted policies (imported lazily: they pull the env modules)."""
    from trace_gym.agents import scripted_envs

    for env_id, cls in scripted_envs.POLICIES.items():
        SCRIPTED.setdefault(env_id, cls)
