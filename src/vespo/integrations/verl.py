"""Every vespo policy loss inside veRL (https://github.com/volcengine/verl), without forking it.

Importing this module registers each method into veRL's policy-loss registry, `vespo` under "vespo" and the others
under "vespo_<method>" (e.g. "vespo_gspo"), so they never shadow veRL's built-ins. veRL >= 0.9 imports it in every
process that imports `verl` through the `verl.plugins` entry point that vespo's package declares; on veRL 0.7/0.8 set
`VERL_USE_EXTERNAL_MODULES=vespo.integrations.verl` in the Ray runtime env instead.

Hyperparameters come from Hydra through `VespoPolicyLossConfig` (docs/guides/verl.md has the override lines).
The loss is aggregated by veRL's own `agg_loss` with `config.global_batch_info`, so micro-batches and data-parallel
ranks are normalised by the whole mini-batch, as veRL's built-in losses are. The batch-adaptive methods
(`vespo.losses.adaptive`) need the whole mini-batch's log W, which a veRL `PolicyLossFn` does not receive: they run only
where one call sees the whole mini-batch (checked per call), or per micro-batch on explicit opt-in; `vespo_schedule`
(it needs the mini-batch index) is refused (docs/methods/adaptive.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vespo.integrations import engine_names
from vespo.losses import (
    CORRECTION_OPTIONS,
    PolicyBatch,
    available_methods,
    method_hparams,
    policy_loss_terms,
    uses_batch_context,
    validate_hparams,
)

Tensor = torch.Tensor
# the engine, imported when this module is (the core install has no veRL)
_ENGINE = (__name__, "veRL", "bash .ci/install_verl.sh")
POLICY_LOSS_REGISTRY, agg_loss, register_policy_loss = engine_names(
    *_ENGINE, "verl.trainer.ppo.core_algos", "POLICY_LOSS_REGISTRY", "agg_loss", "register_policy_loss"
)
(PolicyLossConfig,) = engine_names(*_ENGINE, "verl.workers.config", "PolicyLossConfig")

_BYPASS_MESSAGE = (
    "vespo losses do not support veRL's rollout_correction.bypass_mode: bypass mode replaces the configured "
    "policy loss by veRL's 'bypass_mode' loss (and uses the rollout log-probs as old log-probs), so the vespo loss "
    "would silently not run. Set algorithm.rollout_correction.bypass_mode=False (decoupled mode); vespo then "
    "receives rollout_is_weights and, for 'vespo', folds them into W."
)


def verl_loss_name(method: str) -> str:
    """veRL registry name of a vespo method: "vespo" for VESPO itself, "vespo_<method>" for the baselines."""
    return "vespo" if method == "vespo" else f"vespo_{method}"


def vespo_method(loss_mode: str) -> str | None:
    """The vespo method behind a veRL `loss_mode`, or None if the name is not one of vespo's."""
    names = {verl_loss_name(m): m for m in available_methods()}
    return names.get(loss_mode)


@dataclass
class VespoPolicyLossConfig(PolicyLossConfig):
    """`actor.policy_loss` config that carries a vespo method's hyperparameters through veRL's strict configs.

    Select it with `actor_rollout_ref.actor.policy_loss._target_=vespo.integrations.verl.VespoPolicyLossConfig`.
    Fields (new keys need Hydra's `+` prefix):
        hparams (`dict`): keyword hyperparameters of the method (`vespo.method_hparams(method)`), e.g.
            `+actor_rollout_ref.actor.policy_loss.hparams.c1_pos=2.0`. Unset ones keep vespo's paper defaults;
            veRL's `actor.clip_ratio*` / `actor.tau_*` are not read.
        rollout_is (`str`, *optional*): level of veRL's `rollout_is_weights`, "token" or "sequence"; needed by
            `vespo` when `algorithm.rollout_correction.rollout_is` is set. Wire it with
            `+actor_rollout_ref.actor.policy_loss.rollout_is=${algorithm.rollout_correction.rollout_is}`.
        bypass_mode (`bool`): mirror of `algorithm.rollout_correction.bypass_mode` so that bypass mode is refused
            when the config is built; wire it with
            `+actor_rollout_ref.actor.policy_loss.bypass_mode=${algorithm.rollout_correction.bypass_mode}`.
        adaptive_per_micro_batch (`bool`): opt-in for the batch-adaptive methods (`vespo_moment`, `vespo_ess`,
            `vespo_selfnorm`) to decide per micro-batch and rank when a call does not see the whole mini-batch
            (inexact: gradient accumulation then changes the update). Off: such a call raises.
    Validation runs when the config is built (driver and workers), so bad values fail before training starts.
    """

    loss_mode: str = "vespo"
    hparams: dict = field(default_factory=dict)
    rollout_is: Optional[str] = None  # noqa: UP045 (OmegaConf/Hydra parse typing.Optional on Python 3.10)
    bypass_mode: bool = False
    adaptive_per_micro_batch: bool = False

    def __post_init__(self) -> None:
        _validate(self)


