"""Simulator presets: the frozen parameters of the simulated task pools.

Each preset was calibrated once, on statistics of the *non-adaptive* baselines only
(GRPO with 8 rollouts per prompt; random-branching tree rollouts), then frozen before
any allocator was compared on it. `trace_gym.sim.calibrate` reproduces the figures;
docs/sim.md lists them. Change a preset and the calibration tests say by how much.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from trace_gym.errors import ConfigError, unknown

__all__ = ["LUCK_PRESETS", "PRESETS", "SimPreset", "get_preset", "skill_at"]

_NAME = re.compile(r"^[a-z0-9_-]+$")
_STEM = re.compile(r"^[a-z0-9_]+$")


@dataclass(frozen=True)
class SimPreset:
    """The generative model of one simulated task pool (all fields are frozen numbers)."""

    #: short lowercase name; it is part of every task id (``sim-<name>-<seed>-<index>``)
    name: str
    #: K, the number of moves ("action 0" .. "action K-1") offered each turn
    num_actions: int = 3
    #: each task's turn count is drawn uniformly from [turns_min, turns_max]
    turns_min: int = 2
    turns_max: int = 4
    #: base success logit of a task ~ Normal(base_mean + topic offset, base_sd)
    base_mean: float = 0.0
    base_sd: float = 3.0
    #: spread of the topic offsets (a task feature visible in the prompt)
    topic_sd: float = 1.0
    #: a move shifts the logit by a task-, turn- and action-specific amount ~ Normal(0, delta_sd)
    delta_sd: float = 1.0
    #: logit shifts are rounded to this grid, so the exact value is a small dynamic programme
    grid: float = 0.25
    #: how strongly the simulated policy prefers moves that raise the logit (softmax slope)
    skill: float = 1.0
    #: skill gained per training step when drift is on, and its ceiling
    drift_per_step: float = 0.1
    skill_max: float = 4.0
    #: spread of the task-specific habits (action biases) of the simulated policy
    habit_sd: float = 0.5
    #: probability that a turn's text is malformed (a wasted turn)
    malformed_prob: float = 0.05
    #: chance of answering early per turn: answer_rate * sigmoid(answer_slope * (|logit| - answer_at))
    answer_rate: float = 0.3
    answer_slope: float = 2.0
    answer_at: float = 2.0
    #: noise (logit units) on the prompt's difficulty clue and on each turn's progress reading
    prompt_noise: float = 2.0
    obs_noise: float = 1.0
    #: task pool size when SimEnv is made without num_tasks
    num_tasks: int = 512
    # ---- simulator v2 (the defaults switch every v2 feature off: the v1 model exactly)
    #: the name inside task ids and the seed of the task draws ([a-z0-9_]+; "" = name)
    stem: str = ""
    #: topic vocabulary ("math", "hotpotqa", "bfcl"; "" = the stem's)
    domain: str = ""
    #: the share of V0 (1 - V0) resolved by moves before the final draw that the
    #: calibration fitted this preset to (a label; the model's knobs are below)
    resolved_share: float | None = None
    #: knife-edge turns per episode (at depths drawn uniformly) and the sd of their shifts
    knife_turns: int = 0
    knife_sd: float = 0.0
    #: hint categories shown before every turn; a move's shift gets a term
    #: ``shared_sd * E[domain, topic, hint, move]`` shared by every task of the domain
    num_hints: int = 0
    shared_sd: float = 0.0
    #: the progress reading after turn t has noise ``obs_noise * obs_decay ** t``
    obs_decay: float = 1.0

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(
                f"preset name {self.name!r} must match [a-z0-9_]+ (it goes into task ids)"
            )
        if self.num_actions < 1:
            raise ConfigError(f"num_actions must be >= 1, got {self.num_actions}")
        if not 1 <= self.turns_min <= self.turns_max:
            raise ConfigError(
                f"need 1 <= turns_min <= turns_max, got {self.turns_min}, {self.turns_max}"
            )
        for f in (
            "base_sd",
            "topic_sd",
            "delta_sd",
            "habit_sd",
            "prompt_noise",
            "obs_noise",
            "drift_per_step",
        ):
            if getattr(self, f) < 0:
                raise ConfigError(f"{f} must be >= 0, got {getattr(self, f)}")
        if self.grid <= 0:
            raise ConfigError(f"grid must be > 0, got {self.grid}")
        if not (0 <= self.malformed_prob < 1 and 0 <= self.answer_rate <= 1):
            raise ConfigError("malformed_prob must be in [0, 1) and answer_rate in [0, 1]")
        if self.malformed_prob + self.answer_rate >= 1:
            raise ConfigError(
                "malformed_prob + answer_rate must be < 1 (a turn must be able to move)"
            )
        if self.num_tasks < 1:
            raise ConfigError(f"num_tasks must be >= 1, got {self.num_tasks}")
        self._check_v2()

    def _check_v2(self) -> None:
        if self.stem and not _STEM.match(self.stem):
            raise ConfigError(f"preset stem {self.stem!r} must match [a-z0-9_]+")
        if not self.stem and not _STEM.match(self.name):
            raise ConfigError(
                f"preset {self.name!r} needs a stem matching [a-z0-9_]+ (it goes into task ids)"
            )
        if self.knife_turns < 0 or self.knife_sd < 0 or self.shared_sd < 0:
            raise ConfigError("knife_turns, knife_sd and shared_sd must be >= 0")
        if not 0 <= self.num_hints <= 6 or (self.shared_sd > 0 and self.num_hints < 1):
            raise ConfigError("num_hints must be in 0..6, and >= 1 when shared_sd > 0")
        if not 0 < self.obs_decay <= 1:
            raise ConfigError(f"obs_decay must be in (0, 1], got {self.obs_decay}")
        if self.resolved_share is not None and not 0 <= self.resolved_share <= 1:
            raise ConfigError(f"resolved_share must be in [0, 1], got {self.resolved_share}")

    @property
    def id_stem(self) -> str:
        """The name inside task ids (``sim-<stem>-<seed>-<index>``) and the task draws' seed."""
        return self.stem or self.name

    @property
    def topic_domain(self) -> str:
        return self.domain or self.id_stem

    @property
    def is_v2(self) -> bool:
        """Whether any v2 feature is on (v1 presets draw exactly what they always drew)."""
        return bool(self.knife_turns or self.num_hints or self.obs_decay != 1.0)

    def with_(self, **changes) -> SimPreset:
        """A copy with some fields changed (for calibration sweeps and tests)."""
        return replace(self, **changes)


