"""Glue shared by the veRL and TRL adapters: turn an engine's precomputed rollout IS weight into vespo's inputs.

Both engines hand the loss a detached, already truncated (or masked) weight w = min(mu / pi_rollout, C) for the
train-inference mismatch, per token (B, T) or per sequence ((B, T) constant along the row in veRL, (B, 1) in TRL).
vespo's sequence kernel folds that weight into W (W = pi/mu * w = pi/pi_rollout, as the official VESPO code and TRL's
`loss_type="vespo"` do); every other method multiplies its per-token loss by w, exactly as the engines' built-in
losses do, so the engine's threshold, IcePop masking or batch normalisation is kept as is.
"""

from __future__ import annotations

import math

import torch

from vespo.losses import policy_loss_terms

Tensor = torch.Tensor

IS_LEVELS = ("token", "sequence")
# Methods whose importance weight is the sequence product W and which therefore absorb w into W.
FOLDS_IS_INTO_W = frozenset({"vespo"})
# A zero weight (IcePop-masked token or sequence) is floored at 1e-8 before the log, so W becomes ~1e-8 * W and
# phi(W) ~ 0: the sequence is dropped, as in the official code and TRL (both clamp at log 1e-8).
_LOG_MIN_WEIGHT = math.log(1e-8)


def rollout_log_prob_from_is_weights(old_log_prob: Tensor, is_weights: Tensor, mask: Tensor, level: str) -> Tensor:
    """The rollout log-prob whose ratio mu/pi_rollout reproduces the engine's weight `is_weights` under vespo.

    level="token": log pi_rollout_t = log mu_t - log w_t for every token. level="sequence": the row's log w is put
    on its first valid token (zero elsewhere), so the sum over the row, which is what W sees, is log w once, not
    T * log w (summing a broadcast sequence weight over tokens would raise it to the power T).
    Shapes: `old_log_prob`, `mask` (B, T); `is_weights` (B, T), or (B, 1) for level="sequence". Detached.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"rollout IS level must be one of {IS_LEVELS}, got {level!r}")
    mask_b = mask.bool()
    w = is_weights.detach().to(old_log_prob.dtype)
    if level == "token":
        if w.shape != old_log_prob.shape:
            raise ValueError(
                f"token-level IS weights must have shape {tuple(old_log_prob.shape)}, got {tuple(w.shape)}"
            )
        log_r = torch.log(w.clamp(min=0.0)).clamp(min=_LOG_MIN_WEIGHT)  # (B, T)
    else:
        first = mask_b.float().argmax(-1, keepdim=True)  # (B, 1) index of the first valid token
        if w.shape == old_log_prob.shape:
            w_seq = w.gather(1, first)  # (B, 1)
            spread = torch.where(mask_b, (w - w_seq).abs(), torch.zeros_like(w)).amax()
            if bool(spread > 1e-6 * w_seq.abs().amax().clamp(min=1.0)):
                raise ValueError(
                    "rollout IS level is 'sequence' but the weights vary along a sequence: they are token-level "
                    "weights, set the level to 'token'"
                )
        elif w.shape == (old_log_prob.shape[0], 1):
            w_seq = w
        else:
            raise ValueError(f"sequence-level IS weights must have shape (B, 1) or (B, T), got {tuple(w.shape)}")
        log_w = torch.log(w_seq.clamp(min=0.0)).clamp(min=_LOG_MIN_WEIGHT)  # (B, 1)
        log_r = torch.zeros_like(old_log_prob).scatter(1, first, log_w)  # (B, T), log w on the first valid token
    return old_log_prob.detach() - torch.where(mask_b, log_r, torch.zeros_like(log_r))


def engine_policy_loss_terms(
    method: str,
    *,
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    is_weights: Tensor | None,
    is_level: str | None,
    hparams: dict[str, object],
) -> tuple[Tensor, dict[str, Tensor]]:
    """`vespo.losses.policy_loss_terms` for an engine that supplies a rollout IS weight instead of rollout log-probs.

    Rows without valid tokens are allowed (engines pad micro-batches and reject sequences by masking them).
    `is_level` ("token" / "sequence") is only needed when `method` folds the weight into W.
    """
    rollout_log_prob = None
    if is_weights is not None and method in FOLDS_IS_INTO_W:
        if is_level is None:
            raise ValueError(
                f"{method!r} folds the rollout IS weight into its sequence weight W and must know whether the "
                "engine's weights are per 'token' or per 'sequence'; none was configured"
            )
        rollout_log_prob = rollout_log_prob_from_is_weights(old_log_prob, is_weights, response_mask, is_level)
    loss_mat, metrics = policy_loss_terms(
        method,
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_log_prob=rollout_log_prob,
        allow_empty_rows=True,
        **hparams,
    )
    if is_weights is not None and method not in FOLDS_IS_INTO_W:
        loss_mat = loss_mat * is_weights.detach().to(loss_mat.dtype)  # (B, T) or (B, 1) broadcast
    return loss_mat, metrics
