"""Stable seeds: the same parts give the same seed in every process and Python run."""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["branch_seed", "stable_seed"]


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from any printable parts; stable across processes and Python runs."""
    key = "\x1f".join(repr(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def branch_seed(
    step: int, prompt_id: str, node_id: int, child_index: int, *, turn: int = 0, base: int = 0
) -> int:
    """The seed of the branch grown from `node_id` as its `child_index`-th child.

    `turn` tells the turns of one branch apart (0 seeds the env, k >= 1 the k-th policy
    call of the branch); `base` is the run's seed (``RunnerConfig.seed``).
    """
    return stable_seed(
        "branch", int(base), int(step), str(prompt_id), int(node_id), int(child_index), int(turn)
    )
