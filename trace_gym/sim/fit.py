"""`sim-calibrate --fit`: a deterministic search for v2 preset parameters.

It may only look at what a practitioner knows before running any adaptive method:
baseline statistics (GRPO with 8 rollouts, random-branching trees of 8 roots x 2
replays), environment facts (turn counts, the U-shape of prompt success rates) and a
chosen `resolved_share`. It imports no allocator and no predictor (a test checks).

Each domain has a template (turn counts and moves as in the v1 presets, knife-edge
turns, hints, clue decay); two knobs are fitted by alternating bisection, each
monotone in its target:

- the move scale ``s`` (multiplies ``delta_sd``, ``knife_sd`` and ``shared_sd``): the
  exact resolved share over prompts with 0.1 < Z_0 < 0.9 rises with it;
- the base spread ``base_sd``: the baseline's effective ratio falls with it (exact for
  GRPO-8; Monte-Carlo with a fixed seed for random branching).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trace_gym.errors import ConfigError
from trace_gym.sim.baselines import grpo_effective_ratio, random_branching_effective_ratio
from trace_gym.sim.exact import preset_stats
from trace_gym.sim.presets import SimPreset

__all__ = ["SHARES", "TARGETS", "FitResult", "fit_family", "fit_preset", "template"]

#: the resolved shares of the fitted families
SHARES = (0.2, 0.4, 0.6, 0.8)

#: domain -> (baseline statistic, target): the paper's (or our chosen) baseline figures
TARGETS: dict[str, tuple[str, float]] = {
    "math": ("grpo8", 0.27),  # paper: GRPO 26.8% (Qwen3-8B, DeepScaleR)
    "hotpotqa": ("random_branching", 0.43),  # paper: TreePO 1024x2 42.8% (Qwen3-8B)
    "bfcl": ("grpo8", 0.30),  # our choice (v1 preset): most prompts fail
}

#: per domain: the v2 template (base_sd, delta_sd, knife_sd, shared_sd are rescaled)
_TEMPLATES: dict[str, dict] = {
    "math": dict(
        num_actions=3,
        turns_min=2,
        turns_max=4,
        base_mean=-0.5,
        answer_rate=0.3,
        knife_turns=1,
        delta_sd=0.5,
        knife_sd=2.0,
        shared_sd=0.5,
    ),
    "hotpotqa": dict(
        num_actions=3,
        turns_min=3,
        turns_max=5,
        base_mean=-0.5,
        answer_rate=0.15,
        knife_turns=2,
        delta_sd=0.4,
        knife_sd=1.6,
        shared_sd=0.4,
    ),
    "bfcl": dict(
        num_actions=4,
        turns_min=20,
        turns_max=30,
        base_mean=-5.0,
        answer_rate=0.02,
        answer_at=4.0,
        knife_turns=3,
        delta_sd=0.2,
        knife_sd=1.2,
        shared_sd=0.2,
    ),
}
_COMMON: dict[str, Any] = dict(
    skill=0.5, num_hints=6, obs_decay=0.7, prompt_noise=2.0, obs_noise=1.5
)


def template(domain: str, share: float) -> SimPreset:
    """The unfitted v2 preset of a domain at a resolved share (scale 1, base_sd 5)."""
    if domain not in _TEMPLATES:
        raise ConfigError(f"no v2 template for domain {domain!r}; known: {', '.join(_TEMPLATES)}")
    tag = f"r{round(share * 10):02d}"
    return SimPreset(
        name=f"{domain}-{tag}",
        stem=f"{domain}_{tag}",
        domain=domain,
        resolved_share=float(share),
        base_sd=5.0,
        **_COMMON,
        **_TEMPLATES[domain],
    )


def _scaled(base: SimPreset, scale: float, base_sd: float) -> SimPreset:
    t = _TEMPLATES[base.topic_domain]
    return base.with_(
        delta_sd=round(scale * t["delta_sd"], 4),
        knife_sd=round(scale * t["knife_sd"], 4),
        shared_sd=round(scale * t["shared_sd"], 4),
        base_sd=round(base_sd, 4),
    )


def _bisect(
    f: Callable[[float], float], lo: float, hi: float, target: float, rising: bool, iters: int
) -> float:
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if (f(mid) < target) == rising:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def baseline_statistic(p: SimPreset, which: str, num_tasks: int, mc_prompts: int) -> float:
    """The baseline figure a domain is fitted to (GRPO-8 exact, or random branching MC)."""
    if which == "grpo8":
        return grpo_effective_ratio(p, num_tasks)
    return random_branching_effective_ratio(p, mc_prompts, mc_seed=1)


@dataclass(frozen=True)
class FitResult:
    preset: SimPreset
    resolved_share: float
    baseline: str
    baseline_value: float


def fit_preset(
    domain: str,
    share: float,
    *,
    num_tasks: int = 600,
    mc_prompts: int = 160,
    rounds: int = 2,
    iters: int = 8,
) -> FitResult:
    """Fit the move scale and base spread of one (domain, resolved share) preset."""
    which, target = TARGETS[domain]
    base = template(domain, share)
    scale, base_sd = 1.0, 5.0
    for _ in range(rounds):

        def share_of(s: float, b: float = base_sd) -> float:
            return preset_stats(_scaled(base, s, b), num_tasks).resolved_share

        scale = _bisect(share_of, 0.05, 16.0, share, rising=True, iters=iters)

        def stat_of(b: float, s: float = scale) -> float:
            return baseline_statistic(_scaled(base, s, b), which, num_tasks, mc_prompts)

        base_sd = _bisect(stat_of, 0.5, 40.0, target, rising=False, iters=iters)
    p = _scaled(base, scale, base_sd)
    return FitResult(
        p,
        preset_stats(p, num_tasks).resolved_share,
        which,
        baseline_statistic(p, which, num_tasks, mc_prompts),
    )


def fit_family(domains=tuple(_TEMPLATES), shares=SHARES, **kw) -> list[FitResult]:
    """Every (domain, share) preset, in a fixed order."""
    return [fit_preset(d, s, **kw) for d in domains for s in shares]


def fitted_source(results: list[FitResult]) -> str:
    """The text of trace_gym/sim/fitted.py for these fits."""
    lines = [
        '"""The fitted v2 preset families (written by ``trace-gym sim-calibrate --fit``; do not hand-edit)."""',
        "",
        "from __future__ import annotations",
        "",
        "#: the resolved_share of the default presets ``math``, ``hotpotqa``, ``bfcl``",
        "DEFAULT_SHARE = 0.6",
        "",
        "#: the fields of each fitted preset that differ from `SimPreset`'s defaults",
        "FITTED: tuple[dict, ...] = (",
    ]
    for r in results:
        fields = {
            k: v
            for k, v in r.preset.__dict__.items()
            if v != SimPreset.__dataclass_fields__[k].default
        }
        args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        lines.append(
            f"    # fitted: resolved share {r.resolved_share:.3f}, {r.baseline} {r.baseline_value:.3f}"
        )
        lines.append(f"    dict({args}),")
    lines.append(")")
    return "\n".join(lines) + "\n"
