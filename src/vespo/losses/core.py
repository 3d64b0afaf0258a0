"""The shared pieces of every policy loss: log ratios and sequence log W with one guard convention, the
train-inference correction, and the weight diagnostics. Pure tensor functions, no registry, no I/O.

Guards shared with veRL, the official VESPO code and TRL (docs/losses.md): per-token log(pi/mu) clamped to
[-20, 20] before any exp or sum; VESPO's sequence log W clamped to [log 1e-8, 20].
"""

from __future__ import annotations

import math

import torch

from vespo.kernels import effective_sample_size

Tensor = torch.Tensor

ROLLOUT_IS_THRESHOLD = 2.0  # C in min(mu/pi_rollout, C): veRL's rollout_is_threshold default (official VESPO code)
LOG_PROB_MAX = 1e-3  # validation: log-probs above this are an error (numerical slack of log_softmax in bf16/fp16)
TOKEN_LOG_RATIO_CLAMP = 20.0  # per-token log(pi/mu) clamped to [-20, 20] before any exp or sum (veRL, VESPO, TRL)
LOG_W_MIN = math.log(1e-8)  # VESPO: sequence log W and per-token rollout log-weights floored at log 1e-8 (VESPO, TRL)
LOG_W_MAX = 20.0  # VESPO: sequence log W capped at 20 (W <= 4.9e8, where phi is exactly 0 in float32)
W_LARGE = math.log(100.0)  # diagnostics: sequences with W > 100 and A < 0 are the ones the paper worries about


def row_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Masked sum over each row, (B, T) x (B, T) -> (B,), as a row-wise dot product (one pass, no temporary)."""
    return torch.linalg.vecdot(x, mask)


def compact_advantages(adv: Tensor) -> Tensor:
    """Advantages as (B, 1) when they are one per sequence (a stride-0 row view), else the (B, T) tensor itself."""
    return adv[:, :1] if adv.stride(-1) == 0 else adv


def seq_advantage(adv: Tensor, mask: Tensor) -> Tensor:
    """Sequence-level advantage (B,): A itself for one advantage per sequence, else the masked token mean."""
    if adv.stride(-1) == 0:
        return adv[:, 0]
    return row_sum(adv, mask) / mask.sum(-1).clamp(min=1.0)


def select_by(cond: Tensor, if_true: float, if_false: float, like: Tensor) -> Tensor:
    """Per-element hyperparameter choice (e.g. by advantage sign) in `like`'s dtype and device."""
    return torch.full_like(like, if_false).masked_fill(cond, if_true)


