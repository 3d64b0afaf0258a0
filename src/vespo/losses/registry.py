"""The policy-loss registry: one entry per method, with its hyperparameters, their checks and how the method applies
the train-inference correction. `register_method` adds one; every other module asks the registry, never a list.
"""

from __future__ import annotations

import inspect
import math
import numbers
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from vespo.aggregation import LOSS_AGG_MODES
from vespo.intervals import Interval
from vespo.losses.correction import CORRECTION_OPTIONS, parse_rollout_correction

Tensor = torch.Tensor
LossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]
ROLLOUT_CORRECTIONS = ("token", "sequence", "fold")
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # a float hyperparameter reaches float32 tensors: bounded by it
FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)  # smallest normal float32; below it precision is lost


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its function, defaults and checks (`register_method` builds it)."""

    fn: LossFn
    default_loss_agg_mode: str
    rollout_correction: str  # "token" | "sequence" | "fold"
    inputs: frozenset[str]  # the core's optional inputs (`OPTIONAL_INPUTS`) the method declared it takes
    hparams: dict[str, object]  # name -> default
    kinds: dict[str, object]  # name -> type annotation (float, int, str, bool, Literal[...], float | None)
    bounds: dict[str, Interval]
    check: Callable[[dict[str, object]], str | None] | None


_REGISTRY: dict[str, MethodSpec] = {}
# Keyword inputs (not hyperparameters) the core passes to a method that declares them in `register_method(inputs=)`,
# computed once per call; each defaults to None in the method's signature (a direct call computes its own):
OPTIONAL_INPUTS = (
    "rollout_log_w",  # (B,) or None: log of the train-inference weight to fold into W ("fold" methods only)
    "log_ratio",  # (B, T) detached log(pi/mu) per token, clamped to [-20, 20]
    "seq_log_ratio",  # (B,) masked row sum of `log_ratio`: log W with the per-token guard
    "batch_context",  # caller-supplied mini-batch statistics (`vespo.adaptive.BatchContext`) or None
    "rollout_log_prob",  # (B, T) or None: the sampler's log-probs as given, for a method that measures its divergence
)
# Hyperparameters every method has, applied by the core (not passed to the method function).
# The rollout-correction options (veRL's names, `vespo.losses.correction`) are checked by their parser.
_COMMON_HPARAMS: dict[str, object] = dict(CORRECTION_OPTIONS)
# The squared log-ratio penalty any method carries, added by the core: kl_tau * (log pi/mu)^2 per token (Kimi K2.5,
# arXiv 2602.02276; prime-rl's `kl_tau`, 1e-3 in its default loss). 0 = off.
PENALTY_HPARAMS: dict[str, tuple[float, Interval]] = {
    "kl_tau": (0.0, Interval("[0, 1e6]", "Kimi K2.5's tau, 1e-3; (log pi/mu)^2 <= 400 keeps the term finite")),
}


def register_method(
    name: str,
    *,
    default_loss_agg_mode: str = "token-mean",
    rollout_correction: Literal["token", "sequence", "fold"] = "token",
    inputs: tuple[str, ...] = (),
    bounds: dict[str, str | tuple[str, str]] | None = None,
    check: Callable[[dict[str, object]], str | None] | None = None,
) -> Callable[[LossFn], LossFn]:
    """Register a policy-loss function under `name`; registering a name twice raises (no silent overwrite).

    The function's keyword-only arguments are its hyperparameters: their defaults are the paper's, their annotations
    (float, int, str, bool, `Literal[...]`, `float | None`) the accepted types. `bounds` maps a
    hyperparameter to its allowed interval, "(0, inf)" or ("[0, 1)", "why"); `check(hparams)` returns a message for
    constraints between hyperparameters (or None). `validate_hparams` applies all of them. `default_loss_agg_mode`
    is the aggregation of the method's primary source; `rollout_correction` how the sampler ratio applies (see the
    module docstring). `inputs` names the optional inputs (`OPTIONAL_INPUTS`) the core passes the method, each a
    keyword of its signature defaulting to None; "fold" methods declare `rollout_log_w`.
    """
    if default_loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown default_loss_agg_mode {default_loss_agg_mode!r}")
    if rollout_correction not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"rollout_correction must be one of {ROLLOUT_CORRECTIONS}, got {rollout_correction!r}")

    def decorator(fn: LossFn) -> LossFn:
        if name in _REGISTRY:
            raise ValueError(f"policy loss {name!r} is already registered")
        params = inspect.signature(fn).parameters
        _check_inputs(name, inputs, params, rollout_correction)
        hints = typing.get_type_hints(fn)
        hp = {k: p.default for k, p in params.items() if p.kind == p.KEYWORD_ONLY and k not in inputs}
        clash = sorted(set(hp) & (set(_COMMON_HPARAMS) | set(PENALTY_HPARAMS)))
        if clash:
            raise ValueError(f"{name!r}: {clash} are applied by the core for every method; do not declare them")
        kinds = {k: hints.get(k, object) for k in hp}
        parsed = {k: Interval(*((v,) if isinstance(v, str) else v)) for k, v in (bounds or {}).items()}
        stray = sorted(set(parsed) - set(hp))
        if stray:
            raise ValueError(f"bounds given for {stray}, which are not hyperparameters of {name!r}")
        for k, default in _COMMON_HPARAMS.items():
            hp[k], kinds[k] = default, object
        for k, (default, interval) in PENALTY_HPARAMS.items():
            hp[k], kinds[k], parsed[k] = default, float, interval
        spec = MethodSpec(fn, default_loss_agg_mode, rollout_correction, frozenset(inputs), hp, kinds, parsed, check)
        _REGISTRY[name] = spec
        return fn

    return decorator


_KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _check_inputs(name: str, inputs: tuple[str, ...], params: dict[str, inspect.Parameter], correction: str) -> None:
    """The declared optional inputs are known, keywords of the signature defaulting to None, and the only names of
    `OPTIONAL_INPUTS` there (a keyword that merely shares a name gets no value: declare it or rename it)."""
    unknown = sorted(set(inputs) - set(OPTIONAL_INPUTS))
    if unknown:
        raise ValueError(f"{name!r}: unknown inputs {unknown}; the core passes {list(OPTIONAL_INPUTS)}")
    missing = [k for k in inputs if k not in params or (params[k].kind, params[k].default) != (_KEYWORD, None)]
    if missing:
        raise ValueError(f"{name!r}: declared inputs {missing} must be keyword-only parameters defaulting to None")
    undeclared = sorted(set(OPTIONAL_INPUTS) & set(params) - set(inputs))
    if undeclared:
        raise ValueError(f"{name!r}: {undeclared} are the core's optional inputs; declare them in inputs=")
    if ("rollout_log_w" in inputs) != (correction == "fold"):
        raise ValueError(f"{name!r}: a method takes `rollout_log_w` exactly when rollout_correction='fold'")


def available_methods() -> list[str]:
    """Names of all registered policy-loss methods, sorted."""
    return sorted(_REGISTRY)


def method_hparams(method: str) -> dict[str, object]:
    """The hyperparameters `method` accepts, with their (paper) defaults."""
    return dict(get_method(method).hparams)


def default_loss_agg_mode(method: str) -> str:
    """The aggregation `method`'s primary source uses (used when `loss_agg_mode=None`); docs/methods/index.md cites
    each."""
    return get_method(method).default_loss_agg_mode


def rollout_correction(method: str) -> str:
    """How `method` applies the train-inference IS ratio: "token", "sequence" or "fold" (into its W)."""
    return get_method(method).rollout_correction


def validate_hparams(method: str, **hparams: object) -> dict[str, object]:
    """Check hyperparameter names, types and values of `method`; return all of them (defaults filled in).

    The one place hyperparameters are checked: the losses call it once per call, configs when they are built, and
    the TRL/veRL adapters when theirs are. Raises a one-line ValueError naming the hyperparameter and what is
    accepted. Ints are accepted (and returned as floats) where a float is annotated.
    """
    spec = get_method(method)
    unknown = sorted(set(hparams) - set(spec.hparams))
    if unknown:
        raise ValueError(f"{method!r} got unknown hyperparameter(s) {unknown}; it accepts {sorted(spec.hparams)}")
    out = dict(spec.hparams)
    for name, value in hparams.items():
        out[name] = _check_type(method, name, value, spec.kinds[name], spec.bounds.get(name))
    for name, interval in spec.bounds.items():
        value = out[name]
        if value is not None and not interval.contains(value):
            why = f" ({interval.reason})" if interval.reason else ""
            raise ValueError(
                f"{method} hyperparameter {name} must be in {interval.text}{why}, got {hparams.get(name)!r}"
            )
    try:
        parse_rollout_correction(*(out[k] for k in _COMMON_HPARAMS))
    except ValueError as exc:
        raise ValueError(f"{method} hyperparameter {exc}") from None
    except TypeError:  # unhashable value (a list, a dict)
        bad = {k: out[k] for k in _COMMON_HPARAMS if not isinstance(out[k], (str, int, float, type(None)))}
        raise ValueError(
            f"{method} hyperparameters {sorted(bad)} must be strings, numbers or None, got {bad}"
        ) from None
    if spec.check is not None:
        problem = spec.check(out)
        if problem:
            raise ValueError(f"{method} hyperparameters: {problem}")
    return out


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_type(method: str, name: str, value: object, kind: object, interval: Interval | None = None) -> object:
    """`value` if it has the annotated type (ints are accepted for floats), else ValueError. A float must be what it
    will be in the float32 tensors it reaches (0 or a normal float32; inf only where its interval is closed at inf)."""
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
        if _is_real(value) and math.isinf(value) and interval is not None and interval.contains(value):
            return float(value)  # an interval closed at inf accepts it (vespo_selfnorm's max_gain: no cap)
        if not _is_real(value) or not math.isfinite(value):
            raise ValueError(f"{where} must be a finite real number, got {value!r}")
        outside = interval is not None and not interval.contains(value)  # the range's own message is more precise
        if value != 0 and not FLOAT32_TINY <= abs(value) <= FLOAT32_MAX and not outside:
            raise ValueError(
                f"{where} must be 0 or a float32 number, {FLOAT32_TINY:.3g} <= |x| <= {FLOAT32_MAX:.4g} (it reaches "
                f"float32 tensors, where it would round to {'inf' if abs(value) > 1 else '0 or lose its precision'}), "
                f"got {value!r}"
            )
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


def parse_hparam(method: str, name: str, text: str) -> object:
    """A command-line hyperparameter value typed by the method's own annotation: "None"/"null" is None where None is
    accepted, numbers where a number is, "true"/"false" for a bool; the rollout-correction options keep their text
    (veRL's "lower_upper" thresholds, which a number parser would read as 0.55 for "0.5_5"). Text that does not
    parse is returned as is, for `validate_hparams` to refuse with its one-line message."""
    spec = get_method(method)
    kind = spec.kinds.get(name, object)
    args = typing.get_args(kind)
    if text in ("None", "null") and (kind is object or type(None) in args):
        return None
    if type(None) in args:
        kind = next(a for a in args if a is not type(None))
    try:
        if kind is float:
            return float(text)
        if kind is int:
            return int(text)
    except ValueError:
        return text
    if kind is bool and text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def get_method(method: str) -> MethodSpec:
    if method not in _REGISTRY:
        raise ValueError(f"unknown policy-loss method {method!r}; known methods: {available_methods()}")
    return _REGISTRY[method]


# --------------------------------------------------------------------------------------------------------------------
# Public entry points


def uses_rollout_log_prob(method: str) -> bool:
    """Whether `method` reads the sampler's log-probs themselves (it declares `rollout_log_prob`: OPSM's divergence
    from the engine that sampled), beyond the train-inference correction the core applies."""
    return "rollout_log_prob" in get_method(method).inputs


def uses_batch_context(method: str) -> bool:
    """Whether `method` decides from mini-batch statistics (it declares `batch_context`; pass it a
    `vespo.losses.adaptive.BatchContext` per micro-batch)."""
    return "batch_context" in get_method(method).inputs
