"""Policy losses: VESPO and the baselines it is compared with, behind one registry and one signature.

Every method is a pure function registered with `register_method`:

    fn(log_prob, old_log_prob, advantages, mask, *, **hparams) -> (loss_mat, metrics)

of float tensors of shape (B, T) (`advantages` is a (B, T) view, constant along a row, stride 0, when the caller
gave one advantage per sequence; `mask` is float 0/1), returning the per-token loss matrix and a dict of 0-dim
detached metric tensors. A method registered with `rollout_correction="fold"` also takes the keyword
`rollout_log_w` (B,) or None: the log of the sequence's train-inference IS weight, to fold into its own W. Any
method may also declare the keywords `log_ratio` (B, T) (detached log(pi/mu), clamped to [-20, 20]) and
`seq_log_ratio` (B,) (its masked row sum, log W): the core computes them once per call and passes them (default
None: compute them yourself when called directly). Methods whose weights depend on statistics of the whole
mini-batch (`vespo.adaptive`) declare `batch_context`, which the caller passes through unchanged.
Gradients flow into `log_prob` only. Hyperparameters are keyword-only arguments with the paper defaults; they are
checked once, by `validate_hparams`, before the function runs, never inside it. Normalisation lives in
`vespo.aggregation`.

Train-inference mismatch is corrected here, once, for every method: the caller passes the sampler's log-probs
(`rollout_log_prob`) or an engine's ready weights (`rollout_is_weights`, what veRL and TRL hand over), and the
method's registered `rollout_correction` says how they apply: "token" multiplies each token's loss by
min(mu/pi_rollout, C), "sequence" by min(prod_t mu/pi_rollout, C), "fold" passes the sum of the token-level
truncated log-weights to the method (VESPO: W = pi/mu * prod_t min(mu/pi_rollout, C), as the official code).
C = `rollout_is_threshold` (default `ROLLOUT_IS_THRESHOLD` = 2, veRL's default, which the official VESPO code
receives), a hyperparameter of every method; None means no truncation.

The public entry points are `compute_policy_loss` (scalar loss and 0-dim metric tensors) and `policy_loss_terms`
(loss matrix, for engines that aggregate themselves). Both check their inputs with one fused test (one host
synchronisation); `validate=False` skips it for engines that validated upstream (padding must then be finite).

Notation: pi = current policy (log_prob), mu = behaviour policy the weights are taken against (old_log_prob),
pi_rollout = the inference engine that sampled (rollout_log_prob, train-inference mismatch).
Every method reduces to REINFORCE, -A * log pi, when log_prob == old_log_prob and no rollout correction is given.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from vespo.aggregation import LOSS_AGG_MODES, agg_loss, masked_mean
from vespo.kernels import effective_sample_size, variance_bound_K, vespo_log_phi

Tensor = torch.Tensor
LossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]

ROLLOUT_IS_THRESHOLD = 2.0  # C in min(mu/pi_rollout, C): veRL's rollout_is_threshold default (official VESPO code)
ROLLOUT_CORRECTIONS = ("token", "sequence", "fold")
LOG_PROB_MAX = 1e-3  # validation: log-probs above this are an error (numerical slack of log_softmax in bf16/fp16)

# Guards shared with veRL, the official VESPO code and TRL (documented in docs/losses.md):
_TOKEN_LOG_RATIO_CLAMP = 20.0  # per-token log(pi/mu) clamped to [-20, 20] before any exp or sum (veRL, VESPO, TRL)
_LOG_W_MIN = math.log(1e-8)  # VESPO: sequence log W and per-token rollout log-weights floored at log 1e-8 (VESPO, TRL)
_LOG_W_MAX = 20.0  # VESPO: sequence log W capped at 20 (W <= 4.9e8, where phi is exactly 0 in float32)
_GSPO_LOG_RATIO_MAX = 10.0  # GSPO: token-level log s_i,t capped at 10 (veRL)
_BAPO_EPS = 1e-8  # BAPO: positive/negative contribution ratio = pos / (neg + eps) (authors' code)
_W_LARGE = math.log(100.0)  # diagnostics: sequences with W > 100 and A < 0 are the ones the paper worries about


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


@dataclass(frozen=True)
class _Method:
    fn: LossFn
    default_loss_agg_mode: str
    rollout_correction: str  # "token" | "sequence" | "fold"
    inputs: frozenset[str]  # which of the core's precomputed `_OPTIONAL_INPUTS` the function takes
    hparams: dict[str, object]  # name -> default
    kinds: dict[str, object]  # name -> type annotation (float, int, str, bool, Literal[...], float | None)
    bounds: dict[str, _Interval]
    check: Callable[[dict[str, object]], str | None] | None


_REGISTRY: dict[str, _Method] = {}
# Keyword inputs (not hyperparameters) the core passes to a method that declares them, computed once per call:
_OPTIONAL_INPUTS = (
    "rollout_log_w",  # (B,) or None: log of the train-inference weight to fold into W ("fold" methods only)
    "log_ratio",  # (B, T) detached log(pi/mu) per token, clamped to [-20, 20]
    "seq_log_ratio",  # (B,) masked row sum of `log_ratio`: log W with the per-token guard
    "batch_context",  # caller-supplied mini-batch statistics (`vespo.adaptive.BatchContext`) or None
)
# Hyperparameters every method has, applied by the core (not passed to the method function).
_COMMON_HPARAMS: dict[str, tuple[object, object, _Interval]] = {
    "rollout_is_threshold": (ROLLOUT_IS_THRESHOLD, float | None, _Interval("(0, inf)", "or None: no truncation")),
}


def register_method(
    name: str,
    *,
    default_loss_agg_mode: str = "token-mean",
    rollout_correction: Literal["token", "sequence", "fold"] = "token",
    bounds: dict[str, str | tuple[str, str]] | None = None,
    check: Callable[[dict[str, object]], str | None] | None = None,
) -> Callable[[LossFn], LossFn]:
    """Register a policy-loss function under `name`; registering a name twice raises (no silent overwrite).

    The function's keyword-only arguments are its hyperparameters: their defaults are the paper's, their annotations
    (float, int, str, bool, `Literal[...]`, `float | None`) the accepted types. `bounds` maps a
    hyperparameter to its allowed interval, "(0, inf)" or ("[0, 1)", "why"); `check(hparams)` returns a message for
    constraints between hyperparameters (or None). `validate_hparams` applies all of them. `default_loss_agg_mode`
    is the aggregation of the method's primary source; `rollout_correction` how the sampler ratio applies (see the
    module docstring); "fold" methods take the keyword `rollout_log_w`.
    """
    if default_loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown default_loss_agg_mode {default_loss_agg_mode!r}")
    if rollout_correction not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"rollout_correction must be one of {ROLLOUT_CORRECTIONS}, got {rollout_correction!r}")

    def decorator(fn: LossFn) -> LossFn:
        if name in _REGISTRY:
            raise ValueError(f"policy loss {name!r} is already registered")
        params = inspect.signature(fn).parameters
        if ("rollout_log_w" in params) != (rollout_correction == "fold"):
            raise ValueError(f"{name!r}: a method takes `rollout_log_w` exactly when rollout_correction='fold'")
        hints = typing.get_type_hints(fn)
        inputs = frozenset(_OPTIONAL_INPUTS) & set(params)
        hp = {k: p.default for k, p in params.items() if p.kind == p.KEYWORD_ONLY and k not in _OPTIONAL_INPUTS}
        clash = sorted(set(hp) & set(_COMMON_HPARAMS))
        if clash:
            raise ValueError(f"{name!r}: {clash} are applied by the core for every method; do not declare them")
        kinds = {k: hints.get(k, object) for k in hp}
        parsed = {k: _Interval(*((v,) if isinstance(v, str) else v)) for k, v in (bounds or {}).items()}
        stray = sorted(set(parsed) - set(hp))
        if stray:
            raise ValueError(f"bounds given for {stray}, which are not hyperparameters of {name!r}")
        for k, (default, kind, interval) in _COMMON_HPARAMS.items():
            hp[k], kinds[k], parsed[k] = default, kind, interval
        _REGISTRY[name] = _Method(fn, default_loss_agg_mode, rollout_correction, inputs, hp, kinds, parsed, check)
        return fn

    return decorator


def available_methods() -> list[str]:
    """Names of all registered policy-loss methods, sorted."""
    return sorted(_REGISTRY)


def method_hparams(method: str) -> dict[str, object]:
    """The hyperparameters `method` accepts, with their (paper) defaults."""
    return dict(_get(method).hparams)


def default_loss_agg_mode(method: str) -> str:
    """The aggregation `method`'s primary source uses (used when `loss_agg_mode=None`); docs/losses.md cites each."""
    return _get(method).default_loss_agg_mode