def token_log_ratio(log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    """log(pi/mu) per token, clamped to [-20, 20] (the veRL / VESPO / TRL guard against exp overflow)."""
    diff = log_prob - old_log_prob
    if diff.requires_grad:
        return diff.clamp(-TOKEN_LOG_RATIO_CLAMP, TOKEN_LOG_RATIO_CLAMP)
    return diff.clamp_(-TOKEN_LOG_RATIO_CLAMP, TOKEN_LOG_RATIO_CLAMP)  # in place on the fresh temporary


def seq_log_ratio(log_prob: Tensor, old_log_prob: Tensor, mask: Tensor, *, clamp_tokens: bool = True) -> Tensor:
    """Sequence log W = sum_t log(pi/mu) over valid tokens (B,): the one definition every loss, metric and loop uses.

    Each token's log-ratio is clamped to [-20, 20] first (the veRL / VESPO / TRL guard); `clamp_tokens=False` is for
    a method whose weight cannot overflow and whose source sums the raw ratios (TOPR's clip(W, 0, 1))."""
    if not clamp_tokens:
        return row_sum(log_prob - old_log_prob, mask)
    return row_sum(token_log_ratio(log_prob, old_log_prob), mask)


def top_share(log_weights: Tensor, valid: Tensor | None = None, share: float = 0.01) -> Tensor:
    """Share of the total weight carried by the ceil(share * n) largest of the n valid weights, from log weights
    (max-shifted: no overflow), 0-dim. One definition for W (`is/top1pct_w_share`) and phi (`adaptive/top1_share`)."""
    valid = torch.ones_like(log_weights, dtype=torch.bool) if valid is None else valid
    lw = log_weights.masked_fill(~valid, -math.inf)
    w = torch.nan_to_num(torch.exp(lw - lw.max().clamp(min=-1e30)), nan=0.0)  # -inf rows give 0
    top = torch.sort(w, descending=True).values
    k = torch.ceil(share * valid.sum()).clamp(min=1)
    ranks = torch.arange(top.numel(), device=top.device)
    return (top * (ranks < k)).sum() / top.sum().clamp(min=1e-30)


def kl_k3(log_ratio: Tensor, clamp: float | None = None) -> Tensor:
    """k3 estimator of KL per token, exp(x) - x - 1 >= 0 with x = log(q/p) for samples of p (Schulman 2020).

    With x = log(pi_ref/pi) it is the KL(pi || pi_ref) penalty of GRPO (TRL, veRL's "low_var_kl" with clamp=10).
    """
    kl = torch.expm1(log_ratio) - log_ratio
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of a per-sequence quantity (B,) over the sequences with at least one valid token."""
    seq_valid = (mask.sum(-1) > 0).to(x.dtype)
    return (x * seq_valid).sum() / seq_valid.sum().clamp(min=1.0)


def weight_metrics(prefix: str, weight: Tensor, adv: Tensor, valid: Tensor) -> dict[str, Tensor]:
    """mean/min/max of an effective gradient weight per advantage sign, and its normalised ESS.

    `weight`, `adv`, `valid` share one shape: (B,) for sequence-level methods or (B, T) for token-level ones.
    """
    w = weight.detach().float()
    valid = valid.bool()
    out: dict[str, Tensor] = {}
    for sign, sel in (("pos", valid & (adv >= 0)), ("neg", valid & (adv < 0))):
        n = sel.sum()
        any_ = n > 0
        zero = torch.zeros((), device=w.device)
        out[f"{prefix}/mean_{sign}"] = torch.where(any_, (w * sel).sum() / n.clamp(min=1), zero)
        out[f"{prefix}/min_{sign}"] = torch.where(any_, torch.where(sel, w, math.inf).min(), zero)
        out[f"{prefix}/max_{sign}"] = torch.where(any_, torch.where(sel, w, -math.inf).max(), zero)
    log_w = torch.log(w.clamp(min=0.0))  # zero weights (clipped) are log 0 = -inf: no mass in the ESS
    ess = effective_sample_size(log_w.flatten(), valid.flatten())
    out[f"{prefix}/ess"] = torch.nan_to_num(ess, nan=0.0)
    return out


def token_weight_metrics(weight: Tensor, adv: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Mean and max of a per-token weight (B, T) >= 0 per advantage sign, and its Kish ESS over tokens.

    Computed from row reductions (a few passes over (B, T)); no min: for clipped methods it is 0 whenever one
    token is clipped, and a masked min costs more than the loss itself.
    """
    w = weight.detach()
    wm = w * mask  # (B, T), 0 on padding
    sums: dict[str, tuple[Tensor, Tensor, Tensor]] = {}  # sign -> (sum of w, count, max of w)
    if adv.stride(-1) != 0:  # token-level advantages: select tokens by sign
        for sign, sel in (("pos", adv >= 0), ("neg", adv < 0)):
            sums[sign] = ((wm * sel).sum(), (mask * sel).sum(), (wm * sel).amax())
    else:
        a = adv[:, 0]  # (B,)
        lengths, row_sums, row_max = mask.sum(-1), wm.sum(-1), wm.amax(-1)  # (B,) each; w >= 0
        for sign, sel in (("pos", a >= 0), ("neg", a < 0)):
            sums[sign] = ((row_sums * sel).sum(), (lengths * sel).sum(), (row_max * sel).amax())
    out: dict[str, Tensor] = {}
    for sign, (total, n, top) in sums.items():
        out[f"weight/mean_{sign}"] = total / n.clamp(min=1.0)
        out[f"weight/max_{sign}"] = top
    total, sq_total = sums["pos"][0] + sums["neg"][0], torch.dot(w.reshape(-1), wm.reshape(-1))
    ess = total * total / (mask.sum() * sq_total).clamp(min=1e-30)  # Kish: (sum w)^2 / (n sum w^2)
    out["weight/ess"] = torch.where(sq_total > 0, ess, torch.zeros_like(ess))
    return out


def ratio_metrics(log_w: Tensor, adv: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Diagnostics of W = pi/mu common to all methods, from log W = sum_t log(pi/mu) (tokens clamped at +-20), (B,)."""
    lengths = mask.sum(-1)
    seq_valid = lengths > 0
    a_seq = seq_advantage(adv, mask)
    zero = torch.zeros((), dtype=log_w.dtype, device=log_w.device)
    any_valid = seq_valid.any()  # a fully masked (padding) micro-batch reports 0, not +-inf, into averaged logs
    return {
        "is/log_w_mean": (log_w * seq_valid).sum() / seq_valid.sum().clamp(min=1),
        "is/log_w_min": torch.where(any_valid, torch.where(seq_valid, log_w, math.inf).min(), zero),
        "is/log_w_max": torch.where(any_valid, torch.where(seq_valid, log_w, -math.inf).max(), zero),
        # k1 estimate of KL(mu || pi) per token, mean of -log(pi/mu) (veRL's ppo_kl); free given log W
        "is/approx_kl": -log_w.sum() / lengths.sum().clamp(min=1.0),
        # normalised Kish ESS of the sequence IS weights W over the batch: how many sequences carry the estimate
        "is/ess": torch.nan_to_num(effective_sample_size(log_w, seq_valid), nan=0.0),
        "is/n_w_gt_100_neg_adv": ((log_w > W_LARGE) & (a_seq < 0) & seq_valid).sum().float(),
    }


# --------------------------------------------------------------------------------------------------------------------
# Methods
