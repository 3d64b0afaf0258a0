"""The gradient probe on one mini-batch: the trained method's policy-loss gradient against GRPO's and REINFORCE's under
the same weights, and against itself on the mini-batch's two halves (`probe/cos_split_half`, its noise ceiling, issue
53). `vespo.diagnostics.gradient_probe` does the arithmetic; this module chooses the losses and the micro-batches.
Off the hot path: the learner runs it on the stalest mini-batch, at the caller's stride."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vespo import diagnostics
from vespo.losses import BatchContext, compute_policy_loss, default_loss_agg_mode, validate_hparams

Tensor = torch.Tensor
LossSpec = tuple[str, dict, str, BatchContext | None]
"""One policy loss: (registered method, hparams, aggregation, batch context or None)."""


def probe_losses(trained: LossSpec) -> dict[str, LossSpec]:
    """The probe's losses by name: the trained method's (`diagnostics.PROBE_METHOD`) and each of
    `diagnostics.PROBE_REFERENCES` at its own defaults and aggregation, except a reference whose loss is the trained
    method's (same method, resolved hparams and aggregation): it shares that gradient."""
    method, hparams, mode, _ = trained
    key = (method, validate_hparams(method, **hparams), mode)
    specs = {diagnostics.PROBE_METHOD: trained}
    for name, (ref, ref_hparams) in diagnostics.PROBE_REFERENCES.items():
        ref_mode = default_loss_agg_mode(ref)
        if (ref, validate_hparams(ref, **ref_hparams), ref_mode) != key:
            specs[name] = (ref, ref_hparams, ref_mode, None)
    return specs


def split_halves(rows: Tensor, group_size: int) -> tuple[Tensor, ...]:
    """The mini-batch's rows as two halves of whole prompt groups (half the rows each when there is one group), or
    the rows alone when they cannot be cut."""
    groups = rows.numel() // group_size
    cut = (groups // 2) * group_size if groups >= 2 else rows.numel() // 2
    return (rows[:cut], rows[cut:]) if 0 < cut < rows.numel() else (rows,)


def gradient_probe(
    params: list[Tensor],
    rows: Tensor,
    loss_inputs: Callable[[Tensor], dict],
    *,
    trained: LossSpec,
    group_size: int,
    micro_batch_size: int,
) -> dict[str, Tensor]:
    """`diagnostics.gradient_probe` on mini-batch `rows`: the trained method's policy loss (no KL or entropy term) and
    each reference's, from one forward per micro-batch (`loss_inputs(micro_rows)`: the policy loss's tensor inputs and
    the mini-batch's token/sequence counts, log pi with autograd). The micro-batches run over the two halves in turn,
    so the split-half cosine costs no extra forward."""
    specs = probe_losses(trained)
    halves = split_halves(rows, group_size)
    parts = [(h, mb) for h, half in enumerate(halves) for mb in half.split(micro_batch_size)]

    def losses():
        for _, mb in parts:
            inputs = loss_inputs(mb)
            yield {
                name: compute_policy_loss(method, **inputs, loss_agg_mode=mode, validate=False,
                                          **({} if c is None else {"batch_context": c}), **hparams)[0]
                for name, (method, hparams, mode, c) in specs.items()
            }  # fmt: skip

    return diagnostics.gradient_probe(params, losses(), halves=[h for h, _ in parts] if len(halves) == 2 else None)