def rollout_correction(method: str) -> str:
    """How `method` applies the train-inference IS ratio: "token", "sequence" or "fold" (into its W)."""
    return _get(method).rollout_correction


def validate_hparams(method: str, **hparams: object) -> dict[str, object]:
    """Check hyperparameter names, types and values of `method`; return all of them (defaults filled in).

    The one place hyperparameters are checked: the losses call it once per call, configs when they are built, and
    the TRL/veRL adapters when theirs are. Raises a one-line ValueError naming the hyperparameter and what is
    accepted. Ints are accepted (and returned as floats) where a float is annotated.
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
    """`value` if it has the annotated type (ints are accepted for floats), else ValueError."""
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
    rollout_is_weights: Tensor | None = None,
    rollout_is_level: Literal["token", "sequence"] | None = None,
    allow_empty_rows: bool = False,
    validate: bool = True,
    batch_context: object | None = None,
    **hparams: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`method`'s per-token loss matrix (B, T), rollout correction applied, and its 0-dim detached metric tensors.

    Train-inference correction: `rollout_log_prob` (B, T), the sampler's log-probs, or `rollout_is_weights`, an
    engine's ready, already truncated weights: (B, T) per token, or per sequence as (B, 1) or (B, T) constant along
    a row. Ready weights multiply the loss as given (as veRL's and TRL's own losses do) except for "fold" methods,
    which need `rollout_is_level` ("token" / "sequence"; (B, 1) implies "sequence") to fold them into W.
    `allow_empty_rows=True` lets rows with no valid token through (they contribute exactly zero); by default such a
    row is an error, since it usually means a masking bug upstream. `validate=False` skips the value checks (one
    fused test, one host sync): for engines that validated upstream; padding must then be finite. Padding entries of
    the returned matrix are unspecified: aggregate with the mask.
    """
    spec = _get(method)
    hp = validate_hparams(method, **hparams)
    threshold = hp.pop("rollout_is_threshold")
    if batch_context is not None and "batch_context" not in spec.inputs:
        raise ValueError(f"{method!r} does not use mini-batch statistics; pass batch_context=None")
    dtype = _check_structure(log_prob, old_log_prob, advantages, response_mask, rollout_log_prob, rollout_is_weights)
    if rollout_log_prob is not None and rollout_is_weights is not None:
        raise ValueError("pass rollout_log_prob or rollout_is_weights, not both")
    if rollout_is_level not in (None, "token", "sequence"):
        raise ValueError(f"rollout_is_level must be 'token', 'sequence' or None, got {rollout_is_level!r}")
    if rollout_is_weights is not None and rollout_is_weights.shape[-1] == 1 and log_prob.shape[-1] > 1:
        if rollout_is_level == "token":
            raise ValueError("rollout_is_weights of shape (B, 1) are per sequence, but rollout_is_level is 'token'")
        rollout_is_level = "sequence"
    fold = spec.rollout_correction == "fold"
    if fold and rollout_is_weights is not None and rollout_is_level is None:
        raise ValueError(
            f"{method!r} folds the rollout IS weight into its sequence weight W and must know whether the weights "
            "are per 'token' or per 'sequence': set rollout_is_level"
        )
    mask = response_mask.to(dtype)  # (B, T) 0/1
    lp, old, adv = log_prob.to(dtype), old_log_prob.detach().to(dtype), advantages.detach().to(dtype)
    rollout = None if rollout_log_prob is None else rollout_log_prob.detach().to(dtype)
    weights = None if rollout_is_weights is None else rollout_is_weights.detach().to(dtype)
    if validate and _check_values(
        lp, old, adv, mask, rollout, weights,
        binary=not response_mask.is_floating_point(), allow_empty_rows=allow_empty_rows,
        sequence_weights=fold and rollout_is_level == "sequence",
    ):  # fmt: skip
        # NaN/inf in the padding (valid positions are fine): zero it so that 0 * NaN cannot reach a sum (slow path)
        valid = mask > 0
        row_valid = valid.any(-1, keepdim=True)  # (B, 1), for per-sequence inputs of empty rows

        def clean(t: Tensor) -> Tensor:
            return torch.where(valid if t.shape == valid.shape else row_valid.reshape(t.shape), t, 0.0)

        lp, old, adv = clean(lp), clean(old), clean(adv)
        rollout = None if rollout is None else clean(rollout)
        weights = None if weights is None else clean(weights)
    if adv.dim() == 1 or adv.shape[-1] == 1:  # one advantage per sequence: a stride-0 (B, T) view, no copy
        adv = adv.reshape(-1, 1).expand(lp.shape)

    log_ratio = _token_log_ratio(lp.detach(), old)  # (B, T), shared by the metrics and the methods that take it
    shared = {"log_ratio": log_ratio, "seq_log_ratio": _row_sum(log_ratio, mask), "batch_context": batch_context}
    if fold:
        shared["rollout_log_w"], ro_metrics = _fold_log_weight(old, rollout, weights, rollout_is_level, mask, threshold)
    loss_mat, metrics = spec.fn(lp, old, adv, mask, **{k: shared[k] for k in spec.inputs}, **hp)
    if not fold:
        factor, ro_metrics = _is_factor(old, rollout, weights, mask, spec.rollout_correction, threshold)
        if factor is not None:
            loss_mat = loss_mat * factor  # (B, T) or (B, 1), detached
    metrics.update(ro_metrics)
    metrics.update(_ratio_metrics(shared["seq_log_ratio"], adv, mask))
    return loss_mat, metrics


