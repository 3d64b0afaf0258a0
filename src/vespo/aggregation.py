"""Reduce a per-token loss matrix to a scalar, with veRL's `loss_agg_mode` meanings.

The only place losses are normalised. `global_num_tokens` / `global_num_seqs` replace the local counts so that a
mini-batch split into micro-batches (gradient accumulation) sums to exactly the loss of the whole mini-batch.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_num_tokens: float | torch.Tensor | None = None,
    global_num_seqs: float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate `loss_mat` (B, T) over the valid tokens of `mask` (B, T).

    - token-mean: sum of token losses / number of valid tokens (DAPO's token-level loss).
    - seq-mean-token-mean: mean over sequences of each sequence's token mean (GRPO/GSPO papers).
    - seq-mean-token-sum: mean over sequences of each sequence's token sum.
    - seq-mean-token-sum-norm: token sum / `loss_scale_factor` (default T = mask.shape[-1]), mean over sequences
      (Dr. GRPO's constant normaliser).
    Sequences with no valid token are not counted. With the global counts, the denominators are those of the whole
    mini-batch instead of this micro-batch.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; choose one of {list(LOSS_AGG_MODES)}")
    mask = mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        denom = mask.sum() if global_num_tokens is None else global_num_tokens
        total = torch.dot(loss_mat.reshape(-1), mask.reshape(-1))  # masked sum in one pass
        return total / torch.clamp(torch.as_tensor(denom, dtype=loss_mat.dtype), min=1.0)

    token_sums = torch.linalg.vecdot(loss_mat, mask)  # (B,) masked row sums
    lengths = mask.sum(dim=-1)  # (B,)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = token_sums / lengths.clamp(min=1.0)
    elif loss_agg_mode == "seq-mean-token-sum":
        seq_losses = token_sums
    else:  # seq-mean-token-sum-norm
        seq_losses = token_sums / float(loss_scale_factor if loss_scale_factor is not None else mask.shape[-1])
    denom = (lengths > 0).sum() if global_num_seqs is None else global_num_seqs
    return seq_losses.sum() / torch.clamp(torch.as_tensor(denom, dtype=loss_mat.dtype), min=1.0)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over the valid entries of `mask` (0 when there are none); bool `x` gives a fraction."""
    mask = mask.to(torch.promote_types(mask.dtype, torch.float32)) if not mask.is_floating_point() else mask
    return (x * mask).sum() / mask.sum().clamp(min=1.0)
