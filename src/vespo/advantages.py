"""Advantages: group-relative (GRPO, Shao et al. 2024, Sec. 4.1.2; paper Sec. 2), A_i = R_i - mean(R_group) [/ std],
and VCPO's off-policy optimal baseline (`opob_advantages`)."""

from __future__ import annotations

import math

import torch


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Advantages of `rewards` (B,) whose consecutive runs of `group_size` rows answer the same prompt.

    A = R - group mean, divided by (group std + eps) when `norm_by_std` (GRPO; veRL's `norm_adv_by_std_in_grpo`).
    The std is the unbiased sample std, as in veRL and TRL; a group whose rewards are all equal gets A = 0.
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size={group_size}, got shape {tuple(rewards.shape)}"
        )
    groups = rewards.float().view(-1, group_size)  # (num_prompts, n)
    adv = groups - groups.mean(-1, keepdim=True)
    if norm_by_std:
        std = groups.std(-1, keepdim=True) if group_size > 1 else torch.zeros_like(adv)
        adv = adv / (std + eps)
    return adv.flatten()  # (B,)


def opob_advantages(
    rewards: torch.Tensor, group_size: int, log_weights: torch.Tensor, *, norm_by_std: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """VCPO's off-policy optimal baseline (OPOB; arXiv 2602.17616, mit-han-lab/vcpo `staleness_utils.py`,
    `compute_opob_baseline` with its scripts' group scope and weighted mean): (B,) advantages A_i = (R_i - b_g) / s_g.

    b_g = sum_i v_i R_i / (sum_i v_i + eps) over the group's rows, v_i = exp(`log_weights`_i) = ||grad sum_t r_it||^2
    w_i^2 (the per-sequence score-gradient norm times the squared sequence importance weight: the closed-form
    minimum-variance baseline of the importance-weighted gradient); s_g is the group's population std, used only
    when `norm_by_std` and > 1e-8 (VCPO's `norm_by_std`). Weights are taken in log space (max-shifted, float64),
    so w^2 cannot overflow; any method can train on these advantages.
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size or log_weights.shape != rewards.shape:
        raise ValueError(
            f"rewards and log_weights must be 1-D of one length divisible by group_size={group_size}, got shapes "
            f"{tuple(rewards.shape)} and {tuple(log_weights.shape)}"
        )
    r = rewards.double().view(-1, group_size)  # (num_prompts, n)
    lw = log_weights.double().view(-1, group_size)
    top = lw.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a group of zero weights: b = 0, as VCPO
    v = torch.exp(lw - top)
    eps_shifted = torch.exp((math.log(eps) - top).clamp(max=700.0))  # eps / e^top, the max-shifted eps
    baseline = (v * r).sum(-1, keepdim=True) / (v.sum(-1, keepdim=True) + eps_shifted)
    adv = r - baseline
    if norm_by_std:
        std = r.std(-1, keepdim=True, unbiased=False)
        adv = torch.where(std > 1e-8, adv / std, adv)
    return adv.flatten().to(rewards.dtype if rewards.is_floating_point() else torch.float32)  # (B,)
