"""Policy losses: VESPO and the baselines it is compared with, behind one registry and one signature.

Every method is a pure function

    fn(log_prob, old_log_prob, advantages, mask, *, rollout_log_prob=None, **hparams) -> (loss_mat, metrics)

of already-validated float tensors of shape (B, T) (advantages broadcast to (B, T), mask in {0, 1}), returning the
per-token loss matrix and a dict of 0-dim detached metric tensors. Normalisation lives in `vespo.aggregation`.
Hyperparameters are checked once, by `validate_hparams`, before the function runs (never inside it).
Gradients flow into `log_prob` only. The public entry points are `compute_policy_loss` (scalar + float metrics) and
`policy_loss_terms` (loss matrix, for engines that aggregate themselves).

Notation: pi = current policy (log_prob), mu = behaviour policy the weights are taken against (old_log_prob),
pi_rollout = the inference engine that sampled (rollout_log_prob, train-inference mismatch).
Every method reduces to REINFORCE, -A * log pi, when log_prob == old_log_prob and no rollout_log_prob is given.
"""

from __future__ import annotations

import collections.abc
import inspect
import math
import numbers
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from vespo.aggregation import LOSS_AGG_MODES, agg_loss
from vespo.kernels import effective_sample_size, variance_bound_K, vespo_log_phi

Tensor = torch.Tensor
LossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]

# Guards shared with veRL, the official VESPO code and TRL (documented in docs/losses.md):
_TOKEN_LOG_RATIO_CLAMP = 20.0  # per-token log(pi/mu) clamped to [-20, 20] before any exp or sum (veRL, VESPO, TRL)
_LOG_W_MIN = math.log(1e-8)  # VESPO: sequence log W and per-token log(mu/pi_rollout) floored at log 1e-8 (VESPO, TRL)
_LOG_W_MAX = 20.0  # VESPO: sequence log W capped at 20 (W <= 4.9e8, where phi is exactly 0 in float32)
_GSPO_LOG_RATIO_MAX = 10.0  # GSPO: token-level log s_i,t capped at 10 (veRL)
_W_LARGE = math.log(100.0)  # diagnostics: sequences with W > 100 and A < 0 are the ones the paper worries about


@dataclass(frozen=True)
class _Method:
    fn: LossFn
    default_loss_agg_mode: str
    hparams: dict[str, object]  # name -> default
    kinds: dict[str, object]  # name -> type annotation (float, int, str, bool, Literal[...], float | None, tuple)
    bounds: dict[str, _Interval]
    check: Callable[[dict[str, object]], str | None] | None


@dataclass(frozen=True)
class _Interval:
    """A real interval written as in maths, e.g. "(0, inf)" or "[0, 1)"; `reason` cites where it comes from."""

    text: str
    reason: str = ""

    def __post_init__(self) -> None:
        match = re.fullmatch(r"([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])", self.text.strip())
        if match is None:
            raise ValueError(f"interval must look like '(0, inf)' or '[0, 1)', got {self.text!r}")
        object.__setattr__(self, "_parsed", (match[1] == "[", float(match[2]), float(match[3]), match[4] == "]"))

    def contains(self, x: float) -> bool:
        lo_closed, lo, hi, hi_closed = self._parsed
        return (x > lo or (lo_closed and x == lo)) and (x < hi or (hi_closed and x == hi))


_REGISTRY: dict[str, _Method] = {}
# Keyword arguments of a loss function that are inputs, not hyperparameters.
_INPUT_KWARGS = frozenset({"rollout_log_prob"})