def _validate(policy_loss: Mapping | PolicyLossConfig) -> None:
    """Check a policy-loss config for a vespo method: bypass mode, IS level and hyperparameters."""
    correction = policy_loss.get("rollout_correction") or {}
    if (
        policy_loss.get("loss_mode") == "bypass_mode"
        or policy_loss.get("bypass_mode", False)
        or correction.get("bypass_mode", False)
    ):
        raise ValueError(_BYPASS_MESSAGE)
    level = policy_loss.get("rollout_is")
    if level not in (None, "token", "sequence"):
        raise ValueError(f"policy_loss.rollout_is must be one of ('token', 'sequence') or null, got {level!r}")
    method = vespo_method(policy_loss.get("loss_mode", ""))
    hparams = dict(policy_loss.get("hparams") or {})
    if method is None:
        if hparams:
            raise ValueError(
                f"policy_loss.hparams is set but loss_mode {policy_loss.get('loss_mode')!r} is not a vespo loss; "
                f"vespo's are {sorted(verl_loss_name(m) for m in available_methods())}"
            )
        return
    for name in CORRECTION_OPTIONS:
        if name in hparams:
            raise ValueError(
                f"policy_loss.hparams.{name} has no effect in veRL, which computes the rollout correction itself "
                f"(vespo uses its rollout_is_weights and rejection mask): set algorithm.rollout_correction.{name}"
            )
    if method == "vespo_schedule":
        raise ValueError(
            "loss_mode vespo_vespo_schedule is not available in veRL: its PolicyLossFn receives no mini-batch index "
            "(config.global_batch_info has only dp_size, batch_num_tokens, global_batch_size, loss_scale_factor); "
            "use vespo train or VespoGRPOTrainer (docs/methods/adaptive.md)"
        )
    validate_hparams(method, **hparams)  # the core's one check of names, types and values


def _policy_loss_settings(config: Any) -> tuple[dict[str, object], str | None, dict[str, Any], bool]:
    """(hyperparameters, rollout IS level, global batch info, adaptive opt-in) from veRL's actor config; defaults if
    it has none."""
    if config is None:
        return {}, None, {}, False
    policy_loss = config.get("policy_loss") or {}
    _validate(policy_loss)
    return (
        dict(policy_loss.get("hparams") or {}),
        policy_loss.get("rollout_is"),
        dict(config.get("global_batch_info") or {}),
        bool(policy_loss.get("adaptive_per_micro_batch", False)),
    )


def _check_whole_mini_batch(method: str, rows: int, batch_info: dict[str, Any]) -> None:
    """A batch-adaptive method must see the whole mini-batch in one call (veRL hands a PolicyLossFn one micro-batch
    of one rank and no mini-batch statistics); host ints only, no sync. Raises before any compute otherwise. No
    global batch info at all (a direct call, outside veRL's workers) means the call is the batch."""
    dp, total = batch_info.get("dp_size") or 1, batch_info.get("global_batch_size")
    if all(v is None for v in batch_info.values()) or (dp == 1 and total == rows):
        return
    seen = f"{rows} of its {'?' if total is None else total} sequences (dp_size={dp})"
    raise ValueError(
        f"loss_mode {verl_loss_name(method)} decides from the whole mini-batch, but this call sees {seen} and "
        "veRL passes no mini-batch statistics to a policy loss; exact only "
        "with one micro-batch per mini-batch on one data-parallel rank: actor_rollout_ref.actor."
        "ppo_micro_batch_size_per_gpu >= ppo_mini_batch_size * rollout.n (with use_dynamic_bsz, "
        "ppo_max_token_len_per_gpu holding the whole mini-batch) and trainer.nnodes * trainer.n_gpus_per_node = 1; "
        "or decide per micro-batch (inexact) with +actor_rollout_ref.actor.policy_loss.adaptive_per_micro_batch=True"
    )