def compute_policy_loss(
    method: str,
    *,
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    rollout_log_prob: Tensor | None = None,
    rollout_is_weights: Tensor | None = None,
    rollout_is_level: Literal["token", "sequence"] | None = None,
    loss_agg_mode: str | None = None,
    global_num_tokens: float | Tensor | None = None,
    global_num_seqs: float | Tensor | None = None,
    allow_empty_rows: bool = False,
    validate: bool = True,
    batch_context: object | None = None,
    **hparams: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Scalar policy loss of `method` and its metrics as 0-dim detached tensors (`float(v)` converts; call it once
    per logged step, not per micro-batch, to avoid host synchronisation).

    Shapes: `log_prob`, `old_log_prob`, `rollout_log_prob`, `response_mask` are (B, T); `advantages` is (B,) or
    (B, T). `loss_agg_mode=None` uses the method's own default (`default_loss_agg_mode`). `global_num_tokens` /
    `global_num_seqs` (> 0) normalise by the whole mini-batch when this call sees one micro-batch. Hyperparameters
    are keyword arguments with the paper defaults (`method_hparams(method)`); rollout correction,
    `allow_empty_rows` and `validate` as in `policy_loss_terms`; `batch_context` (mini-batch statistics for the
    batch-adaptive methods, `vespo.adaptive.batch_context`) makes a micro-batch call decide as the whole mini-batch.
    """
    mode = default_loss_agg_mode(method) if loss_agg_mode is None else loss_agg_mode
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {list(LOSS_AGG_MODES)}")
    counts = {"global_num_tokens": global_num_tokens, "global_num_seqs": global_num_seqs}
    for name, value in counts.items():
        _check_count(name, value, validate)
    loss_mat, metrics = policy_loss_terms(
        method,
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_log_prob=rollout_log_prob,
        rollout_is_weights=rollout_is_weights,
        rollout_is_level=rollout_is_level,
        allow_empty_rows=allow_empty_rows,
        validate=validate,
        batch_context=batch_context,
        **hparams,
    )
    loss = agg_loss(loss_mat, response_mask, mode, **counts)
    metrics["loss/pg"] = loss.detach()
    return loss, metrics


def check_policy_inputs(
    *,
    log_prob: Tensor | None,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    rollout_log_prob: Tensor | None = None,
    allow_empty_rows: bool = False,
) -> None:
    """The loss's input checks (structure and the fused value test) run once, for a caller that then calls the loss
    per micro-batch with `validate=False` (the trainer, once per rollout batch). Stricter than `validate=True`
    in one way: NaN/inf in the padding is an error too, since `validate=False` does not zero it. `log_prob=None`
    checks the batch's data before any forward pass."""
    ref = old_log_prob if log_prob is None else log_prob  # the shape every input must have
    dtype = _check_structure(ref, old_log_prob, advantages, response_mask, rollout_log_prob, None)
    mask = response_mask.to(dtype)
    tensors = [None if t is None else t.detach().to(dtype) for t in (log_prob, old_log_prob, advantages)]
    rollout = None if rollout_log_prob is None else rollout_log_prob.detach().to(dtype)
    if _check_values(
        *tensors, mask, rollout, None,
        binary=not response_mask.is_floating_point(), allow_empty_rows=allow_empty_rows, sequence_weights=False,
    ):  # fmt: skip
        raise ValueError("log-probs or advantages contain NaN or inf in the padding (masked-out positions)")


# --------------------------------------------------------------------------------------------------------------------
# Input checks: structure (free, always) and values (one fused test, `validate=True`)


def _check_structure(
    log_prob: object,
    old_log_prob: object,
    advantages: object,
    response_mask: object,
    rollout_log_prob: object,
    rollout_is_weights: object,
) -> torch.dtype:
    """Types, dtypes and shapes (no data is read); returns the compute dtype (float64 stays, the rest float32)."""
    named = {
        "log_prob": log_prob,
        "old_log_prob": old_log_prob,
        "advantages": advantages,
        "response_mask": response_mask,
        "rollout_log_prob": rollout_log_prob,
        "rollout_is_weights": rollout_is_weights,
    }
    for name, t in named.items():
        if t is None and name.startswith("rollout"):
            continue
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if name != "response_mask" and not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if response_mask.is_floating_point() is False and response_mask.dtype not in (
        torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64
    ):  # fmt: skip
        raise ValueError(f"response_mask must be bool, integer or floating point, got {response_mask.dtype}")
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be a (B, T) tensor, got shape {tuple(log_prob.shape)}")
    shape = tuple(log_prob.shape)
    if 0 in shape:
        raise ValueError(f"log_prob is empty: shape {shape}")
    for name in ("old_log_prob", "response_mask", "rollout_log_prob"):
        t = named[name]
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but log_prob has shape {shape}")
    if tuple(advantages.shape) not in (shape[:1], (shape[0], 1), shape):
        raise ValueError(f"advantages must have shape {shape[:1]} or {shape}, got {tuple(advantages.shape)}")
    if rollout_is_weights is not None and tuple(rollout_is_weights.shape) not in ((shape[0], 1), shape):
        raise ValueError(
            f"rollout_is_weights must have shape {shape} or {(shape[0], 1)}, got {tuple(rollout_is_weights.shape)}"
        )
    return torch.float64 if log_prob.dtype == torch.float64 else torch.float32


def _check_count(name: str, value: object, validate: bool) -> None:
    """A global token/sequence count must be a finite number > 0 (a tensor is checked with the fused test)."""
    if value is None:
        return
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        if validate and not bool(torch.isfinite(value) & (value > 0)):
            raise ValueError(f"{name} must be a finite number > 0, got {value.item()}")
        return
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_values(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    rollout_log_prob: Tensor | None,
    rollout_is_weights: Tensor | None,
    *,
    binary: bool,
    allow_empty_rows: bool,
    sequence_weights: bool,
) -> bool:
    """One fused test of every value condition (one host sync); returns whether the padding needs zeroing.

    At valid positions: log-probs finite and <= LOG_PROB_MAX, advantages finite, IS weights finite and >= 0 (and
    constant along a row when they are per sequence); the mask binary; every row non-empty unless allowed. The fast
    test looks at all positions with cheap reductions; only if it fails are valid and padding positions told apart
    (a bad valid value raises a one-line ValueError naming the input; NaN/inf only in the padding returns True).
    """
    lengths = mask.sum(-1)  # (B,)
    logps = {"log_prob": log_prob, "old_log_prob": old_log_prob, "rollout_log_prob": rollout_log_prob}
    flags = []
    for t in logps.values():
        if t is not None:
            lo, hi = torch.aminmax(t.detach())
            flags.append((lo > -math.inf) & (hi <= LOG_PROB_MAX))  # NaN fails both comparisons
    flags.append(torch.isfinite(advantages.sum()))  # overflow of a finite sum only sends us to the exact check
    if rollout_is_weights is not None:
        lo, hi = torch.aminmax(rollout_is_weights)
        flags.append((lo >= 0) & (hi < math.inf))
        if sequence_weights and rollout_is_weights.shape == mask.shape:
            flags.append(_row_spread(rollout_is_weights, mask) <= 1e-6)
    lo, hi = torch.aminmax(mask)
    flags.append((lo >= 0) & (hi <= 1))
    if not binary:  # within [0, 1], m * m == m exactly when m is 0 or 1; row sums of 0/1 are exact
        flags.append((torch.linalg.vecdot(mask, mask) == lengths).all())
    if not allow_empty_rows:
        flags.append((lengths > 0).all())
    if bool(torch.stack(flags).all()):  # the one host sync
        return False

    # Slow path (something is off somewhere): find it, or conclude that only the padding is non-finite.
    valid = mask > 0
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("response_mask must be binary (0/1 or bool)")
    if not allow_empty_rows and not bool((lengths > 0).all()):
        rows = torch.nonzero(lengths == 0).flatten()[:10].tolist()
        raise ValueError(f"response_mask has rows with no valid token: {rows} (allow_empty_rows=True skips them)")
    for name, t in logps.items():
        if t is None:
            continue
        at_valid = t.detach()[valid]
        if not bool(torch.isfinite(at_valid).all()):
            raise ValueError(f"{name} contains NaN or inf at valid (masked-in) positions")
        top = at_valid.max().item() if at_valid.numel() else 0.0
        if top > LOG_PROB_MAX:
            raise ValueError(f"{name} has values up to {top:.4g} at valid positions: log-probabilities must be <= 0")
    a = advantages if advantages.shape == mask.shape else advantages.reshape(-1, 1).expand(mask.shape)
    if not bool(torch.isfinite(a[valid]).all()):
        raise ValueError("advantages contain NaN or inf at valid (masked-in) positions")
    if rollout_is_weights is not None:
        w = rollout_is_weights if rollout_is_weights.shape == mask.shape else rollout_is_weights.expand(mask.shape)
        w = w[valid]
        if not bool((torch.isfinite(w) & (w >= 0)).all()):
            raise ValueError("rollout_is_weights must be finite and >= 0 at valid positions")
        if sequence_weights and rollout_is_weights.shape == mask.shape:
            clean = torch.where(valid, rollout_is_weights, 0.0)
            if not bool(_row_spread(clean, mask) <= 1e-6):
                raise ValueError(
                    "rollout_is_level is 'sequence' but rollout_is_weights vary along a sequence: they are "
                    "token-level weights, set rollout_is_level='token'"
                )
    full = [t for t in (log_prob, old_log_prob, rollout_log_prob, advantages, rollout_is_weights) if t is not None]
    return any(not bool(torch.isfinite(t.detach()).all()) for t in full)


def _row_spread(w: Tensor, mask: Tensor) -> Tensor:
    """Largest relative deviation of `w` (B, T) from its row's first valid value, over valid positions."""
    first = w.gather(1, (mask > 0).to(torch.uint8).argmax(-1, keepdim=True))  # (B, 1)
    return ((w - first).abs() * mask).amax() / first.abs().amax().clamp(min=1.0)


# --------------------------------------------------------------------------------------------------------------------
# Shared pieces: reductions, rollout correction, metrics


def _row_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Masked sum over each row, (B, T) x (B, T) -> (B,), as a row-wise dot product (one pass, no temporary)."""
    return torch.linalg.vecdot(x, mask)


def _compact(adv: Tensor) -> Tensor:
    """Advantages as (B, 1) when they are one per sequence (a stride-0 row view), else the (B, T) tensor itself."""
    return adv[:, :1] if adv.stride(-1) == 0 else adv


def _seq_advantage(adv: Tensor, mask: Tensor) -> Tensor:
    """Sequence-level advantage (B,): A itself for one advantage per sequence, else the masked token mean."""
    if adv.stride(-1) == 0:
        return adv[:, 0]
    return _row_sum(adv, mask) / mask.sum(-1).clamp(min=1.0)


def _select(cond: Tensor, if_true: float, if_false: float, like: Tensor) -> Tensor:
    """Per-element hyperparameter choice (e.g. by advantage sign) in `like`'s dtype and device."""
    return torch.full_like(like, if_false).masked_fill(cond, if_true)


def _token_log_ratio(log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    """log(pi/mu) per token, clamped to [-20, 20] (the veRL / VESPO / TRL guard against exp overflow)."""
    diff = log_prob - old_log_prob
    if diff.requires_grad:
        return diff.clamp(-_TOKEN_LOG_RATIO_CLAMP, _TOKEN_LOG_RATIO_CLAMP)
    return diff.clamp_(-_TOKEN_LOG_RATIO_CLAMP, _TOKEN_LOG_RATIO_CLAMP)  # in place on the fresh temporary


def kl_k3(log_ratio: Tensor, clamp: float | None = None) -> Tensor:
    """k3 estimator of KL per token, exp(x) - x - 1 >= 0 with x = log(q/p) for samples of p (Schulman 2020).

    With x = log(pi_ref/pi) it is the KL(pi || pi_ref) penalty of GRPO (TRL, veRL's "low_var_kl" with clamp=10).
    """
    kl = torch.expm1(log_ratio) - log_ratio
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def _log_threshold(threshold: float | None) -> float:
    return _TOKEN_LOG_RATIO_CLAMP if threshold is None else min(math.log(threshold), _TOKEN_LOG_RATIO_CLAMP)


def _is_factor(
    old: Tensor, rollout: Tensor | None, weights: Tensor | None, mask: Tensor, level: str, threshold: float | None
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """The detached factor on the per-token loss for train-inference mismatch, and its metrics.

    Ready engine weights are used as given. From rollout log-probs: level "token" gives min(mu/pi_rollout, C) per
    token (B, T), "sequence" min(prod_t mu/pi_rollout, C) per sequence (B, 1); the log-ratio is clamped to
    [-20, 20] before the exp, as veRL's `compute_rollout_correction_weights`.
    """
    if weights is not None:
        if weights.shape == mask.shape:
            mean = masked_mean(weights, mask)
        else:
            seq_valid = (mask.sum(-1, keepdim=True) > 0).to(weights.dtype)
            mean = (weights * seq_valid).sum() / seq_valid.sum().clamp(min=1.0)
        return weights, {"rollout_is/mean": mean}
    if rollout is None:
        return None, {}
    log_c = _log_threshold(threshold)
    if level == "token":
        log_r = (old - rollout).clamp(-_TOKEN_LOG_RATIO_CLAMP, _TOKEN_LOG_RATIO_CLAMP)  # (B, T)
        factor = torch.exp(log_r.clamp(max=log_c))
        metrics = {
            "rollout_is/mean": masked_mean(factor, mask),
            "rollout_is/frac_truncated": masked_mean(log_r > log_c, mask),
        }
    else:
        log_r = _row_sum(old - rollout, mask).clamp(-_TOKEN_LOG_RATIO_CLAMP, _TOKEN_LOG_RATIO_CLAMP)  # (B,)
        factor = torch.exp(log_r.clamp(max=log_c)).unsqueeze(-1)  # (B, 1)
        seq_valid = mask.sum(-1) > 0
        n = seq_valid.sum().clamp(min=1)
        metrics = {
            "rollout_is/mean": (factor[:, 0] * seq_valid).sum() / n,
            "rollout_is/frac_truncated": ((log_r > log_c) & seq_valid).sum() / n,
        }
    return factor, metrics


def _fold_log_weight(
    old: Tensor,
    rollout: Tensor | None,
    weights: Tensor | None,
    level: str | None,
    mask: Tensor,
    threshold: float | None,
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """log of the sequence's train-inference weight (B,) for methods that fold it into W, and its metrics.

    From rollout log-probs: sum_t log min(mu/pi_rollout, C), each term floored at log 1e-8 (the official VESPO code
    applied to veRL's token-level weights). Ready weights: the sum of their logs (per token) or the log of the
    sequence's weight, taken once (a broadcast sequence weight summed over T tokens would be raised to the power T).
    """
    if rollout is not None:
        log_r = old - rollout  # (B, T)
        log_c = _log_threshold(threshold)
        log_w = _row_sum(log_r.clamp(_LOG_W_MIN, log_c), mask)
        frac = masked_mean(log_r > log_c, mask)
        return log_w, {"rollout_is/log_w_mean": _seq_mean(log_w, mask), "rollout_is/frac_truncated": frac}
    if weights is None:
        return None, {}
    if level == "token":
        log_w = _row_sum(torch.log(weights.clamp(min=1e-8)).clamp(max=_TOKEN_LOG_RATIO_CLAMP), mask)
    else:
        w_seq = (
            weights
            if weights.shape[-1] == 1
            else weights.gather(1, (mask > 0).to(torch.uint8).argmax(-1, keepdim=True))
        )
        log_w = torch.log(w_seq[:, 0].clamp(min=1e-8)).clamp(max=_TOKEN_LOG_RATIO_CLAMP)
    return log_w, {"rollout_is/log_w_mean": _seq_mean(log_w, mask)}


def _seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of a per-sequence quantity (B,) over the sequences with at least one valid token."""
    seq_valid = (mask.sum(-1) > 0).to(x.dtype)
    return (x * seq_valid).sum() / seq_valid.sum().clamp(min=1.0)


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
        out[f"{prefix}/min_{sign}"] = torch.where(any_, torch.where(sel, w, math.inf).min(), zero)
        out[f"{prefix}/max_{sign}"] = torch.where(any_, torch.where(sel, w, -math.inf).max(), zero)
    log_w = torch.log(w.clamp(min=0.0))  # zero weights (clipped) are log 0 = -inf: no mass in the ESS
    ess = effective_sample_size(log_w.flatten(), valid.flatten())
    out[f"{prefix}/ess"] = torch.nan_to_num(ess, nan=0.0)
    return out


def _token_weight_metrics(weight: Tensor, adv: Tensor, mask: Tensor) -> dict[str, Tensor]:
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


def _ratio_metrics(log_w: Tensor, adv: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Diagnostics of W = pi/mu common to all methods, from log W = sum_t log(pi/mu) (tokens clamped at +-20), (B,)."""
    lengths = mask.sum(-1)
    seq_valid = lengths > 0
    a_seq = _seq_advantage(adv, mask)
    return {
        "is/log_w_mean": (log_w * seq_valid).sum() / seq_valid.sum().clamp(min=1),
        "is/log_w_min": torch.where(seq_valid, log_w, math.inf).min(),
        "is/log_w_max": torch.where(seq_valid, log_w, -math.inf).max(),
        # k1 estimate of KL(mu || pi) per token, mean of -log(pi/mu) (veRL's ppo_kl); free given log W
        "is/approx_kl": -log_w.sum() / lengths.sum().clamp(min=1.0),
        "is/n_w_gt_100_neg_adv": ((log_w > _W_LARGE) & (a_seq < 0) & seq_valid).sum().float(),
    }


# --------------------------------------------------------------------------------------------------------------------
# Methods


@register_method("reinforce")
def reinforce(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """On-policy REINFORCE, loss = -A * log pi (no importance weight)."""
    loss = log_prob * -_compact(advantages)  # (B, T)
    a_seq = _seq_advantage(advantages, mask)
    return loss, _weight_metrics("weight", torch.ones_like(a_seq), a_seq, mask.sum(-1) > 0)


_PROP_31 = ("(0, inf)", "Prop. 3.1")


@register_method(
    "vespo",
    rollout_correction="fold",
    bounds={"c1_pos": _PROP_31, "c2_pos": _PROP_31, "c1_neg": _PROP_31, "c2_neg": _PROP_31},
)
def vespo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rollout_log_w: Tensor | None = None,
    seq_log_ratio: Tensor | None = None,
    c1_pos: float = 2.0,
    c2_pos: float = 3.0,
    c1_neg: float = 3.0,
    c2_neg: float = 2.0,
    length_norm: Literal["none", "sqrt", "linear"] = "none",
) -> tuple[Tensor, dict[str, Tensor]]:
    """VESPO (paper Eq. 12 and Appendix I): loss = -sg(phi(W)) * A * log pi with W = prod_t pi/mu (no length norm).

    phi(W) = W^c1 exp(c2 (1 - W)), (c1, c2) = (c1_pos, c2_pos) for A >= 0 else (c1_neg, c2_neg), computed in log
    space and detached, so the gradient is phi(W) * A * grad log pi. `rollout_log_w` (the truncated train-inference
    log-weight) is added to log W, as the official code folds veRL's rollout IS weights. `length_norm` "sqrt" /
    "linear" divides log W by sqrt(T) / T: the paper's ablations (Sec. 4.7), not the method.
    Guards (as the official code and TRL): token log-ratios clamped to [-20, 20]; log W clamped to [log 1e-8, 20].
    """
    log_w = seq_log_ratio  # (B,) log prod_t pi/mu, computed by the core (or here when called directly)
    if log_w is None:
        log_w = _row_sum(_token_log_ratio(log_prob.detach(), old_log_prob), mask)
    if rollout_log_w is not None:
        log_w = log_w + rollout_log_w  # now log pi/pi_rollout, with the sampler part truncated
    if length_norm != "none":
        lengths = mask.sum(-1).clamp(min=1.0)  # (B,)
        log_w = log_w / (lengths.sqrt() if length_norm == "sqrt" else lengths)
    log_w = log_w.clamp(_LOG_W_MIN, _LOG_W_MAX)

    a_seq = _seq_advantage(advantages, mask)  # (B,)
    pos = a_seq >= 0
    c1 = _select(pos, c1_pos, c1_neg, log_w)
    c2 = _select(pos, c2_pos, c2_neg, log_w)
    log_phi = vespo_log_phi(log_w, c1, c2)  # (B,)
    phi = torch.exp(log_phi)  # detached: log_w was built from log_prob.detach()
    loss = log_prob * (-phi.unsqueeze(-1) * _compact(advantages))  # (B, T)

    seq_valid = mask.sum(-1) > 0
    metrics = _weight_metrics("weight", phi, a_seq, seq_valid)
    # Prop. 3.1 on the batch: E_mu[phi^2] = Z E_Q[phi] <= Z K E_Q[W] = E_mu[K phi W]; the two sides are logged.
    k_seq = _select(pos, variance_bound_K(c1_pos, c2_pos), variance_bound_K(c1_neg, c2_neg), log_w)
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


_PPO_BOUNDS = {"clip_ratio_low": "[0, 1)", "clip_ratio_high": "[0, inf)"}


@register_method("grpo", bounds={**_PPO_BOUNDS, "clip_ratio_c": ("(1, inf)", "dual clip")})
def grpo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level PPO clip with DAPO's decoupled bounds (1 - 0.2, 1 + 0.28) and dual clip c = 3 (paper Eq. 6).

    r_t = pi/mu per token; loss = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), capped at -A c for A < 0.
    """
    ratio = torch.exp(_token_log_ratio(log_prob, old_log_prob))  # (B, T)
    adv = _compact(advantages)
    loss, active, clipped, dual = _ppo_clip_loss(ratio, adv, 1 - clip_ratio_low, 1 + clip_ratio_high, clip_ratio_c)
    return loss, _token_clip_metrics(ratio, active, clipped, dual, advantages, mask)


def _token_clip_metrics(
    ratio: Tensor, active: Tensor, clipped: Tensor, dual: Tensor, advantages: Tensor, mask: Tensor
) -> dict[str, Tensor]:
    """Weight and clip metrics of a clipped token-level loss: the weight is r where the gradient flows, else 0."""
    metrics = _token_weight_metrics(ratio.detach() * active, advantages, mask)
    metrics["clip/frac"] = masked_mean(clipped, mask)
    metrics["clip/frac_lower"] = masked_mean(dual, mask)
    return metrics


def _bapo_check(hp: dict[str, object]) -> str | None:
    if not 0 < hp["ratio_lower_start"] <= hp["ratio_lower_max"] < 1:
        return (
            f"need 0 < ratio_lower_start <= ratio_lower_max < 1, got {hp['ratio_lower_start']}, {hp['ratio_lower_max']}"
        )
    if not 1 < hp["ratio_upper_start"] <= hp["ratio_upper_max"]:
        return f"need 1 < ratio_upper_start <= ratio_upper_max, got {hp['ratio_upper_start']}, {hp['ratio_upper_max']}"
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
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    adv_ratio_target: float = 1.0,
    ratio_lower_start: float = 0.6,
    ratio_lower_max: float = 0.8,
    ratio_lower_step: float = 0.05,
    ratio_upper_start: float = 1.2,
    ratio_upper_max: float = 2.0,
    ratio_upper_step: float = 0.05,
    clip_ratio_c: float = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """BAPO (Xi et al. 2025) as the authors' code (WooooDyy/BAPO, recipe/bapo/policy_loss.py) computes it.

    PPO clip with dual clip whose ratio bounds (c_low, c_high) are searched per call: the positive contribution
    sum_{A>0} min(r, c_high) A and the negative one sum_{A<0} max(r, c_low) |A| (all valid tokens, clipped ratios)
    must reach pos / (neg + 1e-8) >= `adv_ratio_target`; starting from (ratio_lower_start, ratio_upper_start),
    c_low is raised by its step up to ratio_lower_max first, then c_high up to ratio_upper_max, stopping at the
    first candidate that meets the target (else the last). Defaults: the authors' config. Each distinct bound costs
    one masked dot product over the tokens, without host syncs; the chosen bounds are in the metrics.
    """
    ratio = torch.exp(_token_log_ratio(log_prob, old_log_prob))  # (B, T)
    lows, highs = _bapo_candidates(
        ratio_lower_start, ratio_lower_max, ratio_lower_step, ratio_upper_start, ratio_upper_max, ratio_upper_step
    )
    r = ratio.detach().reshape(-1)  # (N,)
    a = (advantages * mask).reshape(-1)  # (N,) 0 on padding
    pos_a, neg_a = a.clamp(min=0.0), a.clamp(max=0.0).neg_()  # A > 0 and |A| for A < 0
    dev, dt = r.device, r.dtype
    lows_t, highs_t = torch.tensor(lows, dtype=dt, device=dev), torch.tensor(highs, dtype=dt, device=dev)
    # One masked dot product per distinct bound (<= ~20), no host sync: sum min(r, c_high) A, sum max(r, c_low) |A|.
    buf = torch.empty_like(r)
    pos_by = {h: torch.dot(torch.clamp(r, max=h, out=buf), pos_a) for h in sorted(set(highs))}
    neg_by = {lo: torch.dot(torch.clamp(r, min=lo, out=buf), neg_a) for lo in sorted(set(lows))}
    pos = torch.stack([pos_by[h] for h in highs])  # (K,) per candidate, in search order
    neg = torch.stack([neg_by[lo] for lo in lows])
    ratio_pn = torch.where(neg <= 0, math.inf, pos / (neg + _BAPO_EPS))  # (K,)
    met = ratio_pn >= adv_ratio_target
    idx = torch.where(met.any(), met.to(torch.uint8).argmax(), torch.tensor(len(lows) - 1, device=dev))
    low, high = lows_t[idx], highs_t[idx]
    loss, active, clipped, dual = _ppo_clip_loss(ratio, _compact(advantages), low, high, clip_ratio_c)
    metrics = _token_clip_metrics(ratio, active, clipped, dual, advantages, mask)
    # the ratio is inf without negative mass; its finite form pos / (pos + neg + eps) = ratio / (1 + ratio) is logged
    share = torch.where(neg <= 0, 1.0, pos / (pos + neg + _BAPO_EPS))[idx]
    metrics.update({"bapo/clip_low": low, "bapo/clip_high": high, "bapo/positive_share": share})
    return loss, metrics


def _bapo_candidates(
    low: float, low_max: float, low_step: float, high: float, high_max: float, high_step: float
) -> tuple[list[float], list[float]]:
    """The (c_low, c_high) pairs BAPO's search visits in order: c_low up to its maximum first, then c_high."""
    lows, highs = [low], [high]
    while low < low_max and low_step > 0:
        low = min(low + low_step, low_max)
        lows.append(low)
        highs.append(high)
    while high < high_max and high_step > 0:
        high = min(high + high_step, high_max)
        lows.append(low)
        highs.append(high)
    return lows, highs


@register_method("gspo", default_loss_agg_mode="seq-mean-token-mean", rollout_correction="sequence", bounds=_PPO_BOUNDS)
def gspo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): sequence ratio s = (pi/mu)^(1/|y|), clipped to [1 - 3e-4, 1 + 4e-4] (paper Eq. 7).

    Token-level stop-gradient form s_t = sg(s) * pi_t / sg(pi_t), so the gradient is s * A * mean_t grad log pi_t
    under seq-mean-token-mean. log s_t is capped at 10 (veRL).
    """
    lengths = mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    log_s = _row_sum(log_prob.detach() - old_log_prob, mask).unsqueeze(-1) / lengths  # (B, 1) mean log-ratio
    log_s_tok = torch.clamp(log_s + log_prob - log_prob.detach(), max=_GSPO_LOG_RATIO_MAX)  # (B, T)
    ratio = torch.exp(log_s_tok)
    adv = _compact(advantages)
    loss, active, clipped, _ = _ppo_clip_loss(ratio, adv, 1 - clip_ratio_low, 1 + clip_ratio_high, None)
    # clipping is decided per sequence (s and A are constant across it), so read it off any valid token
    first = (mask > 0).to(torch.uint8).argmax(-1, keepdim=True)
    weight = (ratio.detach() * active).gather(1, first).squeeze(1)  # (B,)
    metrics = _weight_metrics("weight", weight, _seq_advantage(advantages, mask), mask.sum(-1) > 0)
    metrics["clip/frac"] = masked_mean(clipped, mask)
    return loss, metrics


@register_method(
    "sapo", default_loss_agg_mode="seq-mean-token-mean", bounds={"tau_pos": "(0, inf)", "tau_neg": "(0, inf)"}
)
def sapo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (Gao et al. 2025): soft gate f(r) = sigma(tau (r - 1)) * 4 / tau per token, loss = -f(r) * A.

    tau = tau_pos for A > 0, tau_neg otherwise (as TRL / veRL). The gradient weight is f'(r) r = 4 sigma (1 - sigma) r,
    which is 1 at r = 1. Default aggregation seq-mean-token-mean, as veRL's and TRL's SAPO.
    """
    ratio = torch.exp(_token_log_ratio(log_prob, old_log_prob))  # (B, T)
    adv = _compact(advantages)
    tau = _select(adv > 0, tau_pos, tau_neg, adv)  # (B, 1) or (B, T)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = gate * (-4.0 / tau * adv)  # coefficient (B, 1) for one advantage per sequence
    g = gate.detach()
    weight = torch.mul(g, 1.0 - g).mul_(ratio.detach()).mul_(4.0)  # in place on the temporaries
    return loss, _token_weight_metrics(weight, advantages, mask)


@register_method("topr", default_loss_agg_mode="seq-mean-token-sum", rollout_correction="sequence")
def topr(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ratio_level: Literal["product", "geometric"] = "product",
) -> tuple[Tensor, dict[str, Tensor]]:
    """TOPR (Le Roux et al. 2025): weight 1 for A >= 0, sg(clip(W, 0, 1)) for A < 0; loss = -weight * A * log pi.

    `ratio_level="product"` uses W = prod_t pi/mu (the TOPR paper); "geometric" uses (prod_t pi/mu)^(1/|y|), the
    length-normalised variant. Only the sequence log W is clamped (at 0: clip(W, 0, 1) = exp(min(log W, 0)), never
    overflows), not the token log-ratios. Default aggregation seq-mean-token-sum: the paper's gradient sums
    weight * A * grad log pi over the whole sequence.
    """
    log_w = _row_sum(log_prob.detach() - old_log_prob, mask)  # (B,) unclamped sum of token log-ratios
    if ratio_level == "geometric":
        log_w = log_w / mask.sum(-1).clamp(min=1.0)
    a_seq = _seq_advantage(advantages, mask)
    weight = torch.where(a_seq >= 0, 1.0, torch.exp(log_w.clamp(max=0.0)))  # (B,)
    loss = log_prob * (-weight.unsqueeze(-1) * _compact(advantages))
    seq_valid = mask.sum(-1) > 0
    metrics = _weight_metrics("weight", weight, a_seq, seq_valid)
    neg = (a_seq < 0) & seq_valid
    # clipped: A < 0 sequences with W > 1, whose weight clip(W, 0, 1) = 1 is not W; share of the A < 0 sequences
    metrics["clip/frac"] = (neg & (log_w > 0)).sum() / neg.sum().clamp(min=1)
    return loss, metrics


def _cispo_check(hp: dict[str, object]) -> str | None:
    if hp["ratio_min"] is not None and not hp["ratio_min"] < hp["ratio_max"]:
        return f"need ratio_min < ratio_max, got {hp['ratio_min']}, {hp['ratio_max']}"
    return None


@register_method("cispo", bounds={"ratio_max": "(0, inf)", "ratio_min": "[0, inf)"}, check=_cispo_check)
def cispo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    log_ratio: Tensor | None = None,
    ratio_max: float = 5.0,
    ratio_min: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, 2025): loss = -sg(clip(r, ratio_min, ratio_max)) * A * log pi per token.

    MiniMax-M1 sets no lower bound; the upper bound 5.0 is ScaleRL's recommendation (TRL's default for CISPO).
    Unlike PPO clipping, clipped tokens keep their gradient, only their weight is capped.
    """
    if log_ratio is None:
        log_ratio = _token_log_ratio(log_prob.detach(), old_log_prob)
    ratio = torch.exp(log_ratio)  # (B, T), detached
    weight = torch.clamp(ratio, min=ratio_min, max=ratio_max)
    clipped = ratio > ratio_max if ratio_min is None else (ratio > ratio_max) | (ratio < ratio_min)
    loss = log_prob * (-weight * _compact(advantages))
    metrics = _token_weight_metrics(weight, advantages, mask)
    metrics["clip/frac"] = masked_mean(clipped, mask)
    return loss, metrics
