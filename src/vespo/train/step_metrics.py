"""A training step's metrics, kept as tensors until the step logs them: the rollout's (reward, lengths, entropy), the
train-inference mismatch, each mini-batch's regime diagnostics, the update's summary over its mini-batches, and
`to_floats`, which converts a whole logged step at once (one host sync)."""

from __future__ import annotations

import math

import torch

from vespo import diagnostics
from vespo.losses import kl_k3
from vespo.losses.core import seq_log_ratio, top_share
from vespo.rollout import Rollout

Tensor = torch.Tensor
PER_INDEX = (
    "is/log_w_mean",
    "is/log_w_max",
    "is/log_w_min",
    "weight/ess",
    "is/ess",
    "is/top1pct_w_share",
    "actor/grad_norm",
    "actor/update_norm",
    "is/kl_mu_pi",
    "is/log_w_std",
    diagnostics.MEAN_PHI,
    "actor/momentum_share",
    "actor/step_ess",
    "clip/frac",
)
"""Mini-batch metrics also logged for the first and the last mini-batch of a step (docs/results/index.md,
mechanism); the last mini-batch's `is/kl_mu_pi`, `is/log_w_std`, `vespo/Z`, `actor/momentum_share` and `clip/frac`
(the share of tokens a clipping method clipped) are the regime diagnostics at the stalest mini-batch
(`vespo.diagnostics`); `actor/step_ess` is VCPO's ESS (with `step_scale="ess_sqrt"`)."""


def rollout_metrics(rewards: Tensor, rollout: Rollout, max_response_length: int) -> dict[str, Tensor]:
    """Reward, response length (mean, p90, share cut at `max_response_length`) and the sampler's entropy estimate."""
    mask = rollout.response_mask.bool()
    lengths = rollout.response_mask.sum(-1).float()
    return {
        "reward/mean": rewards.mean(),
        "reward/std": rewards.std() if rewards.numel() > 1 else torch.zeros(()),
        "response/length_mean": lengths.mean(),
        "response/length_p90": torch.quantile(lengths, 0.9),
        "response/clip_frac": (lengths >= max_response_length).float().mean(),
        "actor/entropy": -rollout.rollout_log_prob[mask].mean(),  # MC estimate: mean -log pi of samples
    }


def mismatch_metrics(train_log_prob: Tensor, rollout: Rollout) -> dict[str, Tensor]:
    """The train-inference gap on the sampled tokens: the learner's log-probs under the weights the sampler used
    against the sampler's own (paper Sec. 4.6)."""
    gap = (train_log_prob - rollout.rollout_log_prob)[rollout.response_mask.bool()]  # log pi_train - log pi_rollout
    return {"mismatch/log_ratio_abs_mean": gap.abs().mean(), "mismatch/k3_kl": kl_k3(gap).mean()}


def mini_batch_metrics(
    grad_norm: Tensor, log_prob: Tensor, old_log_prob: Tensor, mask: Tensor, *, grad_clip: float, lr: float
) -> dict[str, Tensor]:
    """A mini-batch's regime diagnostics before its step (`vespo.diagnostics`, the lab's definitions): `actor/grad_norm`
    (before clipping), `actor/lr`, `actor/grad_clipped` (1 when grad_clip cut the step; its mean over a rollout step is
    the clip fraction), `is/top1pct_w_share`, `is/kl_mu_pi` (k3 KL(mu || pi) per token, also target_kl's estimate) and
    `is/log_w_std` (std of sequence log W over sequences); (M, T) log pi, mu and mask."""
    drift = diagnostics.stale_drift(log_prob, old_log_prob, mask)
    return {
        "actor/grad_norm": grad_norm,
        "actor/lr": torch.tensor(float(lr)),  # a Python float: no sync
        "actor/grad_clipped": diagnostics.clip_bound(grad_norm, grad_clip),
        "is/top1pct_w_share": top_share(seq_log_ratio(log_prob, old_log_prob, mask.to(log_prob.dtype))),
        "is/kl_mu_pi": drift["kl_mu_pi"],
        "is/log_w_std": drift["log_w_std"],
    }


def step_outcome(
    optimizer: torch.optim.Optimizer,
    grad_norm: Tensor,
    *,
    finite: bool,
    stop: bool,
    kl: Tensor,
    target_kl: float | None,
) -> dict[str, Tensor]:
    """What became of the step, once the host knows (`finite`, `stop`): `actor/nonfinite_grad`, `actor/momentum_share`
    (share of the coming step from the current gradient, from the optimizer state before the step; nan for a skipped
    non-finite step) and, with target_kl, its estimate `actor/target_kl_k3` and `actor/kl_stopped` (1 where the KL
    stops the update)."""
    out = {"actor/nonfinite_grad": torch.tensor(float(not finite))}
    out["actor/momentum_share"] = diagnostics.momentum_share(optimizer) if finite else grad_norm.new_tensor(math.nan)
    if target_kl is not None:
        out["actor/target_kl_k3"], out["actor/kl_stopped"] = kl, torch.tensor(float(stop))
    return out


def summarize_update(history: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The update's metrics over its mini-batches: the mean of each, plus the first and last mini-batch of the
    `PER_INDEX` keys (the first is on-policy, the last the stalest: their gap is the staleness), and the gradient
    probe's `probe/*` from the mini-batch that ran it."""
    trained = [h for h in history if not h.get("actor/kl_stopped", 0)]  # a target_kl stop trains nothing
    per_step = [key for key in trained[0] if not key.startswith(diagnostics.PROBE_PREFIX)] if trained else []
    out = {key: torch.stack([h[key] for h in trained]).float().mean() for key in per_step}
    out |= {key: v for h in trained for key, v in h.items() if key.startswith(diagnostics.PROBE_PREFIX)}
    out["actor/num_mini_batches"] = torch.tensor(float(len(trained)))
    if "actor/kl_stopped" in history[-1]:
        out["actor/kl_stopped"] = history[-1]["actor/kl_stopped"]
    for key in PER_INDEX:
        if trained and key in trained[0]:
            out[f"{key}/first_mini_batch"] = trained[0][key]
            out[f"{key}/last_mini_batch"] = trained[-1][key]
    return out


def to_floats(metrics: dict[str, Tensor | float]) -> dict[str, float]:
    """A logged step's metrics as Python floats: the tensors are stacked and copied to the host once."""
    keys = [k for k, v in metrics.items() if isinstance(v, Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, Tensor)}
    if keys:
        values = torch.stack([metrics[k].detach().float().reshape(()).cpu() for k in keys]).tolist()
        out |= dict(zip(keys, values, strict=True))
    return {k: out[k] for k in metrics}
