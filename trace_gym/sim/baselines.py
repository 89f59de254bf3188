"""The non-adaptive baseline statistics the presets are calibrated on.

- GRPO with a fixed group of G rollouts per prompt: the effective ratio is exactly
  ``mean_x 1 - p_x^G - (1 - p_x)^G`` with ``p_x = Z_0(x)`` (`grpo_effective_ratio`);
  `grpo_effective_ratio_mc` checks it by playing the groups with `SimEnv` + `SimPolicy`.
- Random-branching tree rollouts (TreePO-style): R roots per prompt, then
  ``replays_per_root * R`` continuations from prefixes drawn uniformly (with
  replacement) among the inner turn boundaries of the prompt's roots, replayed from
  restored checkpoints (`random_branching_effective_ratio`, Monte-Carlo).
"""

from __future__ import annotations

import numpy as np

from trace_gym.sim.env import SimEnv
from trace_gym.sim.model import pool_values
from trace_gym.sim.policy import SimPolicy
from trace_gym.sim.presets import SimPreset
from trace_gym.sim.sampling import sample_tree

__all__ = ["grpo_effective_ratio", "grpo_effective_ratio_mc", "random_branching_effective_ratio"]


def grpo_effective_ratio(
    preset: str | SimPreset, num_tasks: int = 2000, seed: int = 0, group: int = 8
) -> float:
    """Exact expected effective ratio of GRPO with `group` rollouts on every prompt of a pool."""
    p = pool_values(preset, num_tasks, seed)
    return float(np.mean(1.0 - p**group - (1.0 - p) ** group))


def grpo_effective_ratio_mc(
    preset: str | SimPreset, num_prompts: int = 500, seed: int = 0, group: int = 8, mc_seed: int = 1
) -> float:
    """Monte-Carlo effective ratio of GRPO groups played with `SimEnv` + `SimPolicy`."""
    return random_branching_effective_ratio(preset, num_prompts, seed, group, 0.0, mc_seed)


def random_branching_effective_ratio(
    preset: str | SimPreset,
    num_prompts: int = 500,
    seed: int = 0,
    roots: int = 8,
    replays_per_root: float = 2.0,
    mc_seed: int = 1,
) -> float:
    """Monte-Carlo effective ratio of random-branching trees (roots + random-prefix replays).

    Plays with `SimEnv` + `SimPolicy`, replaying from restored checkpoints
    (`trace_gym.sim.sampling.sample_tree`); one tree per prompt of the pool.
    """
    env = SimEnv(preset, num_tasks=num_prompts, seed=seed)
    policy = SimPolicy(env.preset)
    rng = np.random.default_rng(mc_seed)
    mixed = 0
    for task in range(num_prompts):
        mixed += sample_tree(env, policy, task, rng, roots, replays_per_root).metrics().mixed
    return mixed / num_prompts
