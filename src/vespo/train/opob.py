"""VCPO's off-policy optimal baseline (OPOB) inside the N-mini-batch update: each sequence's baseline weight at the
weights its mini-batch is trained from, and how far the baseline moved off GRPO's group mean. The baseline itself is
`vespo.advantages.opob_advantages` (mit-han-lab/vcpo, `compute_opob_baseline`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vespo.losses.core import row_sum, token_log_ratio
from vespo.step_control import sampler_log_w

Tensor = torch.Tensor


def check_inputs(rewards: Tensor | None, shuffle: bool) -> None:
    """The baseline is taken per prompt group from the rewards: it needs them, and whole groups per mini-batch."""
    if rewards is None or shuffle:
        raise ValueError("adv_estimator='opob' needs the rewards and whole groups per mini-batch (shuffle off)")


def opob_log_weights(
    log_probs: Callable[[Tensor], Tensor],
    params: list[Tensor],
    rows: Tensor,
    *,
    old_log_prob: Tensor | None,
    rollout_log_prob: Tensor | None,
    response_mask: Tensor,
) -> Tensor:
    """log of VCPO's baseline weight of each row, log(||grad_theta sum_t r_t||^2 w^2), (M,): r_t = pi/mu per token (its
    per-trajectory gradient with A = 1, summed over tokens), w = pi/pi_sampler per sequence (`sampler_log_w`,
    unclipped). `log_probs(row)` is the (1, T) log pi of one row with autograd: one forward and backward per sequence
    (`torch.autograd.grad`: the accumulated gradient is untouched). `old_log_prob` None: mu is that forward itself
    (W == 1); the (B, T) tensors are indexed by `rows`."""
    out = []
    for row in rows.split(1):
        lp = log_probs(row)  # (1, T)
        old = lp.detach() if old_log_prob is None else old_log_prob[row]
        mask = response_mask[row].to(lp.dtype)
        score = row_sum(torch.exp(token_log_ratio(lp, old)), mask).sum()
        grads = [g for g in torch.autograd.grad(score, params, allow_unused=True) if g is not None]
        sq_norm = torch.stack([g.float().square().sum() for g in grads]).sum()
        rollout_row = None if rollout_log_prob is None else rollout_log_prob[row]
        log_w = sampler_log_w(lp.detach(), old, rollout_row, mask)[0]
        out.append(torch.log(sq_norm) + 2.0 * log_w)
    return torch.stack(out)


def baseline_gap(rewards: Tensor, advantages: Tensor, group_size: int, norm_by_std: bool) -> Tensor:
    """Mean over groups of |b - mean R|: how far VCPO's baseline moved from GRPO's group mean (0-dim), recovered from
    the advantages A = (R - b) / s (s the group's reward std with `norm_by_std`, else 1)."""
    r = rewards.double().view(-1, group_size)
    a = advantages.double().view(-1, group_size)
    std = r.std(-1, keepdim=True, unbiased=False)
    scale = torch.where((std > 1e-8) & norm_by_std, std, torch.ones_like(std))
    baseline = (r - a * scale).mean(-1)  # b = R - A s, the same for every row of the group
    return (baseline - r.mean(-1)).abs().mean().float()
