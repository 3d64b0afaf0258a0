"""Train-inference (rollout) correction: veRL's `algorithm.rollout_correction` catalogue as one function.

Options, with veRL's names, meanings and defaults (`verl.trainer.ppo.rollout_corr_helper`), are hyperparameters of
every method (`CORRECTION_OPTIONS`), parsed once by `parse_rollout_correction`:

- `rollout_is`: level of the IS weight pi_old / pi_rollout: "token", "sequence", None (no IS weight: rejection and
  metrics only) or "auto" (vespo's default: the level the method registered; "token" for "fold" methods).
- `rollout_is_threshold`: a float C (truncated IS, min(w, C)) or veRL's "lower_upper" string (IcePop: w set to 0
  outside [lower, upper]); default 2; None: no truncation (vespo's own value; in veRL None turns IS off).
- `rollout_rs`: comma-separated rejection criteria, each keeping a token/sequence only if its divergence statistic
  passes: "token_k1|k2|k3", "seq_sum_k1|k2|k3", "seq_mean_k1|k2|k3" (k1: the geometric-mean ratio), "seq_max_k2|k3".
  k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r with r = pi_old / pi_rollout per token.
- `rollout_rs_threshold`: one threshold per criterion (comma-separated) or one shared; k1 takes ratio bounds
  "lower_upper" (one number u means [1/u, u]), k2/k3 an upper bound.

veRL's decoupled presets are `ROLLOUT_CORRECTION_PRESETS` by veRL's names (IcePop is `decoupled_token_icepop`:
`rollout_is="token"`, `rollout_is_threshold="0.5_5.0"`); `rollout_correction_preset(name)` gives their options.
`rollout_correction` turns them into the detached weight the loss uses, the rejection mask and 0-dim metrics.
Everything is log space; no host synchronisation.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from vespo.aggregation import masked_mean
from vespo.kernels import effective_sample_size
from vespo.losses.core import (
    LOG_W_MIN,
    ROLLOUT_IS_THRESHOLD,
    TOKEN_LOG_RATIO_CLAMP,
    kl_k3,
    row_sum,
    seq_mean,
)

Tensor = torch.Tensor

CORRECTION_OPTIONS = {  # name -> vespo default (veRL's, except rollout_is: "auto" keeps each method's level)
    "rollout_is": "auto",
    "rollout_is_threshold": ROLLOUT_IS_THRESHOLD,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
}
# veRL's decoupled-mode presets (`RolloutCorrectionConfig.<name>()`, verl/trainer/config/algorithm.py, veRL 0.9.1)
# as the options above, so each is findable by veRL's name; bypass-mode presets replace the policy loss (refused).
ROLLOUT_CORRECTION_PRESETS: dict[str, dict[str, object]] = {
    "decoupled_token_is": {"rollout_is": "token", "rollout_is_threshold": 2.0},
    "decoupled_seq_is": {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
    # IcePop: token weights set to 0 outside [0.5, 5] (the response mask is unchanged)
    "decoupled_token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    "decoupled_seq_is_rs": {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_sum_k1",
                            "rollout_rs_threshold": "0.5_2.0"},
    "decoupled_geo_rs": {"rollout_is": None, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"},
    "decoupled_geo_rs_seq_tis": {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k1",
                                 "rollout_rs_threshold": "0.999_1.001"},
    "decoupled_geo_rs_token_tis": {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k1",
                                   "rollout_rs_threshold": "0.999_1.001"},
    "decoupled_k3_rs": {"rollout_is": None, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01},
    "decoupled_k3_rs_seq_tis": {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k3",
                                "rollout_rs_threshold": 0.01},
    "decoupled_k3_rs_token_tis": {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k3",
                                  "rollout_rs_threshold": 0.01},
    "disabled": {"rollout_is": None},
}  # fmt: skip


def rollout_correction_preset(name: str) -> dict[str, object]:
    """The four rollout-correction options of veRL's preset `name` (e.g. "decoupled_token_icepop"), ready to pass as
    hyperparameters of any method; one-line ValueError naming the known presets otherwise."""
    if name not in ROLLOUT_CORRECTION_PRESETS:
        raise ValueError(
            f"unknown rollout-correction preset {name!r}; veRL's decoupled presets are "
            f"{sorted(ROLLOUT_CORRECTION_PRESETS)} (bypass-mode presets replace the policy loss: not available)"
        )
    return {**CORRECTION_OPTIONS, "rollout_is_threshold": None, **ROLLOUT_CORRECTION_PRESETS[name]}


IS_LEVELS = ("auto", "token", "sequence", None)
RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip


@dataclass(frozen=True)
class RolloutCorrection:
    """Parsed options: IS level, log bounds of the IS weight and the rejection criteria (option, log-lower, upper)."""

    level: str | None  # "auto", "token", "sequence" or None
    log_upper: float  # log C (TIS) or log upper (IcePop); TOKEN_LOG_RATIO_CLAMP without truncation
    log_lower: float | None  # IcePop's log lower bound; None for truncation
    rejections: tuple[tuple[str, float | None, float], ...]  # k1: (log lower, log upper); k2/k3: (None, upper)

    @property
    def is_default(self) -> bool:
        return self == parse_rollout_correction(*CORRECTION_OPTIONS.values())


def _positive(name: str, text: object) -> float:
    """A number > 0 from a float or a float-like string; ValueError naming `name` otherwise."""
    try:
        value = float(text) if isinstance(text, str) and "_" not in text else text
    except ValueError:
        value = text
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a number > 0 or a 'lower_upper' string of such numbers, got {text!r}")
    return float(value)


def _bounds(name: str, spec: object) -> tuple[float | None, float]:
    """(lower or None, upper) from a number or a 'lower_upper' string, 0 < lower <= upper."""
    if isinstance(spec, str) and "_" in spec:
        lower_text, _, upper_text = spec.strip().partition("_")
        lower, upper = _positive(name, lower_text), _positive(name, upper_text)
        if lower > upper:
            raise ValueError(f"{name} needs lower <= upper in 'lower_upper', got {spec!r}")
        return lower, upper
    return None, _positive(name, spec)


@functools.lru_cache(maxsize=64)
def parse_rollout_correction(
    rollout_is: object, rollout_is_threshold: object, rollout_rs: object, rollout_rs_threshold: object
) -> RolloutCorrection:
    """The options checked and parsed (cached: a loss call re-reads them for free); one-line ValueError naming the
    option otherwise."""
    if rollout_is not in IS_LEVELS or not isinstance(rollout_is, (str, type(None))):
        raise ValueError(f"rollout_is must be one of {list(IS_LEVELS)}, got {rollout_is!r}")
    if rollout_is_threshold is None:
        log_lower, log_upper = None, TOKEN_LOG_RATIO_CLAMP
    else:
        lower, upper = _bounds("rollout_is_threshold", rollout_is_threshold)
        log_lower = None if lower is None else math.log(lower)
        log_upper = min(math.log(upper), TOKEN_LOG_RATIO_CLAMP)
    if rollout_rs is None:
        if rollout_rs_threshold is not None:
            raise ValueError("rollout_rs_threshold is set but rollout_rs is not: name the rejection criteria")
        return RolloutCorrection(rollout_is, log_upper, log_lower, ())
    if not isinstance(rollout_rs, str):
        raise ValueError(f"rollout_rs must be a comma-separated string of {list(RS_OPTIONS)}, got {rollout_rs!r}")
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    bad = [o for o in options if o not in RS_OPTIONS]
    if bad or not options:
        raise ValueError(f"rollout_rs options must be among {list(RS_OPTIONS)}, got {rollout_rs!r}")
    if rollout_rs_threshold is None:
        raise ValueError(f"rollout_rs={rollout_rs!r} needs rollout_rs_threshold (one per criterion, or one shared)")
    specs = (
        [s.strip() for s in rollout_rs_threshold.split(",") if s.strip()]
        if isinstance(rollout_rs_threshold, str)
        else [rollout_rs_threshold]
    )
    if len(specs) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold needs one value or {len(options)} (one per rollout_rs option), got "
            f"{rollout_rs_threshold!r}"
        )
    specs = specs * len(options) if len(specs) == 1 else specs
    rejections = []
    for option, spec in zip(options, specs, strict=True):
        lower, upper = _bounds(f"rollout_rs_threshold ({option})", spec)
        if option.endswith("k1"):
            lower = 1.0 / upper if lower is None else lower
            if lower > upper:
                raise ValueError(f"rollout_rs_threshold for {option} is a ratio bound u >= 1 ([1/u, u]), got {spec!r}")
            rejections.append((option, math.log(lower), math.log(upper)))
        elif lower is not None:
            raise ValueError(f"rollout_rs_threshold for {option} is one upper bound, not 'lower_upper': {spec!r}")
        else:
            rejections.append((option, None, upper))
    return RolloutCorrection(rollout_is, log_upper, log_lower, tuple(rejections))


def _bound(log_w: Tensor, c: RolloutCorrection) -> Tensor:
    """Truncate (min(w, C)) or, IcePop, send weights outside [lower, upper] to log 0 = -inf; log space."""
    if c.log_lower is None:
        return log_w.clamp(max=c.log_upper)
    inside = (log_w >= c.log_lower) & (log_w <= c.log_upper)
    return log_w.masked_fill(~inside, -math.inf)


def _keep(log_r: Tensor, mask: Tensor, c: RolloutCorrection) -> Tensor:
    """(B, T) bool: tokens passing every rejection criterion (a sequence criterion keeps or drops whole rows)."""
    k1 = -log_r
    stats = {"k1": k1, "k2": 0.5 * log_r.square(), "k3": kl_k3(log_r)}
    keep = torch.ones_like(mask, dtype=torch.bool)
    lengths = mask.sum(-1).clamp(min=1.0)
    for option, lower, upper in c.rejections:
        scope, stat = option.rsplit("_", 1)
        x = stats[stat]
        if scope == "seq_sum":
            x = row_sum(x, mask)[:, None]
        elif scope == "seq_mean":
            x = (row_sum(x, mask) / lengths)[:, None]
        elif scope == "seq_max":
            top = x.masked_fill(mask == 0, -math.inf).amax(-1, keepdim=True)
            x = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # empty rows: 0, as veRL
        passed = (x <= upper) if lower is None else ((x >= lower) & (x <= upper))
        keep = keep & passed
    return keep


def rollout_correction(
    old: Tensor,
    rollout: Tensor | None,
    weights: Tensor | None,
    mask: Tensor,
    options: RolloutCorrection,
    level: str,
    *,
    fold: bool,
) -> tuple[Tensor | None, Tensor | None, dict[str, Tensor]]:
    """(weight, keep, metrics) of the train-inference correction of one call; all detached.

    From the sampler's log-probs `rollout` (B, T): r = old / rollout per token, IS weight at `level` ("token": per
    token, (B, T); "sequence": prod_t r, (B, 1)), log-ratios clamped to [-20, 20] before use, truncated or
    IcePop-masked; `keep` (B, T) float 0/1 (None without rejection) the rejection mask. From an engine's ready
    `weights` (veRL's, TRL's: already truncated/masked, used as given): `level` says whether they are per token or per
    sequence; `keep` is None. `fold=False` returns the factor that multiplies the per-token loss, (B, T) or (B, 1);
    `fold=True` the sequence log-weight (B,) to add to log W (per-token log-weights floored at log 1e-8 and summed,
    a sequence weight taken once). No IS weight (no input, or rollout_is=None): weight None.
    """
    if weights is not None:
        return _ready_weights(weights, mask, level, fold)
    if rollout is None:
        return None, None, {}
    raw = old - rollout  # (B, T) log r
    log_r = raw.clamp(-TOKEN_LOG_RATIO_CLAMP, TOKEN_LOG_RATIO_CLAMP)
    metrics: dict[str, Tensor] = {}
    keep, kept = None, mask
    if options.rejections:
        keep = _keep(log_r, mask, options).to(mask.dtype)
        kept = mask * keep  # what the loss trains on; IS weights themselves use the full mask, as veRL's
        metrics["rollout_rs/masked_frac"] = 1.0 - masked_mean(keep, mask)
    if options.level is None:
        return None, keep, metrics
    if level == "token":
        out = _token_weight(raw, log_r, mask, kept, options, fold, metrics)
    else:
        out = _sequence_weight(raw, mask, kept, options, fold, metrics)
    if fold:
        metrics["rollout_is/log_w_mean"] = seq_mean(out, kept)
    return out, keep, metrics


def _token_weight(
    raw: Tensor, log_r: Tensor, mask: Tensor, kept: Tensor, options: RolloutCorrection, fold: bool, metrics: dict
) -> Tensor:
    """Per-token IS weight min(r, C) (or IcePop-masked r) from log r: the loss factor (B, T), or folded, the
    sequence's sum of per-token log-weights floored at log 1e-8 (B,); its metrics added to `metrics`."""
    log_w = _bound(log_r, options)  # (B, T)
    if options.log_lower is None:  # truncated
        metrics["rollout_is/frac_truncated"] = masked_mean(raw > options.log_upper, mask)
    else:
        metrics["rollout_is/masked_frac"] = masked_mean(log_w == -math.inf, mask)
    metrics["rollout_is/ess"] = _ess(log_w.flatten(), (kept > 0).flatten())
    if fold:
        return row_sum(log_w.clamp(min=LOG_W_MIN), kept)  # (B,)
    out = torch.exp(log_w)
    metrics["rollout_is/mean"] = masked_mean(out, mask)
    return out