def make_policy_loss_fn(method: str) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    """A function with veRL's `PolicyLossFn` signature computing vespo's `method`.

    It reads the hyperparameters from `config.policy_loss.hparams`, hands `rollout_is_weights` to the core (folded
    into W for "vespo", multiplied into the per-token loss otherwise), aggregates with veRL's
    `agg_loss(..., **config.global_batch_info)` and returns veRL's metric names ("actor/pg_clipfrac",
    "actor/ppo_kl", "actor/pg_clipfrac_lower") plus vespo's own metrics under "actor/<name>", as floats converted
    with one host sync (veRL's metric convention).
    """
    method_hparams(method)  # unknown method -> ValueError now, not at the first training step
    adaptive = uses_batch_context(method)

    def policy_loss_fn(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        hparams, level, batch_info, per_micro_batch = _policy_loss_settings(config)
        if adaptive and not per_micro_batch:
            _check_whole_mini_batch(method, log_prob.shape[0], batch_info)
        batch = PolicyBatch(
            log_prob,
            old_log_prob,
            advantages,
            response_mask,
            rollout_is_weights=rollout_is_weights,
            rollout_is_level=level,
        )
        loss_mat, metrics = policy_loss_terms(
            method,
            batch,
            allow_empty_rows=True,  # veRL pads micro-batches and rejects sequences by masking them
            validate=False,  # model log-probs; no host sync per micro-batch
            **hparams,
        )
        pg_loss = agg_loss(
            loss_mat=loss_mat, loss_mask=response_mask.to(loss_mat.dtype), loss_agg_mode=loss_agg_mode, **batch_info
        )
        zero = torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)
        out = {
            "actor/pg_clipfrac": metrics.pop("clip/frac", zero),
            "actor/pg_clipfrac_lower": metrics.pop("clip/frac_lower", zero),
            "actor/ppo_kl": metrics["is/approx_kl"],  # k1 estimate of KL(mu || pi), veRL's definition
        }
        out.update({f"actor/{k}": v for k, v in metrics.items()})
        values = torch.stack([v.detach().to(torch.float64).reshape(()) for v in out.values()]).tolist()  # one sync
        return pg_loss, dict(zip(out, values, strict=True))

    policy_loss_fn.__name__ = f"compute_policy_loss_{verl_loss_name(method)}"
    policy_loss_fn.__qualname__ = policy_loss_fn.__name__
    policy_loss_fn.__doc__ = f"veRL PolicyLossFn for vespo's {method!r} (see `vespo.integrations.verl`)."
    policy_loss_fn.vespo_method = method  # marks the function as vespo's for re-registration checks
    return policy_loss_fn


def register_all() -> list[str]:
    """Register every vespo method in veRL's policy-loss registry; returns the registered names.

    Re-registering vespo's own functions is a no-op refresh; a name held by someone else's loss raises, since veRL's
    registry would otherwise overwrite it silently.
    """
    names = []
    for method in available_methods():
        name = verl_loss_name(method)
        existing = POLICY_LOSS_REGISTRY.get(name)
        if existing is not None and getattr(existing, "vespo_method", None) != method:
            raise ValueError(f"veRL policy loss {name!r} is already registered by {existing.__module__}")
        register_policy_loss(name)(make_policy_loss_fn(method))
        names.append(name)
    return names


REGISTERED = register_all()

__all__ = [
    "REGISTERED",
    "VespoPolicyLossConfig",
    "make_policy_loss_fn",
    "register_all",
    "verl_loss_name",
    "vespo_method",
]
