"""Optimizer-step controls for stale mini-batches: one definition for the learner (`vespo train --step-scale`) and
the lab (`vespo lab --step-scale`). Pure tensor functions; no host sync.

A control moves the weights by s times the optimizer's step, theta <- theta_old + s (theta_opt - theta_old), s <= 1.
For AdamW and SGD this is exactly a learning rate of s * lr for that step (both terms of the update, the normalised
gradient and the decoupled weight decay, are linear in lr; the optimizer's moments do not depend on lr), which is how
VCPO applies its rule.

- "mean_phi": s = Z = the mini-batch's mean VESPO weight phi(W), capped at 1 (beyond the paper, issue 19).
- "ess_sqrt": VCPO's ESS-guided step scaling (arXiv 2602.17616; mit-han-lab/vcpo `megatron_actor.py`,
  `_optimizer_step_with_buffer`): s = sqrt(min(1, rho / rho_0)), rho = the normalised Kish ESS of the mini-batch's
  sequence importance weights w = pi_theta / pi_sampler (unclipped, VCPO's `use_clipped=False`), rho_0 = 1 (its
  `base_ess_ratio`); the square root is its rule for AdamW-style optimizers.
"""

from __future__ import annotations

import torch

from vespo.kernels import effective_sample_size
from vespo.losses.core import seq_log_ratio

Tensor = torch.Tensor
STEP_SCALES = ("none", "mean_phi", "ess_sqrt")


def sampler_log_w(log_prob: Tensor, old_log_prob: Tensor, rollout_log_prob: Tensor | None, mask: Tensor) -> Tensor:
    """log w = log pi_theta / pi_sampler per sequence (B,): log W = sum_t log(pi/mu), plus sum_t log(mu/pi_rollout)
    when the sampler's log-probs are given (untruncated); token log-ratios clamped to +-20 (the losses' guard)."""
    log_w = seq_log_ratio(log_prob, old_log_prob, mask)
    if rollout_log_prob is not None:
        log_w = log_w + seq_log_ratio(old_log_prob, rollout_log_prob, mask)
    return log_w


def step_scale(kind: str, *, mean_phi: Tensor | None = None, log_w: Tensor | None = None,
               valid: Tensor | None = None) -> dict[str, Tensor]:  # fmt: skip
    """The factor s of control `kind` ("mean_phi": from `mean_phi`; "ess_sqrt": from the mini-batch's sampler
    `log_w` (M,) over `valid` sequences) as {"actor/step_scale": s}, plus {"actor/step_ess": rho} for "ess_sqrt"."""
    if kind == "mean_phi":
        return {"actor/step_scale": mean_phi.clamp(max=1.0)}
    if kind == "ess_sqrt":
        rho = torch.nan_to_num(effective_sample_size(log_w, valid), nan=0.0)  # every weight 0: rho = 0, no step
        return {"actor/step_scale": rho.clamp(max=1.0).sqrt(), "actor/step_ess": rho}
    raise ValueError(f"step_scale must be one of {list(STEP_SCALES)}, got {kind!r}")


@torch.no_grad()
def scale_step(params: list[Tensor], before: list[Tensor], scale: Tensor) -> None:
    """theta <- theta_old + s (theta - theta_old), in place, after the optimizer's step (`before`: theta_old)."""
    for p, b in zip(params, before, strict=True):
        p.lerp_(b, 1.0 - scale)
