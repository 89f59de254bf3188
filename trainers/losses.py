"""Policy-gradient losses as pure tensor functions (no model, no state).

Shapes: B sequences x T positions. ``mask`` [B, T] is 1 exactly on the generated tokens
being trained (observation/environment tokens, the prompt, padding and overflowed
turns are 0), and every term - policy gradient, KL, entropy, clip statistics - is
multiplied by it. ``weights`` [B, T] are the per-token weights from
`trace_gym.trainers.advantages` (1 where unweighted). References:
docs/trainers.md "Losses".

Aggregations (selected from `AGGREGATIONS`), for a batch split into micro-batches the
normaliser is passed in from the whole batch so that gradient accumulation gives the
same gradient as one big batch:

- ``token_mean`` (DAPO): sum over tokens / number of trained tokens in the batch;
- ``seq_mean`` (original GRPO): mean over each sequence's trained tokens, then sum /
  number of sequences in the batch;
- ``dr_grpo`` (Dr. GRPO): sum over tokens / a constant (sequences x a fixed length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trace_gym.errors import ConfigError, unknown
from trace_gym.optional import require

torch = require("torch", "train")

__all__ = [
    "AGGREGATIONS",
    "LossOutput",
    "aggregate",
    "clipped_pg_loss",
    "entropy_from_logits",
    "k3_kl",
    "policy_loss",
    "token_logprobs",
]


def clipped_pg_loss(
    logp: torch.Tensor,  # [B, T] current policy log-probs of the taken tokens
    old_logp: torch.Tensor,  # [B, T] log-probs of the policy that sampled them (recomputed)
    advantages: torch.Tensor,  # [B, T] advantage broadcast per token
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss with asymmetric clip and optional dual clip; returns (loss, clipped).

    loss = max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high)); with ``dual_clip = c``
    and A < 0 the loss is further capped at -A c. ``clipped`` [B, T] is 1 where a clip
    bound is the active term (for the clip-fraction metric).
    """
    ratio = torch.exp(logp - old_logp)  # [B, T]
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)  # [B, T]
    is_clipped = clipped > unclipped
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
        is_clipped = is_clipped | dual
    return loss, is_clipped.to(loss.dtype)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(d) - d - 1, d = ref - logp. [B, T]"""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def _token_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    tokens: float | None = None,
    seqs: float | None = None,
    constant: float | None = None,
) -> torch.Tensor:
    denom = mask.sum() if tokens is None else torch.as_tensor(tokens, dtype=values.dtype)
    return (values * mask).sum() / torch.clamp(denom, min=1.0)


def _seq_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    tokens: float | None = None,
    seqs: float | None = None,
    constant: float | None = None,
) -> torch.Tensor:
    per_seq = (values * mask).sum(-1) / torch.clamp(mask.sum(-1), min=1.0)  # [B]
    n = values.shape[0] if seqs is None else seqs
    return per_seq.sum() / max(float(n), 1.0)


def _dr_grpo(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    tokens: float | None = None,
    seqs: float | None = None,
    constant: float | None = None,
) -> torch.Tensor:
    c = float(values.shape[0] * values.shape[1]) if constant is None else constant
    return (values * mask).sum() / max(c, 1.0)


#: aggregation name -> fn(values [B, T], mask [B, T], tokens=, seqs=, constant=) -> scalar
AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token_mean": _token_mean,
    "seq_mean": _seq_mean,
    "dr_grpo": _dr_grpo,
}


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, **norm: float | None
) -> torch.Tensor:
    """Reduce per-token values [B, T] to a scalar with the named aggregation (see module doc)."""
    if mode not in AGGREGATIONS:
        raise unknown("loss aggregation", mode, AGGREGATIONS)
    return AGGREGATIONS[mode](values, mask, **norm)


@dataclass
class LossOutput:
    """The scalar loss to backpropagate and detached statistics over the trained tokens."""

    loss: torch.Tensor
    pg_loss: float
    kl: float
    clip_frac: float
    ratio_mean: float


def policy_loss(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    mask: torch.Tensor,  # [B, T] in {0, 1}
    weights: torch.Tensor | None = None,  # [B, T]
    *,
    ref_logp: torch.Tensor | None = None,  # [B, T], needed when kl_coef > 0
    is_weights: torch.Tensor | None = None,  # [B, T] generator/trainer importance weights
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    kl_coef: float = 0.0,
    aggregation: str = "token_mean",
    **norm: float | None,
) -> LossOutput:
    """Clipped PG (+ k3 KL) on the masked tokens, weighted and aggregated.

    ``is_weights`` multiplies the PG term (truncated importance sampling for a generator
    whose logprobs differ from the trainer's); ``norm`` carries the whole-batch
    normaliser for `aggregate` (tokens=, seqs=, constant=).
    """
    mask = mask.to(logp.dtype)
    w = mask if weights is None else weights.to(logp.dtype) * mask
    pg, clipped = clipped_pg_loss(
        logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    if is_weights is not None:
        pg = pg * is_weights.detach()
    total = aggregate(pg * w, mask, aggregation, **norm)
    pg_value = float(total.detach())
    kl_value = 0.0
    if kl_coef > 0.0:
        if ref_logp is None:
            raise ConfigError(
                "kl_coef > 0 needs ref_logp (log-probs under the reference policy); pass ref_logp or set kl_coef = 0"
            )
        kl = k3_kl(logp, ref_logp)
        total = total + kl_coef * aggregate(kl * w, mask, aggregation, **norm)
        kl_value = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1.0))
    n = mask.sum().clamp(min=1.0)
    with torch.no_grad():
        clip_frac = float((clipped * mask).sum() / n)
        ratio_mean = float((torch.exp(logp - old_logp) * mask).sum() / n)
    return LossOutput(total, pg_value, kl_value, clip_frac, ratio_mean)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each token given the ones before it. logits [B, T, V] -> [B, T] (position 0 is 0)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
    taken = torch.gather(logp, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, T-1]
    return torch.nn.functional.pad(taken, (1, 0))  # [B, T]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at each position, aligned like `token_logprobs`. [B, T]"""
    z = logits[:, :-1].float()  # [B, T-1, V]
    ent = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)  # [B, T-1]
    return torch.nn.functional.pad(ent, (1, 0))  # [B, T]
