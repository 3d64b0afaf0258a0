"""The registered policy losses of the paper: VESPO and the baselines it is compared with (REINFORCE, GRPO, BAPO,
GSPO, SAPO, TOPR, CISPO), each exact to its primary source; the off-policy corrections of 2025-26 are in
`vespo.losses.offpolicy`.

Every method is `fn(log_prob, old_log_prob, advantages, mask, *, **hparams) -> (loss_mat (B, T), metrics)`; see
`vespo.losses.compute` for what the core passes and `vespo.losses.registry` for how it is registered.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from vespo.aggregation import masked_mean
from vespo.kernels import kernel_range_problem, log_variance_bound_K, vespo_log_phi
from vespo.losses import core
from vespo.losses.core import (
    LOG_W_MAX,
    LOG_W_MIN,
    compact_advantages,
    ppo_clip_loss,
    row_sum,
    select_by,
    seq_advantage,
    seq_log_ratio,
    token_clip_metrics,
    token_log_ratio,
    token_weight_metrics,
    weight_metrics,
)
from vespo.losses.registry import register_method

Tensor = torch.Tensor
_GSPO_LOG_RATIO_MAX = 10.0  # GSPO: token-level log s_i,t capped at 10 (veRL)
_BAPO_EPS = 1e-8  # BAPO: positive/negative contribution ratio = pos / (neg + eps) (authors' code)


@register_method("reinforce")
def reinforce(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """On-policy REINFORCE, loss = -A * log pi (no importance weight)."""
    loss = log_prob * -compact_advantages(advantages)  # (B, T)
    a_seq = seq_advantage(advantages, mask)
    return loss, weight_metrics("weight", torch.ones_like(a_seq), a_seq, mask.sum(-1) > 0)


_PROP_31 = ("(0, inf)", "Prop. 3.1")


def _vespo_check(hp: dict[str, object]) -> str | None:
    """Both signs' kernels keep phi and the logged K phi W finite in float32 (`kernels.kernel_range_problem`)."""
    for sign in ("_pos", "_neg"):
        problem = kernel_range_problem(hp[f"c1{sign}"], hp[f"c2{sign}"], sign, bound=True)
        if problem:
            return problem
    return None