def _sequence_weight(
    raw: Tensor, mask: Tensor, kept: Tensor, options: RolloutCorrection, fold: bool, metrics: dict
) -> Tensor:
    """Sequence IS weight min(prod_t r, C) (or IcePop-masked): the loss factor (B, 1), or folded, its log floored at
    log 1e-8, once per sequence (B,); its metrics added to `metrics`."""
    log_s = row_sum(raw, mask).clamp(-TOKEN_LOG_RATIO_CLAMP, TOKEN_LOG_RATIO_CLAMP)  # (B,)
    log_w = _bound(log_s, options)
    seq_valid = mask.sum(-1) > 0
    n = seq_valid.sum().clamp(min=1)
    if options.log_lower is None:  # truncated
        metrics["rollout_is/frac_truncated"] = ((log_s > options.log_upper) & seq_valid).sum() / n
    else:
        metrics["rollout_is/masked_frac"] = ((log_w == -math.inf) & seq_valid).sum() / n
    metrics["rollout_is/ess"] = _ess(log_w, kept.sum(-1) > 0)
    if fold:
        return log_w.clamp(min=LOG_W_MIN)  # (B,), once per sequence
    out = torch.exp(log_w).unsqueeze(-1)  # (B, 1)
    metrics["rollout_is/mean"] = (out[:, 0] * seq_valid).sum() / n
    return out