def register_method(
    name: str,
    *,
    default_loss_agg_mode: str = "token-mean",
    bounds: dict[str, str | tuple[str, str]] | None = None,
    check: Callable[[dict[str, object]], str | None] | None = None,
) -> Callable[[LossFn], LossFn]:
    """Register a policy-loss function under `name`; registering a name twice raises (no silent overwrite).

    The function's keyword-only arguments are its hyperparameters: their defaults are the paper's, their annotations
    (float, int, str, bool, `Literal[...]`, `float | None`, `tuple[float, float]`) the accepted types. `bounds` maps a
    hyperparameter to its allowed interval, "(0, inf)" or ("[0, 1)", "why"); `check(hparams)` returns a message for
    constraints between hyperparameters (or None). `validate_hparams` applies all of them.
    """
    if default_loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown default_loss_agg_mode {default_loss_agg_mode!r}")

    def decorator(fn: LossFn) -> LossFn:
        if name in _REGISTRY:
            raise ValueError(f"policy loss {name!r} is already registered")
        params = inspect.signature(fn).parameters
        hints = typing.get_type_hints(fn)
        hp = {k: p.default for k, p in params.items() if p.kind == p.KEYWORD_ONLY and k not in _INPUT_KWARGS}
        parsed = {k: _Interval(*((v,) if isinstance(v, str) else v)) for k, v in (bounds or {}).items()}
        stray = sorted(set(parsed) - set(hp))
        if stray:
            raise ValueError(f"bounds given for {stray}, which are not hyperparameters of {name!r}")
        _REGISTRY[name] = _Method(fn, default_loss_agg_mode, hp, {k: hints.get(k, object) for k in hp}, parsed, check)
        return fn

    return decorator


def available_methods() -> list[str]:
    """Names of all registered policy-loss methods, sorted."""
    return sorted(_REGISTRY)


def method_hparams(method: str) -> dict[str, object]:
    """The hyperparameters `method` accepts, with their (paper) defaults."""
    return dict(_get(method).hparams)


def default_loss_agg_mode(method: str) -> str:
    """The aggregation `method`'s primary source uses (used when `loss_agg_mode=None`)."""
    return _get(method).default_loss_agg_mode


def validate_hparams(method: str, **hparams: object) -> dict[str, object]:
    """Check hyperparameter names, types and values of `method`; return all of them (defaults filled in).

    The one place hyperparameters are checked: the losses call it once per call, configs when they are built, and
    the TRL/veRL adapters when theirs are. Raises a one-line ValueError naming the hyperparameter and what is
    accepted. Lists are accepted for tuple-valued hyperparameters (YAML has no tuples) and returned as tuples.
    """
    spec = _get(method)
    unknown = sorted(set(hparams) - set(spec.hparams))
    if unknown:
        raise ValueError(f"{method!r} got unknown hyperparameter(s) {unknown}; it accepts {sorted(spec.hparams)}")
    out = dict(spec.hparams)
    for name, value in hparams.items():
        out[name] = _check_type(method, name, value, spec.kinds[name])
    for name, interval in spec.bounds.items():
        value = out[name]
        if value is not None and not interval.contains(value):
            why = f" ({interval.reason})" if interval.reason else ""
            raise ValueError(
                f"{method} hyperparameter {name} must be in {interval.text}{why}, got {hparams.get(name)!r}"
            )
    if spec.check is not None:
        problem = spec.check(out)
        if problem:
            raise ValueError(f"{method} hyperparameters: {problem}")
    return out


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_type(method: str, name: str, value: object, kind: object) -> object:
    """`value` if it has the annotated type (ints are accepted for floats, lists for tuples), else ValueError."""
    where = f"{method} hyperparameter {name}"
    args = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Literal:
        if value not in args or not isinstance(value, str):
            raise ValueError(f"{where} must be one of {list(args)}, got {value!r}")
        return value
    if type(None) in args:  # Optional[...]
        if value is None:
            return None
        kind = next(a for a in args if a is not type(None))
    if kind is float:
        if not _is_real(value) or not math.isfinite(value):
            raise ValueError(f"{where} must be a finite real number, got {value!r}")
        return float(value)
    if kind is int:
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        return int(value)
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {value!r}")
        return value
    if typing.get_origin(kind) is tuple:
        n = len(typing.get_args(kind))
        seq = isinstance(value, collections.abc.Sequence) and not isinstance(value, str)  # tuple, list, ListConfig
        ok = seq and len(value) == n and all(_is_real(v) and math.isfinite(v) for v in value)
        if not ok:
            raise ValueError(f"{where} must be {n} finite real numbers, got {value!r}")
        return tuple(float(v) for v in value)
    return value


def _get(method: str) -> _Method:
    if method not in _REGISTRY:
        raise ValueError(f"unknown policy-loss method {method!r}; known methods: {available_methods()}")
    return _REGISTRY[method]


# --------------------------------------------------------------------------------------------------------------------
# Public entry points


