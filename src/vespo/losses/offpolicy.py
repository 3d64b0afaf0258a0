"""The off-policy corrections of 2025-26, each exact to its primary source (docs/methods/index.md has each one's
source, defaults and guards): M2PO, OPSM, AIPO and VCPO's loss, then the trust-region and length corrections of
2026, DPPO and LUSPO. The same signature and registry as the paper's methods (`vespo.losses.methods`).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from vespo.aggregation import masked_mean
from vespo.losses.core import (
    BatchContext,
    compact_advantages,
    ppo_clip_loss,
    row_sum,
    token_clip_metrics,
    token_log_ratio,
    token_weight_metrics,
    trust_region_m2,
)
from vespo.losses.methods import PPO_BOUNDS, gspo
from vespo.losses.registry import LossFn, register_method

Tensor = torch.Tensor


def m2po_cutoff(m2: Tensor, threshold: float) -> tuple[Tensor, Tensor, Tensor]:
    """M2PO's Algorithm 1 on the trust-region tokens of `m2` (entries >= 0; -1 marks the others, any shape): mask
    the largest M2 until the mean M2 of the remaining ones is <= `threshold`.

    Returns (c, M2 before, M2 after), 0-dim: the tokens to mask are those with M2 >= c (+inf when none is), which is
    the algorithm's top-k set (k = the first count whose remaining mean is <= threshold; means of a descending
    suffix only fall, so one sort and one suffix sum find it). A value tied with the k-th largest is masked with it,
    which only lowers the remaining mean. No host sync."""
    v = m2.reshape(-1)
    s = torch.sort(v, descending=True).values.clamp_(min=0.0)  # trust-region values first; the -1s become trailing 0s
    n = (v >= 0).sum()
    suffix = torch.cat([s.flip(0).cumsum(0).flip(0), s.new_zeros(1)])  # (N + 1,) sum of s[j:], small values first
    j = torch.arange(suffix.numel(), device=v.device)
    remaining = (n - j).clamp(min=0)
    ok = (j >= n) | (suffix <= threshold * remaining)  # masking j tokens leaves a mean <= tau (or nothing left)
    k = ok.to(torch.uint8).argmax()  # the first such j: the number of tokens to mask
    cutoff = torch.where(k > 0, s[(k - 1).clamp(min=0)], math.inf)
    kept = (v >= 0) & (v < cutoff)
    before = suffix[0] / n.clamp(min=1)
    after = (v * kept).sum() / kept.sum().clamp(min=1)
    return cutoff, before, after


@register_method("m2po", inputs=("log_ratio", "batch_context"), bounds={"m2_threshold": ("(0, inf)", "M2PO's tau_M2")})
def m2po(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
    log_ratio: Tensor | None = None,
    batch_context: BatchContext | None = None,
    m2_threshold: float = 0.04,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """M2PO (Zheng et al. 2025, arXiv 2510.01161): loss = -M * r * A per token, r = pi/mu, M in {0, 1}.

    M masks trust-region tokens (`core.trust_region_m2`: A > 0 with r > 1, or A < 0 with r < 1) with the largest
    M2 = (log r)^2 until the mean M2 of the remaining ones is <= tau_M2 = `m2_threshold` (Algorithm 1; tau = 0.04 in
    all the paper's runs). The ratio is not clipped (the paper's objective); masked tokens keep their place in the
    normaliser. The mask is decided over the whole mini-batch: `batch_context.m2` (the mini-batch's trust-region M2,
    `vespo.losses.adaptive.batch_context`) when given, else this call's tokens.
    """
    if log_ratio is None:
        log_ratio = token_log_ratio(log_prob.detach(), old_log_prob)
    adv = compact_advantages(advantages)
    m2 = trust_region_m2(log_ratio, adv, mask)  # (B, T), -1 off the trust region
    decide = m2 if batch_context is None or batch_context.m2 is None else batch_context.m2.to(m2.dtype)
    cutoff, before, after = m2po_cutoff(decide, m2_threshold)
    keep = m2 < cutoff  # (B, T): every token off the trust region (-1) is kept
    ratio = torch.exp(token_log_ratio(log_prob, old_log_prob))  # (B, T), with gradient r * grad log pi
    loss = ratio * -adv * keep
    metrics = token_weight_metrics(ratio.detach() * keep, advantages, mask)
    metrics |= {"m2po/masked_frac": masked_mean(~keep, mask), "m2po/m2": before, "m2po/m2_after": after}
    return loss, metrics


def off_policy_sequence_mask(
    advantages: Tensor, log_prob: Tensor, sampler_log_prob: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, Eq. 9), 1 = keep, 0 = drop; (B, 1) for (B, 1)
    advantages, (B, T) for token-level ones.

    Drops a sequence with A < 0 whose mean k1 divergence (1/|o|) sum_t log(pi_sampler / pi) exceeds `threshold`.
    A NaN sampler log-prob (a token the engine could not score) counts as no divergence, as TRL's
    `get_off_policy_mask`."""
    kl = torch.nan_to_num(sampler_log_prob - log_prob.detach(), nan=0.0)  # (B, T)
    seq_kl = row_sum(kl, mask).unsqueeze(-1) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    return ((advantages >= 0) | (seq_kl <= threshold)).to(mask.dtype)


