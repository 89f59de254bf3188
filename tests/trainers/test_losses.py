"""Losses against a direct per-element computation, including masking."""

from __future__ import annotations

import math

import pytest
import torch
from trace_gym.trainers.losses import (
    aggregate,
    clipped_pg_loss,
    entropy_from_logits,
    k3_kl,
    policy_loss,
    token_logprobs,
)

from trace_gym.errors import UnknownNameError


def direct_pg(lp, old, a, lo, hi, c):
    rho = math.exp(lp - old)
    loss = max(-a * rho, -a * min(max(rho, 1 - lo), 1 + hi))
    if c is not None and a < 0:
        loss = min(loss, -a * c)
    return loss


@pytest.fixture
def small():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(3, 5, generator=g) * 0.5 - 1
    old = lp + torch.randn(3, 5, generator=g) * 0.6
    adv = torch.tensor([[1.5], [-2.0], [0.7]]).expand(3, 5)
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.float)
    return lp, old, adv, mask


@pytest.mark.parametrize("dual", [None, 1.5])
def test_clipped_pg_matches_direct(small, dual):
    lp, old, adv, _ = small
    loss, _ = clipped_pg_loss(lp, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=dual)
    for i in range(3):
        for j in range(5):
            want = direct_pg(lp[i, j].item(), old[i, j].item(), adv[i, j].item(), 0.2, 0.28, dual)
            assert loss[i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_dual_clip_caps_negative_advantage_with_huge_ratio():
    lp, old, adv = torch.tensor([[3.0]]), torch.tensor([[0.0]]), torch.tensor([[-1.0]])
    loss, clipped = clipped_pg_loss(lp, old, adv, dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0) and clipped.item() == 1.0
    loss, _ = clipped_pg_loss(lp, old, adv, dual_clip=None)
    assert loss.item() == pytest.approx(math.exp(3.0))


def test_aggregations_direct(small):
    lp, _, _, mask = small
    v = lp
    tok = sum(v[i, j] * mask[i, j] for i in range(3) for j in range(5)) / mask.sum()
    assert aggregate(v, mask, "token_mean").item() == pytest.approx(tok.item())
    seq = sum((v[i] * mask[i]).sum() / max(mask[i].sum(), 1) for i in range(3)) / 3
    assert aggregate(v, mask, "seq_mean").item() == pytest.approx(seq.item())
    assert aggregate(v, mask, "dr_grpo", constant=100.0).item() == pytest.approx(
        (v * mask).sum().item() / 100
    )
    # whole-batch normalisers: two micro-batches sum to the full-batch value
    full = aggregate(v, mask, "token_mean")
    parts = aggregate(v[:2], mask[:2], "token_mean", tokens=mask.sum()) + aggregate(
        v[2:], mask[2:], "token_mean", tokens=mask.sum()
    )
    assert parts.item() == pytest.approx(full.item())
    with pytest.raises(UnknownNameError):
        aggregate(v, mask, "median")


def test_masked_tokens_do_not_matter(small):
    lp, old, adv, mask = small
    ref = lp - 0.3
    out = policy_loss(lp, old, adv, mask, ref_logp=ref, kl_coef=0.1, dual_clip=3.0)
    # garbage on masked positions changes nothing: neither the loss nor the statistics
    junk = (1 - mask) * 50.0
    out2 = policy_loss(
        lp + junk, old - junk, adv + junk, mask, ref_logp=ref + junk, kl_coef=0.1, dual_clip=3.0
    )
    assert out.loss.item() == pytest.approx(out2.loss.item())
    assert out.clip_frac == pytest.approx(out2.clip_frac)
    assert out.kl == pytest.approx(out2.kl)


def test_policy_loss_direct_with_weights_and_kl(small):
    lp, old, adv, mask = small
    w = torch.tensor([[0.5], [2.0], [1.0]]).expand(3, 5)
    ref = lp + 0.2
    out = policy_loss(
        lp,
        old,
        adv,
        mask,
        w,
        ref_logp=ref,
        kl_coef=0.05,
        clip_low=0.1,
        clip_high=0.3,
        aggregation="token_mean",
    )
    n = mask.sum().item()
    want = 0.0
    for i in range(3):
        for j in range(5):
            if mask[i, j]:
                d = ref[i, j].item() - lp[i, j].item()
                kl = math.exp(d) - d - 1
                want += w[i, j].item() * (
                    direct_pg(lp[i, j].item(), old[i, j].item(), adv[i, j].item(), 0.1, 0.3, None)
                    + 0.05 * kl
                )
    assert out.loss.item() == pytest.approx(want / n, rel=1e-5)


def test_k3_is_nonnegative_and_zero_at_equality():
    x = torch.linspace(-3, 3, 13)
    assert torch.all(k3_kl(x, x.flip(0)) >= 0)
    assert torch.allclose(k3_kl(x, x), torch.zeros_like(x))


def test_gradient_flows_only_through_masked_tokens(small):
    lp, old, adv, mask = small
    lp = lp.clone().requires_grad_(True)
    policy_loss(lp, old, adv, mask).loss.backward()
    assert torch.all(lp.grad[mask == 0] == 0)
    assert torch.any(lp.grad[mask == 1] != 0)


def test_token_logprobs_and_entropy_alignment():
    logits = torch.randn(2, 4, 7)
    ids = torch.randint(0, 7, (2, 4))
    lp = token_logprobs(logits, ids)
    assert lp.shape == (2, 4) and torch.all(lp[:, 0] == 0)
    want = torch.log_softmax(logits[1, 2], -1)[ids[1, 3]]
    assert lp[1, 3].item() == pytest.approx(want.item(), rel=1e-5)
    ent = entropy_from_logits(logits)
    p = torch.softmax(logits[0, 1], -1)
    assert ent[0, 2].item() == pytest.approx(-(p * p.log()).sum().item(), rel=1e-5)
