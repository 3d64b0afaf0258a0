"""vespo: off-policy RL for LLMs with VESPO's sequence-level soft importance-weight kernel.

Public API: `compute_policy_loss`, `policy_loss_terms` (of a `PolicyBatch`), `available_methods`, `register_method`,
`method_hparams`, `validate_hparams`, `check_policy_inputs`, and the `kernels` module (phi, K, phi_max, surrogate,
ESS). Importing vespo registers every method, the batch-adaptive VESPO variants of `vespo.losses.adaptive` included.
"""

from vespo import kernels
from vespo.aggregation import agg_loss
from vespo.losses import (
    PolicyBatch,
    available_methods,
    check_policy_inputs,
    compute_policy_loss,
    method_hparams,
    policy_loss_terms,
    register_method,
    validate_hparams,
)

__version__ = "0.1.0"

__all__ = [
    "PolicyBatch",
    "agg_loss",
    "available_methods",
    "check_policy_inputs",
    "compute_policy_loss",
    "kernels",
    "method_hparams",
    "policy_loss_terms",
    "register_method",
    "validate_hparams",
]
