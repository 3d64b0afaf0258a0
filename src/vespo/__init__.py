"""vespo: off-policy RL for LLMs with VESPO's sequence-level soft importance-weight kernel.

Public API: `compute_policy_loss`, `policy_loss_terms` (of a `PolicyBatch`), `available_methods`, `register_method`,
`method_hparams`, `validate_hparams`, `check_policy_inputs`, `agg_loss`, and the `kernels` module (phi, K, phi_max,
surrogate, ESS). Loaded on first use (PEP 562), so `import vespo` and the `vespo` command start without torch; the
first use imports `vespo.losses`, which registers every method (the batch-adaptive VESPO variants included).
"""

import importlib

__version__ = "0.2.0"

_LAZY = {
    "kernels": "vespo.kernels",
    "agg_loss": "vespo.aggregation",
    **{
        name: "vespo.losses"
        for name in (
            "PolicyBatch",
            "available_methods",
            "check_policy_inputs",
            "compute_policy_loss",
            "method_hparams",
            "policy_loss_terms",
            "register_method",
            "validate_hparams",
        )
    },
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'vespo' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    value = module if name == "kernels" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