@register_method(
    "vespo",
    rollout_correction="fold",
    inputs=("rollout_log_w", "seq_log_ratio"),
    bounds={"c1_pos": _PROP_31, "c2_pos": _PROP_31, "c1_neg": _PROP_31, "c2_neg": _PROP_31},
    check=_vespo_check,
)
def vespo(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
    rollout_log_w: Tensor | None = None,
    seq_log_ratio: Tensor | None = None,
    c1_pos: float = 2.0,
    c2_pos: float = 3.0,
    c1_neg: float = 3.0,
    c2_neg: float = 2.0,
    length_norm: Literal["none", "sqrt", "linear"] = "none",
    positive_weight: Literal["phi", "one"] = "phi",
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """VESPO (paper Eq. 12 and Appendix I): loss = -sg(phi(W)) * A * log pi with W = prod_t pi/mu (no length norm).

    phi(W) = W^c1 exp(c2 (1 - W)), (c1, c2) = (c1_pos, c2_pos) for A >= 0 else (c1_neg, c2_neg), computed in log
    space and detached, so the gradient is phi(W) * A * grad log pi. `rollout_log_w` (the truncated train-inference
    log-weight) is added to log W, as the official code folds veRL's rollout IS weights. `length_norm` "sqrt" /
    "linear" divides log W by sqrt(T) / T: the paper's ablations (Sec. 4.7), not the method. `positive_weight` "one"
    puts weight 1 on A >= 0 sequences (TOPR's weight on positives) and keeps phi(W) on A < 0: an ablation (issue 29).
    Guards (as the official code and TRL): token log-ratios clamped to [-20, 20]; log W clamped to [log 1e-8, 20].
    """
    log_w = seq_log_ratio  # (B,) log prod_t pi/mu, computed by the core (or here when called directly)
    if log_w is None:  # the keyword shadows the function: reach it through its module
        log_w = core.seq_log_ratio(log_prob.detach(), old_log_prob, mask)
    if rollout_log_w is not None:
        log_w = log_w + rollout_log_w  # now log pi/pi_rollout, with the sampler part truncated
    if length_norm != "none":
        lengths = mask.sum(-1).clamp(min=1.0)  # (B,)
        log_w = log_w / (lengths.sqrt() if length_norm == "sqrt" else lengths)
    log_w = log_w.clamp(LOG_W_MIN, LOG_W_MAX)

    a_seq = seq_advantage(advantages, mask)  # (B,)
    pos = a_seq >= 0
    c1 = select_by(pos, c1_pos, c1_neg, log_w)
    c2 = select_by(pos, c2_pos, c2_neg, log_w)
    log_phi = vespo_log_phi(log_w, c1, c2)  # (B,)
    phi = torch.exp(log_phi)  # detached: log_w was built from log_prob.detach()
    if positive_weight == "one":  # ablation: TOPR's weight 1 on A >= 0, phi(W) kept on A < 0
        phi = torch.where(pos, torch.ones_like(phi), phi)
    loss = log_prob * (-phi.unsqueeze(-1) * compact_advantages(advantages))  # (B, T)

    seq_valid = mask.sum(-1) > 0
    metrics = weight_metrics("weight", phi, a_seq, seq_valid)
    # Prop. 3.1 on the batch: E_mu[phi^2] = Z E_Q[phi] <= Z K E_Q[W] = E_mu[K phi W]; the two sides are logged.
    # K = inf for c1 < 1 (the bound is vacuous): the logged side then saturates at the float32 maximum
    log_k = select_by(pos, log_variance_bound_K(c1_pos, c2_pos), log_variance_bound_K(c1_neg, c2_neg), log_w)
    n = seq_valid.sum().clamp(min=1)
    metrics["vespo/phi_sq_mean"] = (phi.square() * seq_valid).sum() / n
    bound = torch.where(seq_valid, torch.exp(log_k + log_phi + log_w), 0.0).sum() / n
    metrics["vespo/bound_K_phi_w_mean"] = torch.nan_to_num(bound, posinf=torch.finfo(bound.dtype).max)
    metrics["vespo/Z"] = (phi * seq_valid).sum() / n
    return loss, metrics


PPO_BOUNDS = {"clip_ratio_low": "[0, 1)", "clip_ratio_high": "[0, inf)"}


@register_method("grpo", bounds={**PPO_BOUNDS, "clip_ratio_c": ("(1, inf)", "dual clip")})
def grpo(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """Token-level PPO clip with DAPO's decoupled bounds (1 - 0.2, 1 + 0.28) and dual clip c = 3 (paper Eq. 6).

    r_t = pi/mu per token; loss = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), capped at -A c for A < 0.
    """
    ratio = torch.exp(token_log_ratio(log_prob, old_log_prob))  # (B, T)
    adv = compact_advantages(advantages)
    loss, active, clipped, dual = ppo_clip_loss(ratio, adv, 1 - clip_ratio_low, 1 + clip_ratio_high, clip_ratio_c)
    return loss, token_clip_metrics(ratio, active, clipped, dual, advantages, mask)


_BAPO_MAX_STEPS = 100  # BAPO: at most this many raises of each bound (the authors' config takes 4 and 16)


def _bapo_steps(start: float, stop: float, step: float) -> float:
    """How many raises of `step` take a BAPO bound from `start` to `stop` (0 when step = 0: the bound stays)."""
    return 0.0 if step <= 0 or stop <= start else math.ceil((stop - start) / step - 1e-9)


def _bapo_check(hp: dict[str, object]) -> str | None:
    if not 0 < hp["ratio_lower_start"] <= hp["ratio_lower_max"] < 1:
        return (
            f"need 0 < ratio_lower_start <= ratio_lower_max < 1, got {hp['ratio_lower_start']}, {hp['ratio_lower_max']}"
        )
    if not 1 < hp["ratio_upper_start"] <= hp["ratio_upper_max"]:
        return f"need 1 < ratio_upper_start <= ratio_upper_max, got {hp['ratio_upper_start']}, {hp['ratio_upper_max']}"
    for side in ("lower", "upper"):  # each candidate costs a pass over the tokens: the search is bounded
        start, stop, step = (hp[f"ratio_{side}_{k}"] for k in ("start", "max", "step"))
        if _bapo_steps(start, stop, step) > _BAPO_MAX_STEPS:
            return (
                f"ratio_{side}_step must be 0 or >= (ratio_{side}_max - ratio_{side}_start) / {_BAPO_MAX_STEPS} = "
                f"{(stop - start) / _BAPO_MAX_STEPS:.4g} (at most {_BAPO_MAX_STEPS} candidate bounds per side; "
                f"ratio_{side}_max <= {start + _BAPO_MAX_STEPS * step:.6g} at this step), "
                f"got ratio_{side}_step={step}, "
                f"ratio_{side}_max={stop}"
            )
    return None


@register_method(
    "bapo",
    bounds={
        "adv_ratio_target": "[0, inf)",
        "ratio_lower_step": "[0, inf)",
        "ratio_upper_step": "[0, inf)",
        "clip_ratio_c": ("(1, inf)", "dual clip"),
    },
    check=_bapo_check,
)
def bapo(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
    adv_ratio_target: float = 1.0,
    ratio_lower_start: float = 0.6,
    ratio_lower_max: float = 0.8,
    ratio_lower_step: float = 0.05,
    ratio_upper_start: float = 1.2,
    ratio_upper_max: float = 2.0,
    ratio_upper_step: float = 0.05,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """BAPO (Xi et al. 2025) as the authors' code (WooooDyy/BAPO, recipe/bapo/policy_loss.py) computes it.

    PPO clip with dual clip whose ratio bounds (c_low, c_high) are searched per call: the positive contribution
    sum_{A>0} min(r, c_high) A and the negative one sum_{A<0} max(r, c_low) |A| (all valid tokens, clipped ratios)
    must reach pos / (neg + 1e-8) >= `adv_ratio_target`; starting from (ratio_lower_start, ratio_upper_start),
    c_low is raised by its step up to ratio_lower_max first, then c_high up to ratio_upper_max, stopping at the
    first candidate that meets the target (else the last). Defaults: the authors' config. Each distinct bound costs
    one masked dot product over the tokens, without host syncs; the chosen bounds are in the metrics.
    """
    ratio = torch.exp(token_log_ratio(log_prob, old_log_prob))  # (B, T)
    lows, highs = _bapo_candidates(
        ratio_lower_start, ratio_lower_max, ratio_lower_step, ratio_upper_start, ratio_upper_max, ratio_upper_step
    )
    r = ratio.detach().reshape(-1)  # (N,)
    a = (advantages * mask).reshape(-1)  # (N,) 0 on padding
    pos_a, neg_a = a.clamp(min=0.0), a.clamp(max=0.0).neg_()  # A > 0 and |A| for A < 0
    dev, dt = r.device, r.dtype
    lows_t, highs_t = torch.tensor(lows, dtype=dt, device=dev), torch.tensor(highs, dtype=dt, device=dev)
    # One masked dot product per distinct bound (<= _BAPO_MAX_STEPS + 1 per side), no host sync:
    # sum min(r, c_high) A, sum max(r, c_low) |A|.
    buf = torch.empty_like(r)
    pos_by = {h: torch.dot(torch.clamp(r, max=h, out=buf), pos_a) for h in sorted(set(highs))}
    neg_by = {lo: torch.dot(torch.clamp(r, min=lo, out=buf), neg_a) for lo in sorted(set(lows))}
    pos = torch.stack([pos_by[h] for h in highs])  # (K,) per candidate, in search order
    neg = torch.stack([neg_by[lo] for lo in lows])
    ratio_pn = torch.where(neg <= 0, math.inf, pos / (neg + _BAPO_EPS))  # (K,)
    met = ratio_pn >= adv_ratio_target
    idx = torch.where(met.any(), met.to(torch.uint8).argmax(), torch.tensor(len(lows) - 1, device=dev))
    low, high = lows_t[idx], highs_t[idx]
    loss, active, clipped, dual = ppo_clip_loss(ratio, compact_advantages(advantages), low, high, clip_ratio_c)
    metrics = token_clip_metrics(ratio, active, clipped, dual, advantages, mask)
    # the ratio is inf without negative mass; its finite form pos / (pos + neg + eps) = ratio / (1 + ratio) is logged
    share = torch.where(neg <= 0, 1.0, pos / (pos + neg + _BAPO_EPS))[idx]
    metrics.update({"bapo/clip_low": low, "bapo/clip_high": high, "bapo/positive_share": share})
    return loss, metrics


def _bapo_candidates(
    low: float, low_max: float, low_step: float, high: float, high_max: float, high_step: float
) -> tuple[list[float], list[float]]:
    """The (c_low, c_high) pairs BAPO's search visits in order: c_low up to its maximum first, then c_high; at most
    `_BAPO_MAX_STEPS` raises per bound by construction (`_bapo_check` refuses settings that would need more)."""
    lows_up, highs_up = _raises(low, low_max, low_step), _raises(high, high_max, high_step)
    lows = lows_up + lows_up[-1:] * (len(highs_up) - 1)  # c_low stays at its last value while c_high rises
    highs = [high] * len(lows_up) + highs_up[1:]
    return lows, highs


def _raises(start: float, stop: float, step: float) -> list[float]:
    """`start`, then raised by `step` up to `stop` (at most `_BAPO_MAX_STEPS` raises; none when step is 0)."""
    out = [start]
    while len(out) <= _BAPO_MAX_STEPS and out[-1] < stop and step > 0:
        out.append(min(out[-1] + step, stop))
    return out


@register_method("gspo", default_loss_agg_mode="seq-mean-token-mean", rollout_correction="sequence", bounds=PPO_BOUNDS)
def gspo(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """GSPO (Zheng et al. 2025): sequence ratio s = (pi/mu)^(1/|y|), clipped to [1 - 3e-4, 1 + 4e-4] (paper Eq. 7).

    Token-level stop-gradient form s_t = sg(s) * pi_t / sg(pi_t), so the gradient is s * A * mean_t grad log pi_t
    under seq-mean-token-mean. log s_t is capped at 10 (veRL).
    """
    lengths = mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    log_s = row_sum(log_prob.detach() - old_log_prob, mask).unsqueeze(-1) / lengths  # (B, 1) mean log-ratio
    log_s_tok = torch.clamp(log_s + log_prob - log_prob.detach(), max=_GSPO_LOG_RATIO_MAX)  # (B, T)
    ratio = torch.exp(log_s_tok)
    adv = compact_advantages(advantages)
    loss, active, clipped, _ = ppo_clip_loss(ratio, adv, 1 - clip_ratio_low, 1 + clip_ratio_high, None)
    # clipping is decided per sequence (s and A are constant across it), so read it off any valid token
    first = (mask > 0).to(torch.uint8).argmax(-1, keepdim=True)
    weight = (ratio.detach() * active).gather(1, first).squeeze(1)  # (B,)
    metrics = weight_metrics("weight", weight, seq_advantage(advantages, mask), mask.sum(-1) > 0)
    metrics["clip/frac"] = masked_mean(clipped, mask)
    return loss, metrics


_SAPO_TAU = ("[1e-6, inf)", "the loss is scaled by 4 / tau")


@register_method(
    "sapo", default_loss_agg_mode="seq-mean-token-mean", bounds={"tau_pos": _SAPO_TAU, "tau_neg": _SAPO_TAU}
)
def sapo(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """SAPO (Gao et al. 2025): soft gate f(r) = sigma(tau (r - 1)) * 4 / tau per token, loss = -f(r) * A.

    tau = tau_pos for A > 0, tau_neg otherwise (as TRL / veRL). The gradient weight is f'(r) r = 4 sigma (1 - sigma) r,
    which is 1 at r = 1. Default aggregation seq-mean-token-mean, as veRL's and TRL's SAPO.
    """
    ratio = torch.exp(token_log_ratio(log_prob, old_log_prob))  # (B, T)
    adv = compact_advantages(advantages)
    tau = select_by(adv > 0, tau_pos, tau_neg, adv)  # (B, 1) or (B, T)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = gate * (-4.0 / tau * adv)  # coefficient (B, 1) for one advantage per sequence
    g = gate.detach()
    weight = torch.mul(g, 1.0 - g).mul_(ratio.detach()).mul_(4.0)  # in place on the temporaries
    return loss, token_weight_metrics(weight, advantages, mask)


@register_method("topr", default_loss_agg_mode="seq-mean-token-sum", rollout_correction="sequence")
def topr(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
    ratio_level: Literal["product", "geometric"] = "product",
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """TOPR (Le Roux et al. 2025): weight 1 for A >= 0, sg(clip(W, 0, 1)) for A < 0; loss = -weight * A * log pi.

    `ratio_level="product"` uses W = prod_t pi/mu (the TOPR paper); "geometric" uses (prod_t pi/mu)^(1/|y|), the
    length-normalised variant. Only the sequence log W is clamped (at 0: clip(W, 0, 1) = exp(min(log W, 0)), never
    overflows), not the token log-ratios. Default aggregation seq-mean-token-sum: the paper's gradient sums
    weight * A * grad log pi over the whole sequence.
    """
    log_w = seq_log_ratio(log_prob.detach(), old_log_prob, mask, clamp_tokens=False)  # (B,) raw sum
    if ratio_level == "geometric":
        log_w = log_w / mask.sum(-1).clamp(min=1.0)
    a_seq = seq_advantage(advantages, mask)
    weight = torch.where(a_seq >= 0, 1.0, torch.exp(log_w.clamp(max=0.0)))  # (B,)
    loss = log_prob * (-weight.unsqueeze(-1) * compact_advantages(advantages))
    seq_valid = mask.sum(-1) > 0
    metrics = weight_metrics("weight", weight, a_seq, seq_valid)
    neg = (a_seq < 0) & seq_valid
    # clipped: A < 0 sequences with W > 1, whose weight clip(W, 0, 1) = 1 is not W; share of the A < 0 sequences
    metrics["clip/frac"] = (neg & (log_w > 0)).sum() / neg.sum().clamp(min=1)
    return loss, metrics


def _cispo_check(hp: dict[str, object]) -> str | None:
    if hp["ratio_min"] is not None and not hp["ratio_min"] < hp["ratio_max"]:
        return f"need ratio_min < ratio_max, got {hp['ratio_min']}, {hp['ratio_max']}"
    return None


@register_method(
    "cispo", inputs=("log_ratio",), bounds={"ratio_max": "(0, inf)", "ratio_min": "[0, inf)"}, check=_cispo_check
)
def cispo(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
    log_ratio: Tensor | None = None,
    ratio_max: float = 5.0,
    ratio_min: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """CISPO (MiniMax-M1, 2025): loss = -sg(clip(r, ratio_min, ratio_max)) * A * log pi per token.

    MiniMax-M1 sets no lower bound; the upper bound 5.0 is ScaleRL's recommendation (TRL's default for CISPO).
    Unlike PPO clipping, clipped tokens keep their gradient, only their weight is capped.
    """
    if log_ratio is None:
        log_ratio = token_log_ratio(log_prob.detach(), old_log_prob)
    ratio = torch.exp(log_ratio)  # (B, T), detached
    weight = torch.clamp(ratio, min=ratio_min, max=ratio_max)
    clipped = ratio > ratio_max if ratio_min is None else (ratio > ratio_max) | (ratio < ratio_min)
    loss = log_prob * (-weight * compact_advantages(advantages))
    metrics = token_weight_metrics(weight, advantages, mask)
    metrics["clip/frac"] = masked_mean(clipped, mask)
    return loss, metrics
