"""Group-relative advantages (GRPO, Shao et al. 2024, Sec. 4.1.2; paper Sec. 2): A_i = R_i - mean(R_group) [/ std]."""

from __future__ import annotations

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