@register_method(
    "opsm",
    default_loss_agg_mode="seq-mean-token-mean",
    inputs=("rollout_log_prob",),
    bounds={**PPO_BOUNDS, "off_policy_mask_threshold": ("(0, inf)", "DeepSeek-V3.2's delta")},
)
def opsm(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
    rollout_log_prob: Tensor | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    off_policy_mask_threshold: float = 0.5,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """GRPO with DeepSeek-V3.2's off-policy sequence masking (its Eq. 9; TRL's `off_policy_mask_threshold`).

    PPO clip per token, r = pi/mu clipped to [1 - 0.2, 1 + 0.2] (no dual clip), times the mask
    `off_policy_sequence_mask` with pi_sampler = `rollout_log_prob` (the engine that sampled) when given, else mu,
    as TRL. delta = 0.5 is TRL's documented example (DeepSeek-V3.2 states none).
    """
    sampler = old_log_prob if rollout_log_prob is None else rollout_log_prob
    adv = compact_advantages(advantages)
    keep = off_policy_sequence_mask(adv, log_prob, sampler, mask, off_policy_mask_threshold)  # (B, 1) or (B, T)
    ratio = torch.exp(token_log_ratio(log_prob, old_log_prob))  # (B, T)
    loss, active, clipped, dual = ppo_clip_loss(ratio, adv, 1 - clip_ratio_low, 1 + clip_ratio_high, None)
    metrics = token_clip_metrics(ratio, active & (keep > 0), clipped, dual, advantages, mask)
    dropped = (1.0 - keep).expand(mask.shape)
    seq_valid = mask.sum(-1) > 0
    metrics["opsm/masked_frac"] = ((dropped[:, 0] > 0) & seq_valid).sum() / seq_valid.sum().clamp(min=1)
    metrics["opsm/masked_token_frac"] = masked_mean(dropped, mask)
    return loss * keep, metrics


@register_method("aipo", bounds={"delta": ("(0, inf)", "the importance-sampling cap")})
def aipo(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, delta: float = 8.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """AIPO, token level as prime-rl trains it (docs/async.md; `grpo_loss_ratio`): loss = -min(r, delta) * A per
    token, r = pi/mu, delta = 8 (prime-rl's `RatioConfig.clip_ratio`).

    The cap is a min, not a detached weight: a token with r > delta contributes the constant delta * A and no
    gradient; below it the gradient is r * A * grad log pi (unclipped importance sampling).
    """
    ratio = torch.exp(token_log_ratio(log_prob, old_log_prob))  # (B, T)
    loss = torch.clamp(ratio, max=delta) * -compact_advantages(advantages)
    r = ratio.detach()
    metrics = token_weight_metrics(r * (r <= delta), advantages, mask)
    metrics["clip/frac"] = masked_mean(r > delta, mask)
    return loss, metrics


@register_method("vcpo", default_loss_agg_mode="seq-mean-token-mean", rollout_correction="sequence")
def vcpo(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """VCPO's policy loss (Huang et al. 2026, arXiv 2602.17616; mit-han-lab/vcpo): loss = -r * A per token, r = pi/mu
    unclipped (its scripts run veRL's PPO loss with bounds [0, 1e9] and dual clip 1e9, which never bind once log r
    is clamped at 20), sequence-level rollout correction, seq-mean-token-mean.

    VCPO itself is this loss plus two controls that are not per-token: ESS step scaling (`vespo train
    --step-scale ess_sqrt`, the learner's step path) and the off-policy optimal baseline (`--adv-estimator opob`,
    `vespo.advantages.opob_advantages`); the sweep's `vcpo` variant sets all three.
    """
    ratio = torch.exp(token_log_ratio(log_prob, old_log_prob))  # (B, T)
    return ratio * -compact_advantages(advantages), token_weight_metrics(ratio.detach(), advantages, mask)


# --------------------------------------------------------------------------------------------------------------------
# The trust-region and length corrections of 2026: DPPO and LUSPO


def _binary_kl(log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    """DPPO's binary KL per token, KL(Bern(mu_t) || Bern(pi_t)) of the sampled token's probability, as veRL's
    `dppo_kl` computes it (1e-8 inside the log of the complements); probabilities capped at 1 (log-probs may exceed 0
    by LOG_PROB_MAX)."""
    p, q = torch.exp(log_prob).clamp(max=1.0), torch.exp(old_log_prob).clamp(max=1.0)
    return q * (old_log_prob - log_prob) + (1.0 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))


def _dppo(
    divergence: Literal["tv", "kl"],
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    low: float,
    high: float,
    clip_ratio_c: float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary (Qi et al. 2026, arXiv 2602.04879, Eq. of the binary trust region) as veRL 0.9.1's `dppo_tv` /
    `dppo_kl`: loss = -A * sg(min(r, C)) * log pi * M per token, M = 0 where the token left the trust region in the
    direction its advantage rewards, r = pi/mu (log r clamped to +-20)."""
    lp = log_prob.detach()
    ratio = torch.exp(token_log_ratio(lp, old_log_prob))  # (B, T), detached
    weight = ratio if clip_ratio_c is None else ratio.clamp(max=clip_ratio_c)
    adv = compact_advantages(advantages)
    if divergence == "tv":  # p - p_old <= high for A > 0, >= -low otherwise
        diff = torch.exp(lp) - torch.exp(old_log_prob)
        valid = torch.where(adv > 0, diff <= high, diff >= -low)
    else:  # binary KL within its bound, or the probability moved against the advantage's direction
        kl, p, q = _binary_kl(lp, old_log_prob), torch.exp(lp), torch.exp(old_log_prob)
        valid = torch.where(adv > 0, (kl <= high) | (p <= q), (kl <= low) | (p >= q))
    coef = weight * valid  # (B, T) detached
    loss = log_prob * (-adv * coef)
    metrics = token_weight_metrics(coef, advantages, mask)
    metrics["clip/frac"] = masked_mean(~valid, mask)  # veRL's pg_clipfrac: tokens outside the trust region
    truncated = (ratio > clip_ratio_c) & valid if clip_ratio_c is not None else torch.zeros_like(valid)
    metrics["clip/frac_lower"] = masked_mean(truncated, mask)  # veRL's pg_clipfrac_lower: r truncated at C
    return loss, metrics


_DPPO_C = ("(0, inf)", "DPPO's truncated IS cap C; None: no cap")


def _dppo_method(name: str, divergence: Literal["tv", "kl"], threshold: float, doc: str) -> LossFn:
    """The registered DPPO-Binary function of one divergence: thresholds (clip_ratio_low, clip_ratio_high) and the
    cap `clip_ratio_c` are its keyword hyperparameters (veRL's names and `ActorConfig` fields)."""

    def method(

        log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
        clip_ratio_low: float = threshold,
        clip_ratio_high: float = threshold,
        clip_ratio_c: float | None = 20.0,
    ) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
        return _dppo(
            divergence, log_prob, old_log_prob, advantages, mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
        )

    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc
    kind = ("[0, 1]", "a probability difference") if divergence == "tv" else ("[0, inf)", "a binary KL")
    bounds = {"clip_ratio_low": kind, "clip_ratio_high": kind, "clip_ratio_c": _DPPO_C}
    return register_method(name, bounds=bounds)(method)


dppo_tv = _dppo_method(
    "dppo_tv",
    "tv",
    0.15,
    """DPPO-Binary-TV (arXiv 2602.04879; veRL's `dppo_tv`): a token is masked when pi_t - mu_t > `clip_ratio_high`
    (A > 0) or < -`clip_ratio_low` (A <= 0); loss = -A * sg(min(r, C)) * log pi on the rest, r = pi/mu.

    Defaults: TV threshold 0.15 (veRL's examples/dppo_trainer), C = 20 (veRL's fallback for `clip_ratio_c`;
    prime-rl's default loss has no cap: C = None, thresholds 0.2, with `kl_tau=1e-3`).
    """,
)
dppo_kl = _dppo_method(
    "dppo_kl",
    "kl",
    0.05,
    """DPPO-Binary-KL (arXiv 2602.04879; veRL's `dppo_kl`): a token is masked when its binary KL
    mu log(mu/pi) + (1 - mu) log((1 - mu)/(1 - pi)) exceeds `clip_ratio_high` with pi > mu (A > 0), or
    `clip_ratio_low` with pi < mu (A <= 0); loss = -A * sg(min(r, C)) * log pi on the rest.

    Defaults: KL threshold 0.05 (veRL's examples/dppo_trainer), C = 20 (veRL's fallback for `clip_ratio_c`).
    """,
)


# LUSPO (Liu et al. 2026, arXiv 2602.05261; TRL's `loss_type="luspo"`) is GSPO with each sequence's loss scaled by
# its length |y|: GSPO's loss matrix aggregated seq-mean-token-sum (TRL: sum over the tokens, mean over sequences),
# so a long sequence is no longer weighted by 1/|y|. GSPO's bounds (TRL applies its generic epsilon 0.2 unless set).
luspo = register_method(
    "luspo", default_loss_agg_mode="seq-mean-token-sum", rollout_correction="sequence", bounds=PPO_BOUNDS
)(gspo)
