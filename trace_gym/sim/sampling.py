"""Random-branching rollout trees on the simulator, without the runner.

A small, self-contained sampler for calibration, tests and predictor experiments:
`roots` fresh rollouts of a task, then continuations from turn boundaries drawn
uniformly (with replacement) among the inner prefixes of those rollouts, replayed
from restored checkpoints. Every node gets its exact `true_value` from the env. The
`BranchingRunner` (trace_gym.runner) is the real, allocator-driven version.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trace_gym.core import Checkpoint
from trace_gym.policy import Conversation, Policy
from trace_gym.sim.env import SimEnv
from trace_gym.sim.policy import SimPolicy
from trace_gym.sim.presets import SimPreset
from trace_gym.tree import RolloutTree, Turn

__all__ = ["sample_tree", "sample_trees"]


def _continue(
    env: SimEnv,
    policy: Policy,
    tree: RolloutTree,
    node_id: int,
    rng: np.random.Generator,
    origin: str,
) -> dict[int, Checkpoint]:
    """Play the live episode from `node_id` to its end; returns checkpoints of the new inner nodes."""
    ckpts: dict[int, Checkpoint] = {}
    while True:
        seed = int(rng.integers(2**63))
        conv = Conversation(
            env.id, tree.prompt_id, tree.prompt, tuple(tree.turns(node_id)), seed=seed
        )
        out = policy.generate([conv])[0]
        obs, reward, term, trunc, info = env.step(out.text)
        turn = Turn(
            out.text, obs, reward, token_ids=out.token_ids, logprobs=out.logprobs, info=info
        )
        node = tree.add_child(node_id, turn, origin=origin, seed=seed, true_value=env.true_value())
        node_id = node.id
        if term or trunc:
            tree.finish(node_id, reward=reward, terminated=term, truncated=trunc)
            return ckpts
        ckpts[node_id] = env.checkpoint()


def sample_tree(
    env: SimEnv,
    policy: Policy,
    task: int | str,
    rng: np.random.Generator,
    roots: int = 8,
    replays_per_root: float = 2.0,
    step: int = 0,
) -> RolloutTree:
    """One random-branching tree: `roots` rollouts + ``round(replays_per_root * roots)`` replays."""
    prompt, info = env.reset(seed=int(rng.integers(2**31)), options={"task": task})
    tree = RolloutTree(info["task_id"], prompt, env_id=env.id, step=step, info={"task": info})
    tree.root.true_value = env.true_value()
    inner: dict[int, Checkpoint] = {}
    for _ in range(roots):
        env.reset(seed=int(rng.integers(2**31)), options={"task": task})
        inner.update(_continue(env, policy, tree, 0, rng, "rollout"))
    pool = sorted(inner)
    for _ in range(round(replays_per_root * roots) if pool else 0):
        node_id = pool[int(rng.integers(len(pool)))]
        env.restore(inner[node_id])
        _continue(env, policy, tree, node_id, rng, "replay")
    tree.compute_targets()
    return tree


def sample_trees(
    preset: str | SimPreset,
    tasks: Sequence[int] | int,
    *,
    num_tasks: int | None = None,
    pool_seed: int = 0,
    roots: int = 8,
    replays_per_root: float = 2.0,
    seed: int = 0,
) -> list[RolloutTree]:
    """Random-branching trees for `tasks` (indices, or the first N tasks) of a pool."""
    tasks = list(range(tasks)) if isinstance(tasks, int) else list(tasks)
    n = num_tasks if num_tasks is not None else max(tasks, default=0) + 1
    env = SimEnv(preset, num_tasks=n, seed=pool_seed)
    policy = SimPolicy(env.preset)
    rng = np.random.default_rng(seed)
    return [sample_tree(env, policy, t, rng, roots, replays_per_root) for t in tasks]
