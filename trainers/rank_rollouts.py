"""Every FSDP rank grows its share of a step's trees (``dist.rollouts = "all"``).

`RankRunner` is `trace_gym.distributed.ranks.RankShardedRunner` (the one runner the TRL
adapter under accelerate uses too), built by the FSDP trainer on its own rank, world size
and gather (`RankShardedRunner.adopt`). It is the `BranchingRunner` step of a sharded run
with W ranks. Every rank
holds the same runner state (predictor, visit histories, rollout costs, allocator: built
from one config and seed, then updated on the same trees), so every rank scores and
allocates the step identically - no broadcast of the plan is needed, and a fingerprint
of it is compared over the ranks each step so a divergence fails loudly instead of
training on mismatched batches. Then:

1. the selected prompts are split over the ranks with `trace_gym.distributed.shard_works`
   (the Ray runner's balance of accounted cost; deterministic, so every rank computes the
   same split);
2. each rank grows its shard with its own generator copy (`trace_gym.distributed.worker.grow_shard`,
   the code a Ray worker runs);
3. the finished trees and shard reports are all-gathered: every rank ends the step with
   the whole step's trees in candidate order and one merged report, then updates its
   predictor on all of them (the same update on every rank keeps the predictors equal).
   An exception raised while a rank grows its shard (a bad allocator, say: failed
   branches are data, not exceptions) is told to every rank in that gather and every
   rank raises, so no rank is left waiting in a collective.

Every branch seed is a function of (seed, step, prompt, node, child, turn) and node ids do
not depend on batching, so which rank grew a prompt cannot change its tree: the union is
the one-process step's trees (tests/distributed/test_fsdp_rollouts.py checks it).
"""

from __future__ import annotations

from trace_gym.distributed.ranks import Gather, RankShardedRunner, plan_fingerprint

__all__ = ["Gather", "RankRunner", "plan_fingerprint"]

#: the FSDP trainer's name for the one rank-sharded runner (`trace_gym.distributed.ranks`)
RankRunner = RankShardedRunner