#: the v1 presets, frozen: outcomes mostly settled by the final draw ("luck"); their task
#: ids keep the v1 stems (``sim-math-...``), so they reproduce the v1 trees exactly
LUCK_PRESETS: dict[str, SimPreset] = {
    # few turns (2-4); GRPO-8 effective ratio 27% +/- 3 (paper: 26.8%, Qwen3-8B DeepScaleR)
    "math-luck": SimPreset(
        name="math-luck",
        stem="math",
        num_actions=3,
        turns_min=2,
        turns_max=4,
        base_mean=-0.5,
        base_sd=7.8,
        topic_sd=1.0,
        delta_sd=1.0,
        skill=1.0,
        answer_rate=0.3,
        prompt_noise=2.0,
        obs_noise=1.0,
    ),
    # about 4 turns; random-branching trees (8 roots + 2 random-prefix replays per root)
    # give an effective ratio of about 43% (paper: 42.8%, Qwen3-8B HotpotQA, 1024 x 2)
    "hotpotqa-luck": SimPreset(
        name="hotpotqa-luck",
        stem="hotpotqa",
        num_actions=3,
        turns_min=3,
        turns_max=5,
        base_mean=-0.5,
        base_sd=7.0,
        topic_sd=1.0,
        delta_sd=0.9,
        skill=1.0,
        answer_rate=0.15,
        prompt_noise=2.0,
        obs_noise=1.0,
    ),
    # dozens of turns (20-30); our choice: GRPO-8 effective ratio about 30% with a low
    # mean success rate (most multi-turn function-calling prompts fail for an 8B model)
    "bfcl-luck": SimPreset(
        name="bfcl-luck",
        stem="bfcl",
        num_actions=4,
        turns_min=20,
        turns_max=30,
        base_mean=-5.0,
        base_sd=8.0,
        topic_sd=1.0,
        delta_sd=0.35,
        skill=1.0,
        answer_rate=0.02,
        answer_at=4.0,
        prompt_noise=2.0,
        obs_noise=1.0,
    ),
}


def _build_registry() -> dict[str, SimPreset]:
    from trace_gym.sim.fitted import DEFAULT_SHARE, FITTED

    out = dict(LUCK_PRESETS)
    fitted = [SimPreset(**fields) for fields in FITTED]
    for p in fitted:
        out[p.name] = p
    for p in fitted:  # the default presets: the family member at DEFAULT_SHARE
        if p.resolved_share == DEFAULT_SHARE:
            out[p.topic_domain] = p
    return out


#: every preset by name: the luck presets, the fitted v2 families (``math-r02`` ..
#: ``math-r08``) and the defaults ``math``, ``hotpotqa``, ``bfcl`` (the r06 members)
PRESETS: dict[str, SimPreset] = _build_registry()


def get_preset(preset: str | SimPreset) -> SimPreset:
    """A preset by name (or the object itself); unknown names raise `UnknownNameError`."""
    if isinstance(preset, SimPreset):
        return preset
    if preset not in PRESETS:
        raise unknown("simulator preset", preset, PRESETS)
    return PRESETS[preset]


def skill_at(preset: SimPreset, step: int, drift: bool | float = False) -> float:
    """The simulated policy's skill at training `step` (constant unless `drift`).

    `drift=True` uses the preset's ``drift_per_step``; a float is the per-step gain.
    """
    rate = preset.drift_per_step if drift is True else float(drift or 0.0)
    if rate < 0 or math.isnan(rate):
        raise ConfigError(f"drift must be a non-negative per-step skill gain, got {drift!r}")
    cap = max(preset.skill_max, preset.skill)
    return float(min(cap, preset.skill + rate * max(0, int(step))))
