"""Training samples from tree units, built from the token ids recorded at generation time.

A sample's context is ``tree.prompt_token_ids`` followed, for every turn on the path to
the last trained node, by that turn's generated ``token_ids`` and then its
``obs_token_ids`` (the tokens the policy appended before the next turn, chat-template
wrapping included). The trailing observation of the last node is dropped: nothing after
it is trained. Text is never re-tokenised.

The loss mask is 1 only on the generated tokens of the unit's own nodes; the prompt,
observations, ancestors outside the unit and overflowed turns
(``node.info["overflow"]``) are 0. Advantage and weight are constant over the unit.

Generation-time logprobs come with their own mask, ``gen_known``: 1 where the
generator recorded a logprob for the token. A logprob of 0.0 is a real value (a token
sampled with probability ~1), never a marker for "unknown".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trace_gym.trainers.advantages import TrainUnit

from trace_gym.errors import TreeFormatError
from trace_gym.optional import require
from trace_gym.tree import RolloutTree

torch = require("torch", "train")

__all__ = ["Batch", "Sample", "collate", "sample_from_unit"]


@dataclass
class Sample:
    """One training sequence: token ids and per-token mask, advantage and weight."""

    input_ids: list[int]
    #: 1 on trained (generated, non-overflowed) tokens of the unit
    loss_mask: list[int]
    advantage: float
    weight: float
    #: generation-time logprobs aligned with input_ids (0.0 where `gen_known` is 0)
    gen_logprobs: list[float]
    tree: int = -1
    nodes: tuple[int, ...] = ()
    #: 1 where the generator recorded the token's logprob (None: known nowhere)
    gen_known: list[int] | None = None
    #: trainer updates since the oldest policy that generated its nodes (asynchronous rollouts)
    staleness: int = 0

    @property
    def num_trained(self) -> int:
        return sum(self.loss_mask)


def sample_from_unit(tree: RolloutTree, unit: TrainUnit) -> Sample:
    """Build the context, mask and advantage of one unit (see the module docstring)."""
    if tree.prompt_token_ids is None:
        raise TreeFormatError(
            f"tree {tree.prompt_id!r} has no prompt_token_ids; collect trees with a tokenising "
            "policy (e.g. trace_gym.agents.hf.HFPolicy) to train on them"
        )
    trained = set(unit.nodes)
    path = tree.path(unit.nodes[-1])
    ids: list[int] = list(tree.prompt_token_ids)
    mask: list[int] = [0] * len(ids)
    gen_lp: list[float] = [0.0] * len(ids)
    known: list[int] = [0] * len(ids)
    for k, node in enumerate(path):
        turn = node.turn
        if turn is None or turn.token_ids is None:
            raise TreeFormatError(
                f"tree {tree.prompt_id!r} node {node.id} has no token ids; the trainer trains on "
                "generated tokens only - use a policy backend that records them"
            )
        on = (
            node.id in trained
            and not node.info.get("overflow", False)
            and not turn.info.get("overflow", False)
        )
        ids += turn.token_ids
        mask += [int(on)] * len(turn.token_ids)
        has_lp = turn.logprobs is not None and len(turn.logprobs) == len(turn.token_ids)
        gen_lp += list(turn.logprobs) if has_lp else [0.0] * len(turn.token_ids)
        known += [int(has_lp)] * len(turn.token_ids)
        if k < len(path) - 1:
            if turn.obs_token_ids is None:
                raise TreeFormatError(
                    f"tree {tree.prompt_id!r} node {node.id} has no obs_token_ids but a turn follows; "
                    "the runner records them from PolicyOutput.context_token_ids"
                )
            ids += turn.obs_token_ids
            mask += [0] * len(turn.obs_token_ids)
            gen_lp += [0.0] * len(turn.obs_token_ids)
            known += [0] * len(turn.obs_token_ids)
    return Sample(ids, mask, unit.advantage, unit.weight, gen_lp, unit.tree, unit.nodes, known)


@dataclass
class Batch:
    """Right-padded tensors of a list of samples. All [B, T]."""

    input_ids: torch.Tensor  # long
    attention_mask: torch.Tensor  # long, 1 on real tokens
    loss_mask: torch.Tensor  # float
    advantages: torch.Tensor  # float, the unit's advantage on every position
    weights: torch.Tensor  # float, the unit's weight on every position
    gen_logprobs: torch.Tensor  # float
    gen_known: torch.Tensor  # float, 1 where gen_logprobs holds a recorded logprob

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate(samples: Sequence[Sample], pad_id: int = 0) -> Batch:
    """Right-pad samples to the longest one."""
    t = max(len(s.input_ids) for s in samples)
    b = len(samples)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    attn = torch.zeros((b, t), dtype=torch.long)
    mask = torch.zeros((b, t))
    gen = torch.zeros((b, t))
    known = torch.zeros((b, t))
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float)
        gen[i, :n] = torch.tensor(s.gen_logprobs, dtype=torch.float)
        if s.gen_known is not None:
            known[i, :n] = torch.tensor(s.gen_known, dtype=torch.float)
    adv = (
        torch.tensor([s.advantage for s in samples], dtype=torch.float)[:, None]
        .expand(b, t)
        .clone()
    )
    w = torch.tensor([s.weight for s in samples], dtype=torch.float)[:, None].expand(b, t).clone()
    return Batch(ids, attn, mask, adv, w, gen, known)