def policy_loss_terms(
    method: str,
    *,
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    rollout_log_prob: Tensor | None = None,
    allow_empty_rows: bool = False,
    **hparams: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Validate the inputs and return `method`'s per-token loss matrix (B, T) and 0-dim detached metric tensors.

    `allow_empty_rows=True` lets rows with no valid token through (they contribute exactly zero); by default such a
    row is an error, since it usually means a masking bug upstream.
    """
    spec = _get(method)
    hp = validate_hparams(method, **hparams)
    lp, old, adv, mask, rollout = _prepare(
        log_prob, old_log_prob, advantages, response_mask, rollout_log_prob, allow_empty_rows
    )
    loss_mat, metrics = spec.fn(lp, old, adv, mask, rollout_log_prob=rollout, **hp)
    metrics.update(_ratio_metrics(lp.detach(), old, adv, mask))
    return loss_mat, metrics


def compute_policy_loss(
    method: str,
    *,
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    rollout_log_prob: Tensor | None = None,
    loss_agg_mode: str | None = None,
    global_num_tokens: float | Tensor | None = None,
    global_num_seqs: float | Tensor | None = None,
    **hparams: object,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar policy loss of `method` and its metrics as floats.

    Shapes: `log_prob`, `old_log_prob`, `rollout_log_prob`, `response_mask` are (B, T); `advantages` is (B,) or
    (B, T). `loss_agg_mode=None` uses the method's own default (token-mean; seq-mean-token-mean for GSPO).
    `global_num_tokens` / `global_num_seqs` normalise by the whole mini-batch when this call sees one micro-batch.
    Hyperparameters are keyword arguments with the paper defaults (see `method_hparams(method)`).
    """
    mode = default_loss_agg_mode(method) if loss_agg_mode is None else loss_agg_mode
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {list(LOSS_AGG_MODES)}")
    loss_mat, metrics = policy_loss_terms(
        method,
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_log_prob=rollout_log_prob,
        **hparams,
    )
    mask = response_mask.to(loss_mat.dtype)
    loss = agg_loss(loss_mat, mask, mode, global_num_tokens=global_num_tokens, global_num_seqs=global_num_seqs)
    metrics["loss/pg"] = loss.detach()
    return loss, {k: float(v) for k, v in metrics.items()}


# --------------------------------------------------------------------------------------------------------------------
# Input validation and shared pieces


def _prepare(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    rollout_log_prob: Tensor | None,
    allow_empty_rows: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Check shapes, masks and finiteness; return float32 tensors with padding positions zeroed."""
    if not isinstance(log_prob, Tensor) or log_prob.dim() != 2:
        raise ValueError(f"log_prob must be a (B, T) tensor, got {getattr(log_prob, 'shape', type(log_prob))}")
    shape = log_prob.shape
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"log_prob is empty: shape {tuple(shape)}")
    if not log_prob.is_floating_point():
        raise ValueError(f"log_prob must be floating point, got {log_prob.dtype}")
    named = {"old_log_prob": old_log_prob, "response_mask": response_mask}
    if rollout_log_prob is not None:
        named["rollout_log_prob"] = rollout_log_prob
    for name, t in named.items():
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)} but log_prob has shape {tuple(shape)}")
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(
            f"advantages must have shape {tuple(shape[:1])} or {tuple(shape)}, got {tuple(advantages.shape)}"
        )

    mask_f = response_mask.to(torch.float64 if log_prob.dtype == torch.float64 else torch.float32)
    if not bool(((mask_f == 0) | (mask_f == 1)).all()):
        raise ValueError("response_mask must be binary (0/1 or bool)")
    valid = mask_f.bool()
    empty = ~valid.any(dim=-1)
    if not allow_empty_rows and bool(empty.any()):
        rows = torch.nonzero(empty).flatten().tolist()[:10]
        raise ValueError(
            f"response_mask has rows with no valid token: {rows} (pass allow_empty_rows=True to skip them)"
        )

    adv = advantages
    adv = adv.unsqueeze(-1).expand(shape) if adv.dim() == 1 else adv
    checks = {"log_prob": log_prob.detach(), "old_log_prob": old_log_prob, "advantages": adv}
    if rollout_log_prob is not None:
        checks["rollout_log_prob"] = rollout_log_prob
    for name, t in checks.items():
        if not bool((torch.isfinite(t) | ~valid).all()):
            raise ValueError(f"{name} contains NaN or inf at valid (masked-in) positions")

    # Zero the padding so that garbage there (even NaN) cannot leak through 0 * NaN into sums.
    dtype = torch.float64 if log_prob.dtype == torch.float64 else torch.float32  # half precision computes in fp32

    def clean(t: Tensor) -> Tensor:
        return torch.where(valid, t.to(dtype), torch.zeros((), dtype=dtype, device=t.device))

    rollout = None if rollout_log_prob is None else clean(rollout_log_prob.detach())
    return clean(log_prob), clean(old_log_prob.detach()), clean(adv.detach()), mask_f, rollout


def _token_log_ratio(log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    """log(pi/mu) per token, clamped to [-20, 20] (the veRL / VESPO / TRL guard against exp overflow)."""
    return torch.clamp(log_prob - old_log_prob, -_TOKEN_LOG_RATIO_CLAMP, _TOKEN_LOG_RATIO_CLAMP)


def _seq_advantage(adv: Tensor, mask: Tensor) -> Tensor:
    """Sequence-level advantage (B,): the masked mean of the token advantages (equals A for GRPO outcome rewards)."""
    return (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def _select(cond: Tensor, if_true: float, if_false: float, like: Tensor) -> Tensor:
    """Per-element hyperparameter choice (e.g. by advantage sign) in `like`'s dtype and device."""
    return torch.full_like(like, if_false).masked_fill(cond, if_true)


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _rollout_log_ratio(old_log_prob: Tensor, rollout_log_prob: Tensor, mask: Tensor) -> Tensor:
    """log(mu/pi_rollout) per token, in [log 1e-8, 20] (floor as the official VESPO code), zero on padding."""
    return torch.clamp(old_log_prob - rollout_log_prob, _LOG_W_MIN, _LOG_W_MAX) * mask


def _truncated_is(
    old_log_prob: Tensor, rollout_log_prob: Tensor | None, mask: Tensor, threshold: float, level: str
) -> Tensor | None:
    """Truncated IS weight min(mu/pi_rollout, C) for train-inference mismatch (Yao et al. 2025; veRL rollout_is).

    level="token" gives a (B, T) weight per token; level="sequence" one weight per sequence from the product of the
    token ratios, broadcast to (B, T). Computed in log space, detached. None when there is no rollout log-prob.
    """
    if rollout_log_prob is None:
        return None
    log_r = _rollout_log_ratio(old_log_prob, rollout_log_prob, mask)  # (B, T)
    if level == "sequence":
        log_r = log_r.sum(-1, keepdim=True).expand_as(mask)
    return torch.exp(torch.clamp(log_r, max=math.log(threshold)))


def _weight_metrics(prefix: str, weight: Tensor, adv: Tensor, valid: Tensor) -> dict[str, Tensor]:
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
        out[f"{prefix}/min_{sign}"] = torch.where(any_, torch.where(sel, w, torch.full_like(w, math.inf)).min(), zero)
        out[f"{prefix}/max_{sign}"] = torch.where(any_, torch.where(sel, w, torch.full_like(w, -math.inf)).max(), zero)
    log_w = torch.log(w.clamp(min=0.0))  # zero weights (clipped) are log 0 = -inf: no mass in the ESS
    ess = effective_sample_size(log_w.flatten(), valid.flatten())
    out[f"{prefix}/ess"] = torch.nan_to_num(ess, nan=0.0)
    return out


def _ratio_metrics(log_prob: Tensor, old_log_prob: Tensor, adv: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Diagnostics of W = pi/mu common to all methods, all in log space."""
    log_ratio = _token_log_ratio(log_prob, old_log_prob)  # (B, T)
    log_w = (log_ratio * mask).sum(-1)  # (B,)
    seq_valid = mask.sum(-1) > 0
    a_seq = _seq_advantage(adv, mask)
    big = math.inf
    lw_valid = torch.where(seq_valid, log_w, torch.full_like(log_w, big))
    return {
        "is/log_w_mean": (log_w * seq_valid).sum() / seq_valid.sum().clamp(min=1),
        "is/log_w_min": lw_valid.min(),
        "is/log_w_max": torch.where(seq_valid, log_w, torch.full_like(log_w, -big)).max(),
        # k3 estimator of KL(mu || pi) per token, (r - 1) - log r >= 0 (Schulman 2020), on the clamped log-ratio.
        "is/approx_kl": _masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
        "is/n_w_gt_100_neg_adv": ((log_w > _W_LARGE) & (a_seq < 0) & seq_valid).sum().float(),
    }


# --------------------------------------------------------------------------------------------------------------------
# Methods


@register_method("reinforce", bounds={"rollout_is_threshold": "(0, inf)"})
def reinforce(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_log_prob: Tensor | None = None,
    rollout_is_threshold: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """On-policy REINFORCE, loss = -A * log pi (no importance weight; with rollout_log_prob, token TIS)."""
    tis = _truncated_is(old_log_prob, rollout_log_prob, mask, rollout_is_threshold, "token")
    weight = torch.ones_like(log_prob) if tis is None else tis
    loss = -weight * advantages * log_prob
    return loss, _weight_metrics("weight", weight, advantages, mask)


_PROP_31 = ("(0, inf)", "Prop. 3.1")


@register_method("vespo", bounds={"c1_pos": _PROP_31, "c2_pos": _PROP_31, "c1_neg": _PROP_31, "c2_neg": _PROP_31})
def vespo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_log_prob: Tensor | None = None,
    c1_pos: float = 2.0,
    c2_pos: float = 3.0,
    c1_neg: float = 3.0,
    c2_neg: float = 2.0,
    length_norm: Literal["none", "sqrt", "linear"] = "none",
) -> tuple[Tensor, dict[str, Tensor]]:
    """VESPO (paper Eq. 12 and Appendix I): loss = -sg(phi(W)) * A * log pi with W = prod_t pi/mu (no length norm).

    phi(W) = W^c1 exp(c2 (1 - W)), (c1, c2) = (c1_pos, c2_pos) for A >= 0 else (c1_neg, c2_neg), computed in log
    space and detached, so the gradient is phi(W) * A * grad log pi. With `rollout_log_prob`, W = pi/pi_rollout
    (the official code's folding of the rollout IS ratio into log W). `length_norm` "sqrt" / "linear" divides log W
    by sqrt(T) / T: the paper's ablations (Sec. 4.7), not the method.
    Guards (as the official code and TRL): token log-ratios clamped to [-20, 20]; log W clamped to [log 1e-8, 20].
    """
    log_w = (_token_log_ratio(log_prob.detach(), old_log_prob) * mask).sum(-1)  # (B,) log prod_t pi/mu
    if rollout_log_prob is not None:
        log_w = log_w + _rollout_log_ratio(old_log_prob, rollout_log_prob, mask).sum(-1)  # now log pi/pi_rollout
    lengths = mask.sum(-1).clamp(min=1.0)  # (B,)
    if length_norm == "sqrt":
        log_w = log_w / lengths.sqrt()
    elif length_norm == "linear":
        log_w = log_w / lengths
    log_w = log_w.clamp(_LOG_W_MIN, _LOG_W_MAX)

    a_seq = _seq_advantage(advantages, mask)  # (B,)
    pos = a_seq >= 0
    c1 = _select(pos, c1_pos, c1_neg, log_w)
    c2 = _select(pos, c2_pos, c2_neg, log_w)
    log_phi = vespo_log_phi(log_w, c1, c2)  # (B,)
    phi = torch.exp(log_phi)  # detached: log_w was built from log_prob.detach()
    loss = -phi.unsqueeze(-1) * advantages * log_prob  # (B, T)

    seq_valid = mask.sum(-1) > 0
    metrics = _weight_metrics("weight", phi, a_seq, seq_valid)
    # Prop. 3.1 on the batch: E_mu[phi^2] = Z E_Q[phi] <= Z K E_Q[W] = E_mu[K phi W]; the two sides are logged.
    k_seq = torch.where(pos, variance_bound_K(c1_pos, c2_pos), variance_bound_K(c1_neg, c2_neg))
    n = seq_valid.sum().clamp(min=1)
    metrics["vespo/phi_sq_mean"] = (phi.square() * seq_valid).sum() / n
    metrics["vespo/bound_K_phi_w_mean"] = (k_seq * torch.exp(log_phi + log_w) * seq_valid).sum() / n
    metrics["vespo/Z"] = (phi * seq_valid).sum() / n
    return loss, metrics


def _ppo_clip_loss(
    ratio: Tensor, advantages: Tensor, low: Tensor | float, high: Tensor | float, clip_ratio_c: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO clipped surrogate with optional dual clip (Ye et al. 2020), written like veRL's `vanilla` loss.

    Returns (loss (B, T), active: where the gradient flows through the ratio, clipped, dual-clipped) masks.
    `low` / `high` are the ratio bounds themselves (1 - eps_low, 1 + eps_high).
    """
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, low, high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    dual = torch.zeros_like(clipped)
    if clip_ratio_c is not None:
        loss_dual = -advantages * clip_ratio_c
        dual = (advantages < 0) & (loss > loss_dual)
        loss = torch.where(dual, loss_dual, loss)
    active = ~clipped & ~dual
    return loss, active, clipped, dual


_PPO_BOUNDS = {"clip_ratio_low": "[0, 1)", "clip_ratio_high": "[0, inf)", "rollout_is_threshold": "(0, inf)"}


@register_method("grpo", bounds={**_PPO_BOUNDS, "clip_ratio_c": ("(1, inf)", "dual clip")})
def grpo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_log_prob: Tensor | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 3.0,
    rollout_is_threshold: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level PPO clip with DAPO's decoupled bounds (1 - 0.2, 1 + 0.28) and dual clip c = 3 (paper Eq. 6).

    r_t = pi/mu per token; loss = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), capped at -A c for A < 0.
    With `rollout_log_prob`, each token loss is multiplied by min(mu/pi_rollout, C) (token TIS).
    """
    ratio = torch.exp(_token_log_ratio(log_prob, old_log_prob))  # (B, T)
    loss, active, clipped, dual = _ppo_clip_loss(
        ratio, advantages, 1 - clip_ratio_low, 1 + clip_ratio_high, clip_ratio_c
    )
    return _token_method_out(
        loss, ratio, active, clipped, dual, advantages, mask, old_log_prob, rollout_log_prob, rollout_is_threshold
    )


def _token_method_out(
    loss: Tensor,
    ratio: Tensor,
    active: Tensor,
    clipped: Tensor,
    dual: Tensor,
    advantages: Tensor,
    mask: Tensor,
    old_log_prob: Tensor,
    rollout_log_prob: Tensor | None,
    rollout_is_threshold: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Apply token TIS to a clipped token-level loss and collect its clip and weight metrics."""
    weight = ratio.detach() * active
    tis = _truncated_is(old_log_prob, rollout_log_prob, mask, rollout_is_threshold, "token")
    if tis is not None:
        loss, weight = loss * tis, weight * tis
    metrics = _weight_metrics("weight", weight, advantages, mask)
    metrics["clip/frac"] = _masked_mean(clipped.float(), mask)
    metrics["clip/frac_lower"] = _masked_mean(dual.float(), mask)
    return loss, metrics


def _bapo_check(hp: dict[str, object]) -> str | None:
    (a_lo, a_hi), (b_lo, b_hi) = hp["clip_low_range"], hp["clip_high_range"]
    if not 0 < a_lo <= a_hi < 1 < b_lo <= b_hi:
        return (
            "need 0 < clip_low_range[0] <= clip_low_range[1] < 1 < clip_high_range[0] <= clip_high_range[1], "
            f"got {hp['clip_low_range']}, {hp['clip_high_range']}"
        )
    return None


@register_method(
    "bapo",
    bounds={
        "positive_share_target": "[0, 1]",
        "clip_low_step": "(0, inf)",
        "clip_high_step": "(0, inf)",
        "clip_ratio_c": ("(1, inf)", "dual clip"),
        "rollout_is_threshold": "(0, inf)",
    },
    check=_bapo_check,
)
def bapo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_log_prob: Tensor | None = None,
    positive_share_target: float = 0.4,
    clip_low_range: tuple[float, float] = (0.6, 0.9),
    clip_high_range: tuple[float, float] = (1.2, 3.0),
    clip_low_step: float = 0.02,
    clip_high_step: float = 0.05,
    clip_ratio_c: float = 3.0,
    rollout_is_threshold: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """BAPO (Xi et al. 2025, Algorithm 1): PPO clip whose ratio bounds adapt per batch to rebalance the gradient.

    Starting from (c_low, c_high) = (a-, b-), both bounds move up by (step_low, step_high), within their ranges,
    until the positive-advantage tokens carry at least `positive_share_target` (rho_0) of the total |r * A| mass of
    the tokens whose gradient is not clipped (raising c_low clips more A < 0 tokens, raising c_high admits more
    A > 0 tokens). All candidate steps are evaluated in one bucketed pass without host syncs; the chosen bounds
    are in the metrics.
    """
    (a_lo, a_hi), (b_lo, b_hi) = clip_low_range, clip_high_range
    ratio = torch.exp(_token_log_ratio(log_prob, old_log_prob))  # (B, T)
    r, valid = ratio.detach(), mask.bool()
    n_steps = max(math.ceil((a_hi - a_lo) / clip_low_step - 1e-9), math.ceil((b_hi - b_lo) / clip_high_step - 1e-9))
    ks = torch.arange(n_steps + 1, device=r.device, dtype=r.dtype)
    lows = torch.clamp(a_lo + ks * clip_low_step, max=a_hi)  # (K,)
    highs = torch.clamp(b_lo + ks * clip_high_step, max=b_hi)  # (K,)
    mass = (r * advantages.abs()).masked_fill(~valid, 0.0).flatten()  # (B*T,) |r A| per token
    pos, neg = (valid & (advantages > 0)).flatten(), (valid & (advantages < 0)).flatten()
    rf, n_k = r.flatten(), n_steps + 1
    # A > 0 token counts at every step k with highs[k] >= r: bucket = first such k (n_k if none), prefix sums over k.
    first_in = torch.bucketize(rf, highs)  # (B*T,)
    m_pos = torch.zeros(n_k + 1, dtype=r.dtype, device=r.device).index_add_(0, first_in, mass * pos).cumsum(0)[:n_k]
    # A < 0 token counts at every step k with lows[k] <= r: that holds for k < (number of lows <= r), suffix sums.
    n_in = torch.bucketize(rf, lows, right=True)  # (B*T,)
    hist = torch.zeros(n_k + 1, dtype=r.dtype, device=r.device).index_add_(0, n_in, mass * neg)
    m_neg = hist.flip(0).cumsum(0).flip(0)[1:]  # m_neg[k] = sum of hist[c] over c > k
    share = m_pos / (m_pos + m_neg).clamp(min=1e-12)  # (K,), one pass over the tokens, no host sync
    reached = share >= positive_share_target
    idx = torch.where(reached.any(), reached.float().argmax(), torch.tensor(n_steps, device=r.device))
    low, high = lows[idx], highs[idx]
    loss, active, clipped, dual = _ppo_clip_loss(ratio, advantages, low, high, clip_ratio_c)
    loss, metrics = _token_method_out(
        loss, ratio, active, clipped, dual, advantages, mask, old_log_prob, rollout_log_prob, rollout_is_threshold
    )
    metrics.update({"bapo/clip_low": low, "bapo/clip_high": high, "bapo/positive_share": share[idx]})
    return loss, metrics


@register_method("gspo", default_loss_agg_mode="seq-mean-token-mean", bounds=_PPO_BOUNDS)
def gspo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_log_prob: Tensor | None = None,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    rollout_is_threshold: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): sequence ratio s = (pi/mu)^(1/|y|), clipped to [1 - 3e-4, 1 + 4e-4] (paper Eq. 7).

    Token-level stop-gradient form s_t = sg(s) * pi_t / sg(pi_t), so the gradient is s * A * mean_t grad log pi_t
    under seq-mean-token-mean. log s_t is capped at 10 (veRL). With `rollout_log_prob`, a sequence-level truncated
    IS weight min(prod mu/pi_rollout, C) multiplies the loss.
    """
    lengths = mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    log_s = ((log_prob - old_log_prob) * mask).sum(-1, keepdim=True).detach() / lengths  # (B, 1) mean log-ratio
    log_s_tok = torch.clamp(log_s + log_prob - log_prob.detach(), max=_GSPO_LOG_RATIO_MAX)  # (B, T)
    ratio = torch.exp(log_s_tok)
    loss, active, clipped, _ = _ppo_clip_loss(ratio, advantages, 1 - clip_ratio_low, 1 + clip_ratio_high, None)
    # clipping is decided per sequence (s and A are constant across it), so read it off any valid token
    first = mask.argmax(-1, keepdim=True)
    weight = (ratio.detach() * active).gather(1, first).squeeze(1)  # (B,)
    tis = _truncated_is(old_log_prob, rollout_log_prob, mask, rollout_is_threshold, "sequence")
    if tis is not None:
        loss, weight = loss * tis, weight * tis[:, 0]
    seq_valid = mask.sum(-1) > 0
    a_seq = _seq_advantage(advantages, mask)
    metrics = _weight_metrics("weight", weight, a_seq, seq_valid)
    metrics["clip/frac"] = _masked_mean(clipped.float(), mask)
    return loss, metrics


@register_method("sapo", bounds={"tau_pos": "(0, inf)", "tau_neg": "(0, inf)", "rollout_is_threshold": "(0, inf)"})
def sapo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_log_prob: Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_threshold: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (Gao et al. 2025): soft gate f(r) = sigma(tau (r - 1)) * 4 / tau per token, loss = -f(r) * A.

    tau = tau_pos for A > 0, tau_neg otherwise (as TRL / veRL). The gradient weight is f'(r) r = 4 sigma (1 - sigma) r,
    which is 1 at r = 1.
    """
    ratio = torch.exp(_token_log_ratio(log_prob, old_log_prob))  # (B, T)
    tau = _select(advantages > 0, tau_pos, tau_neg, ratio)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(gate * 4.0 / tau) * advantages
    weight = (4.0 * gate * (1.0 - gate) * ratio).detach()
    tis = _truncated_is(old_log_prob, rollout_log_prob, mask, rollout_is_threshold, "token")
    if tis is not None:
        loss, weight = loss * tis, weight * tis
    return loss, _weight_metrics("weight", weight, advantages, mask)


@register_method("topr", bounds={"rollout_is_threshold": "(0, inf)"})
def topr(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_log_prob: Tensor | None = None,
    ratio_level: Literal["product", "geometric"] = "product",
    rollout_is_threshold: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """TOPR (Le Roux et al. 2025): weight 1 for A >= 0, sg(clip(W, 0, 1)) for A < 0; loss = -weight * A * log pi.

    `ratio_level="product"` uses W = prod_t pi/mu (the TOPR paper); "geometric" uses (prod_t pi/mu)^(1/|y|), the
    length-normalised variant. clip(W, 0, 1) = exp(min(log W, 0)) never overflows.
    """
    log_w = (_token_log_ratio(log_prob.detach(), old_log_prob) * mask).sum(-1)  # (B,)
    if ratio_level == "geometric":
        log_w = log_w / mask.sum(-1).clamp(min=1.0)
    a_seq = _seq_advantage(advantages, mask)
    weight = torch.where(a_seq >= 0, torch.ones_like(log_w), torch.exp(log_w.clamp(max=0.0)))  # (B,)
    tis = _truncated_is(old_log_prob, rollout_log_prob, mask, rollout_is_threshold, "sequence")
    if tis is not None:
        weight = weight * tis[:, 0]
    loss = -weight.unsqueeze(-1) * advantages * log_prob
    metrics = _weight_metrics("weight", weight, a_seq, mask.sum(-1) > 0)
    metrics["clip/frac"] = ((a_seq < 0) & (log_w < 0)).float().mean()
    return loss, metrics


def _cispo_check(hp: dict[str, object]) -> str | None:
    if hp["ratio_min"] is not None and not hp["ratio_min"] < hp["ratio_max"]:
        return f"need ratio_min < ratio_max, got {hp['ratio_min']}, {hp['ratio_max']}"
    return None


@register_method(
    "cispo",
    bounds={"ratio_max": "(0, inf)", "ratio_min": "[0, inf)", "rollout_is_threshold": "(0, inf)"},
    check=_cispo_check,
)
def cispo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_log_prob: Tensor | None = None,
    ratio_max: float = 5.0,
    ratio_min: float | None = None,
    rollout_is_threshold: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, 2025): loss = -sg(clip(r, ratio_min, ratio_max)) * A * log pi per token.

    MiniMax-M1 sets no lower bound; the upper bound 5.0 is ScaleRL's recommendation (TRL's default for CISPO).
    Unlike PPO clipping, clipped tokens keep their gradient, only their weight is capped.
    """
    ratio = torch.exp(_token_log_ratio(log_prob.detach(), old_log_prob))  # (B, T), detached
    weight = torch.clamp(ratio, min=ratio_min, max=ratio_max)
    clipped = (ratio > ratio_max) | (
        ratio < ratio_min if ratio_min is not None else torch.zeros_like(ratio, dtype=torch.bool)
    )
    tis = _truncated_is(old_log_prob, rollout_log_prob, mask, rollout_is_threshold, "token")
    if tis is not None:
        weight = weight * tis
    loss = -weight * advantages * log_prob
    metrics = _weight_metrics("weight", weight, advantages, mask)
    metrics["clip/frac"] = _masked_mean(clipped.float(), mask)
    return loss, metrics