def _ess(log_w: Tensor, valid: Tensor) -> Tensor:
    """Normalised Kish ESS of the applied rollout weights over the valid entries; 0 when every weight is 0."""
    return torch.nan_to_num(effective_sample_size(log_w, valid), nan=0.0)


def _ready_weights(
    weights: Tensor, mask: Tensor, level: str | None, fold: bool
) -> tuple[Tensor, None, dict[str, Tensor]]:
    """An engine's ready weights: as given for the loss factor, or their log folded into W (per-token weights: the
    sum of their logs; a sequence weight, (B, 1) or broadcast along the row: its log once, not T times)."""
    seq_valid = mask.sum(-1) > 0
    if level == "sequence" or weights.shape != mask.shape:
        w_seq = (
            weights[:, 0]
            if weights.shape[-1] == 1
            else weights.gather(1, (mask > 0).to(torch.uint8).argmax(-1, keepdim=True))[:, 0]
        )  # (B,)
        metrics = {
            "rollout_is/ess": _ess(torch.log(w_seq), seq_valid),
            "rollout_is/masked_frac": ((w_seq == 0) & seq_valid).sum() / seq_valid.sum().clamp(min=1),
        }
    else:
        metrics = {
            "rollout_is/ess": _ess(torch.log(weights).flatten(), (mask > 0).flatten()),
            "rollout_is/masked_frac": masked_mean(weights == 0, mask),
        }
    if not fold:
        if weights.shape == mask.shape:
            metrics["rollout_is/mean"] = masked_mean(weights, mask)
        else:
            valid = seq_valid.to(weights.dtype)[:, None]
            metrics["rollout_is/mean"] = (weights * valid).sum() / valid.sum().clamp(min=1.0)
        return weights, None, metrics
    if level == "token":
        log_w = row_sum(torch.log(weights.clamp(min=1e-8)).clamp(max=TOKEN_LOG_RATIO_CLAMP), mask)
    else:
        log_w = torch.log(w_seq.clamp(min=1e-8)).clamp(max=TOKEN_LOG_RATIO_CLAMP)
    metrics["rollout_is/log_w_mean"] = seq_mean(log_w, mask)
    return log_w, None, metrics
