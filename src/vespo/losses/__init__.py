"""Policy losses: VESPO and its baselines behind one registry and one signature.

`registry` (register, look up, validate hyperparameters), `core` (log ratios, sequence log W, weight metrics: the
public helpers every method uses), `correction` (train-inference correction, veRL's catalogue), `compute` (the entry
points), `methods` (the paper's methods), `offpolicy` (the off-policy corrections of 2025-26) and `adaptive`
(batch-adaptive VESPO). Importing this package registers every method.
"""

from vespo.losses import adaptive, methods, offpolicy  # noqa: F401  (registers the methods)
from vespo.losses.adaptive import BatchContext, batch_context
from vespo.losses.compute import check_policy_inputs, compute_policy_loss, policy_loss_terms
from vespo.losses.core import ROLLOUT_IS_THRESHOLD, PolicyBatch, kl_k3
from vespo.losses.correction import (
    CORRECTION_OPTIONS,
    ROLLOUT_CORRECTION_PRESETS,
    RolloutCorrection,
    parse_rollout_correction,
    rollout_correction_preset,
)
from vespo.losses.registry import (
    available_methods,
    default_loss_agg_mode,
    method_hparams,
    parse_hparam,
    register_method,
    rollout_correction,
    uses_batch_context,
    uses_rollout_log_prob,
    validate_hparams,
)

__all__ = [
    "CORRECTION_OPTIONS",
    "ROLLOUT_CORRECTION_PRESETS",
    "PolicyBatch",
    "ROLLOUT_IS_THRESHOLD",
    "RolloutCorrection",
    "BatchContext",
    "available_methods",
    "batch_context",
    "check_policy_inputs",
    "compute_policy_loss",
    "default_loss_agg_mode",
    "kl_k3",
    "method_hparams",
    "parse_hparam",
    "parse_rollout_correction",
    "policy_loss_terms",
    "register_method",
    "rollout_correction_preset",
    "rollout_correction",
    "uses_batch_context",
    "uses_rollout_log_prob",
    "validate_hparams",
]
