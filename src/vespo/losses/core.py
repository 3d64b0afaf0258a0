"""The shared pieces of every policy loss: log ratios and sequence log W with one guard convention, the
train-inference correction, PPO's clipped surrogate (the token-clipping methods) and the weight diagnostics. Pure
tensor functions, no registry, no I/O.

Guards shared with veRL, the official VESPO code and TRL (docs/methods/index.md): per-token log(pi/mu) clamped to
[-20, 20] before any exp or sum; VESPO's sequence log W clamped to [log 1e-8, 20].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from vespo.aggregation import masked_mean
from vespo.kernels import effective_sample_size

Tensor = torch.Tensor

ROLLOUT_IS_THRESHOLD = 2.0  # C in min(mu/pi_rollout, C): veRL's rollout_is_threshold default (official VESPO code)
LOG_PROB_MAX = 1e-3  # validation: log-probs above this are an error (numerical slack of log_softmax in bf16/fp16)
TOKEN_LOG_RATIO_CLAMP = 20.0  # per-token log(pi/mu) clamped to [-20, 20] before any exp or sum (veRL, VESPO, TRL)
LOG_W_MIN = math.log(1e-8)  # VESPO: sequence log W and per-token rollout log-weights floored at log 1e-8 (VESPO, TRL)
LOG_W_MAX = 20.0  # VESPO: sequence log W capped at 20 (W <= 4.9e8, where phi is exactly 0 in float32)
W_LARGE = math.log(100.0)  # diagnostics: sequences with W > 100 and A < 0 are the ones the paper worries about


@dataclass(frozen=True)
class PolicyBatch:
    """One batch of a policy loss's inputs, structure checked on construction (types, dtypes, shapes; no data is
    read, no host sync): `log_prob`, `old_log_prob`, `response_mask` (B, T), `advantages` (B,), (B, 1) or (B, T),
    and at most one train-inference correction input, the sampler's `rollout_log_prob` (B, T) or an engine's ready
    `rollout_is_weights` (B, T) or (B, 1) at `rollout_is_level` ("token" / "sequence"; (B, 1) means "sequence")."""

    log_prob: Tensor
    old_log_prob: Tensor
    advantages: Tensor
    response_mask: Tensor
    rollout_log_prob: Tensor | None = None
    rollout_is_weights: Tensor | None = None
    rollout_is_level: Literal["token", "sequence"] | None = None

    def __post_init__(self) -> None:
        _check_structure(self)
        if self.rollout_log_prob is not None and self.rollout_is_weights is not None:
            raise ValueError("pass rollout_log_prob or rollout_is_weights, not both")
        level = self.rollout_is_level
        if level not in (None, "token", "sequence"):
            raise ValueError(f"rollout_is_level must be 'token', 'sequence' or None, got {level!r}")
        weights = self.rollout_is_weights
        if weights is not None and weights.shape[-1] == 1 and self.log_prob.shape[-1] > 1:
            if level == "token":
                raise ValueError("rollout_is_weights of shape (B, 1) are per sequence, but rollout_is_level is 'token'")
            object.__setattr__(self, "rollout_is_level", "sequence")

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: float64 stays, the rest computes in float32."""
        return torch.float64 if self.log_prob.dtype == torch.float64 else torch.float32

    def cast(self) -> PolicyBatch:
        """The batch in the compute dtype, the mask as float 0/1, every input but `log_prob` detached."""
        dt = self.dtype

        def fixed(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().to(dt)

        return PolicyBatch(
            self.log_prob.to(dt), fixed(self.old_log_prob), fixed(self.advantages), self.response_mask.to(dt),
            fixed(self.rollout_log_prob), fixed(self.rollout_is_weights), self.rollout_is_level,
        )  # fmt: skip

    def token_advantages(self) -> Tensor:
        """Advantages as (B, T): one per sequence becomes a stride-0 row view (no copy), what the methods take."""
        adv = self.advantages
        return adv.reshape(-1, 1).expand(self.log_prob.shape) if adv.dim() == 1 or adv.shape[-1] == 1 else adv


@dataclass(frozen=True)
class BatchContext:
    """Statistics of the whole mini-batch that a micro-batch call decides with (built by
    `vespo.losses.adaptive.batch_context`).

    `log_w` (M,) sequence log W of every sequence of the mini-batch (rollout fold included, as the method computes
    it), `advantages` (M,) their sequence advantages, `valid` (M,) which have at least one valid token;
    `mini_batch_index` k in 0..N-1 and `num_mini_batches` N (mini-batches per rollout step) for `vespo_schedule`;
    `m2` the mini-batch's per-token M2 of M2PO's trust-region tokens, -1 for every other token, any shape (`m2po`).
    """

    log_w: Tensor | None = None
    advantages: Tensor | None = None
    valid: Tensor | None = None
    mini_batch_index: int | None = None
    num_mini_batches: int | None = None
    m2: Tensor | None = None

    def check(self, device: torch.device) -> None:
        """Its tensors are on `device` (the loss inputs'); one line naming the field otherwise (no data is read)."""
        for name in ("log_w", "advantages", "valid", "m2"):
            t = getattr(self, name)
            if t is not None and not isinstance(t, Tensor):
                raise ValueError(f"batch_context.{name} must be a torch.Tensor or None, got {type(t).__name__}")
            if t is not None and t.device != device:
                raise ValueError(f"batch_context.{name} is on {t.device} but log_prob is on {device}")


def _check_structure(batch: PolicyBatch) -> None:
    """Types, dtypes and shapes of a `PolicyBatch` (no data is read): one line naming the input that is off."""
    named = vars(batch)
    for name, t in named.items():
        if name == "rollout_is_level" or (t is None and name.startswith("rollout")):
            continue
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if name != "response_mask" and not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.device != batch.log_prob.device:
            raise ValueError(f"{name} is on {t.device} but log_prob is on {batch.log_prob.device}: use one device")
    mask, log_prob, weights = batch.response_mask, batch.log_prob, batch.rollout_is_weights
    if mask.is_floating_point() is False and mask.dtype not in (
        torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64
    ):  # fmt: skip
        raise ValueError(f"response_mask must be bool, integer or floating point, got {mask.dtype}")
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be a (B, T) tensor, got shape {tuple(log_prob.shape)}")
    shape = tuple(log_prob.shape)
    if 0 in shape:
        raise ValueError(f"log_prob is empty: shape {shape}")
    for name in ("old_log_prob", "response_mask", "rollout_log_prob"):
        t = named[name]
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but log_prob has shape {shape}")
    if tuple(batch.advantages.shape) not in (shape[:1], (shape[0], 1), shape):
        raise ValueError(f"advantages must have shape {shape[:1]} or {shape}, got {tuple(batch.advantages.shape)}")
    if weights is not None and tuple(weights.shape) not in ((shape[0], 1), shape):
        raise ValueError(f"rollout_is_weights must have shape {shape} or {(shape[0], 1)}, got {tuple(weights.shape)}")


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


def trust_region_m2(log_ratio: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """M2PO's per-token second moment M2 = (log r)^2 of its trust-region tokens, -1 elsewhere, (B, T).

    Trust-region tokens are the valid ones whose ratio moved the way the advantage rewards, where PPO's clip would
    bind: A > 0 with r > 1, or A < 0 with r < 1 (M2PO Algorithm 1's set T; the official code's
    `_get_trust_region_tokens_delta_sq`). `advantages` (B, T) or (B, 1); `log_ratio` detached, clamped to +-20."""
    up = (advantages > 0) & (log_ratio > 0)
    down = (advantages < 0) & (log_ratio < 0)
    return torch.where((up | down) & (mask > 0), log_ratio.square(), -1.0)


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


def ppo_clip_loss(
    ratio: Tensor, advantages: Tensor, low: Tensor | float, high: Tensor | float, clip_ratio_c: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO clipped surrogate with optional dual clip (Ye et al. 2020), written like veRL's `vanilla` loss.

    Returns (loss (B, T), active: where the gradient flows through the ratio, clipped, dual-clipped) masks.
    `low` / `high` are the ratio bounds themselves (1 - eps_low, 1 + eps_high); `advantages` (B, T) or (B, 1).
    """
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, low, high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    if clip_ratio_c is None:
        return loss, ~clipped, clipped, torch.zeros_like(clipped)
    loss_dual = -advantages * clip_ratio_c
    dual = (advantages < 0) & (loss > loss_dual)
    loss = torch.where(dual, loss_dual, loss)
    return loss, ~(clipped | dual), clipped, dual


def token_clip_metrics(
    ratio: Tensor, active: Tensor, clipped: Tensor, dual: Tensor, advantages: Tensor, mask: Tensor
) -> dict[str, Tensor]:
    """Weight and clip metrics of a clipped token-level loss: the weight is r where the gradient flows, else 0."""
    metrics = token_weight_metrics(ratio.detach() * active, advantages, mask)
    metrics["clip/frac"] = masked_mean(clipped, mask)
    metrics["clip/frac_lower"] = masked_mean(dual, mask)
    return metrics


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
