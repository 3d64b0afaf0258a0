"""Entry points of the loss library: `compute_policy_loss` (scalar loss) and `policy_loss_terms` (loss matrix),
with the input value checks (one fused test, one host sync; `PolicyBatch` checks the structure when built).

Every method is a pure function registered with `register_method`:

    fn(log_prob, old_log_prob, advantages, mask, *, **hparams) -> (loss_mat, metrics)

of float tensors of shape (B, T) (`advantages` is a (B, T) view, constant along a row, stride 0, when the caller
gave one advantage per sequence; `mask` is float 0/1), returning the per-token loss matrix and a dict of 0-dim
detached metric tensors. A method declares the optional inputs it takes in `register_method(inputs=...)`
(`registry.OPTIONAL_INPUTS`), each a keyword of its signature defaulting to None (a direct call computes its own):
`rollout_log_w` (B,), the log of the sequence's train-inference IS weight to fold into its own W (the methods
registered with `rollout_correction="fold"`, and only they); `log_ratio` (B, T) (detached log(pi/mu), clamped to
[-20, 20]) and `seq_log_ratio` (B,) (its masked row sum, log W), computed once per call; `rollout_log_prob`, the
sampler's log-probs as given; `batch_context`, the statistics of the whole mini-batch the batch-adaptive methods
(`vespo.losses.adaptive`) decide from, passed through unchanged.
Gradients flow into `log_prob` only. Hyperparameters are keyword-only arguments with the paper defaults; they are
checked once, by `validate_hparams`, before the function runs, never inside it. Normalisation lives in
`vespo.aggregation`.

Train-inference mismatch is corrected here, once, for every method, by `vespo.losses.correction`: the caller passes
the sampler's log-probs (`rollout_log_prob`) or an engine's ready weights (`rollout_is_weights`, what veRL and TRL hand
over). From log-probs, the four rollout-correction hyperparameters every method has (veRL's names: `rollout_is`,
`rollout_is_threshold`, `rollout_rs`, `rollout_rs_threshold`) give the IS weight and the rejection mask; the method's
registered `rollout_correction` says how the weight applies: "token" multiplies each token's loss by min(r, C),
"sequence" by min(prod_t r, C), "fold" passes the sequence's log-weight to the method (VESPO: W = pi/mu *
prod_t min(r, C), as the official code), with r = mu/pi_rollout and C = `rollout_is_threshold` (default 2, veRL's,
which the official VESPO code receives). Rejected tokens are removed from the mask the method sees and contribute 0.

Every method also takes `kl_tau` (default 0, off): Kimi K2.5's squared log-ratio penalty kl_tau * (log pi/mu)^2,
added by the core to each valid token's loss (log pi/mu clamped to +-20; prime-rl's name and default loss, 1e-3).

The public entry points are `compute_policy_loss` (scalar loss and 0-dim metric tensors, from keyword tensors) and
`policy_loss_terms` (loss matrix of a `PolicyBatch`, for engines that aggregate themselves). The batch checks its
structure when built; both check values with one fused test (one host synchronisation); `validate=False` skips it
for engines that validated upstream (padding must then be finite).

Notation: pi = current policy (log_prob), mu = behaviour policy the weights are taken against (old_log_prob),
pi_rollout = the inference engine that sampled (rollout_log_prob, train-inference mismatch).
Every method reduces to REINFORCE, -A * log pi, when log_prob == old_log_prob and no rollout correction is given.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import replace
from typing import Literal

import torch

from vespo.aggregation import LOSS_AGG_MODES, agg_loss
from vespo.losses.core import LOG_PROB_MAX, BatchContext, PolicyBatch, ratio_metrics, row_sum, token_log_ratio
from vespo.losses.correction import (
    CORRECTION_OPTIONS,
    RolloutCorrection,
    parse_rollout_correction,
    rollout_correction,
)
from vespo.losses.registry import MethodSpec, default_loss_agg_mode, get_method, validate_hparams

Tensor = torch.Tensor


def policy_loss_terms(
    method: str,
    batch: PolicyBatch,
    *,
    allow_empty_rows: bool = False,
    validate: bool = True,
    batch_context: BatchContext | None = None,
    **hparams: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`method`'s per-token loss matrix (B, T) on `batch`, rollout correction applied, and its 0-dim detached metric
    tensors.

    Train-inference correction (`PolicyBatch`): the sampler's log-probs `rollout_log_prob`, or an engine's ready,
    already truncated `rollout_is_weights`, per token or per sequence. Ready weights multiply the loss as given (as
    veRL's and TRL's own losses do) except for "fold" methods, which need `rollout_is_level` to fold them into W.
    `allow_empty_rows=True` lets rows with no valid token through (they contribute exactly zero); by default such a
    row is an error, since it usually means a masking bug upstream. `validate=False` skips the value checks (one
    fused test, one host sync): for engines that validated upstream; padding must then be finite. Padding entries of
    the returned matrix are unspecified: aggregate with the mask.
    """
    spec = get_method(method)
    hp = validate_hparams(method, **hparams)
    options = parse_rollout_correction(*(hp.pop(k) for k in CORRECTION_OPTIONS))
    kl_tau = hp.pop("kl_tau")
    _check_call(method, spec, batch, batch_context)
    fold = spec.rollout_correction == "fold"
    b = batch.cast()
    if validate:
        b = _checked(b, not batch.response_mask.is_floating_point(), allow_empty_rows, fold)
    lp, old, mask = b.log_prob, b.old_log_prob, b.response_mask
    adv = b.token_advantages()

    level = _correction_level(spec, b, options)
    correction, keep, ro_metrics = rollout_correction(
        old, b.rollout_log_prob, b.rollout_is_weights, mask, options, level, fold=fold
    )
    if keep is not None:  # rejection sampling: rejected tokens leave W, the loss and the metrics
        mask = mask * keep
    log_ratio = token_log_ratio(lp.detach(), old)  # (B, T), shared by the metrics and the methods that take it
    inputs = {  # the optional inputs (`registry.OPTIONAL_INPUTS`); each method gets those it declared
        "rollout_log_w": correction,  # declared by "fold" methods only
        "log_ratio": log_ratio,
        "seq_log_ratio": row_sum(log_ratio, mask),
        "batch_context": batch_context,
        "rollout_log_prob": b.rollout_log_prob,
    }
    loss_mat, metrics = spec.fn(lp, old, adv, mask, **{k: inputs[k] for k in spec.inputs}, **hp)
    if not fold and correction is not None:
        loss_mat = loss_mat * correction  # (B, T) or (B, 1), detached
    if kl_tau > 0:
        loss_mat, metrics["kl_tau/log_ratio_sq"] = _kl_tau_penalty(loss_mat, lp, old, mask, kl_tau)
    if keep is not None:
        loss_mat = loss_mat * keep  # rejected tokens contribute exactly 0 (the caller's normaliser is unchanged)
    metrics.update(ro_metrics)
    metrics.update(ratio_metrics(inputs["seq_log_ratio"], adv, mask))
    return loss_mat, metrics


def _checked(b: PolicyBatch, binary: bool, allow_empty_rows: bool, fold: bool) -> PolicyBatch:
    """`b` after the fused value test (`_check_values`), its padding zeroed where it holds NaN/inf."""
    if _check_values(
        b.log_prob, b.old_log_prob, b.advantages, b.response_mask, b.rollout_log_prob, b.rollout_is_weights,
        binary=binary, allow_empty_rows=allow_empty_rows, sequence_weights=fold and b.rollout_is_level == "sequence",
    ):  # fmt: skip
        return _zero_padding(b)
    return b


def _check_call(method: str, spec: MethodSpec, batch: PolicyBatch, batch_context: BatchContext | None) -> None:
    """The call's inputs fit the method: `batch_context` only for a method that declared it (and built by
    `batch_context`), ready rollout IS weights of a "fold" method with their level."""
    if batch_context is not None and "batch_context" not in spec.inputs:
        raise ValueError(f"{method!r} does not use mini-batch statistics; pass batch_context=None")
    if batch_context is not None:
        if not isinstance(batch_context, BatchContext):
            raise ValueError(
                "batch_context must be a vespo.losses.BatchContext (vespo.losses.batch_context builds one) or None, "
                f"got {type(batch_context).__name__}"
            )
        batch_context.check(batch.log_prob.device)
    fold = spec.rollout_correction == "fold"
    if fold and batch.rollout_is_weights is not None and batch.rollout_is_level is None:
        raise ValueError(
            f"{method!r} folds the rollout IS weight into its sequence weight W and must know whether the weights "
            "are per 'token' or per 'sequence': set rollout_is_level"
        )


def _correction_level(spec: MethodSpec, b: PolicyBatch, options: RolloutCorrection) -> str:
    """Whether the train-inference weight applies per "token" or per "sequence": ready weights at their own level,
    else the options' level, else ("auto") the method's registered one."""
    if b.rollout_is_weights is not None:
        if not options.is_default:
            raise ValueError(
                "rollout-correction options (rollout_is, rollout_is_threshold, rollout_rs, rollout_rs_threshold) "
                "apply to rollout_log_prob; rollout_is_weights come corrected by the engine: configure it there"
            )
        return b.rollout_is_level or "token"
    if options.level in ("token", "sequence"):
        return options.level
    return "sequence" if spec.rollout_correction == "sequence" else "token"  # "auto" (and None: no weight)


def _kl_tau_penalty(loss_mat: Tensor, lp: Tensor, old: Tensor, mask: Tensor, kl_tau: float) -> tuple[Tensor, Tensor]:
    """Kimi K2.5's squared log-ratio penalty kl_tau * (log pi/mu)^2 added to every valid token's loss (prime-rl:
    the DPPO-masked ones too), and its mean over the valid tokens (detached)."""
    sq = token_log_ratio(lp, old).square()  # (B, T), gradient 2 kl_tau log(pi/mu) grad log pi
    mean = (row_sum(sq.detach(), mask).sum() / mask.sum().clamp(min=1.0)).detach()
    return loss_mat + kl_tau * sq, mean


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
    (B, T); the tensors are the fields of `PolicyBatch`. `loss_agg_mode=None` uses the method's own default
    (`default_loss_agg_mode`). `global_num_tokens` / `global_num_seqs` (> 0) normalise by the whole mini-batch when
    this call sees one micro-batch. Hyperparameters are keyword arguments with the paper defaults
    (`method_hparams(method)`); `allow_empty_rows` and `validate` as in `policy_loss_terms`; `batch_context`
    (mini-batch statistics for the batch-adaptive methods, `vespo.adaptive.batch_context`) makes a micro-batch call
    decide as the whole mini-batch.
    """
    mode = default_loss_agg_mode(method) if loss_agg_mode is None else loss_agg_mode
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {list(LOSS_AGG_MODES)}")
    counts = {"global_num_tokens": global_num_tokens, "global_num_seqs": global_num_seqs}
    for name, value in counts.items():
        _check_count(name, value, validate)
    batch = PolicyBatch(
        log_prob, old_log_prob, advantages, response_mask, rollout_log_prob, rollout_is_weights, rollout_is_level
    )
    loss_mat, metrics = policy_loss_terms(
        method, batch, allow_empty_rows=allow_empty_rows, validate=validate, batch_context=batch_context, **hparams
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
    b = PolicyBatch(ref, old_log_prob, advantages, response_mask, rollout_log_prob).cast()
    if _check_values(
        None if log_prob is None else b.log_prob, b.old_log_prob, b.advantages, b.response_mask, b.rollout_log_prob,
        None, binary=not response_mask.is_floating_point(), allow_empty_rows=allow_empty_rows, sequence_weights=False,
    ):  # fmt: skip
        raise ValueError("log-probs or advantages contain NaN or inf in the padding (masked-out positions)")


# --------------------------------------------------------------------------------------------------------------------
# Input checks: values (one fused test, `validate=True`); the structure is `PolicyBatch`'s


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
    logps = {"log_prob": log_prob, "old_log_prob": old_log_prob, "rollout_log_prob": rollout_log_prob}
    shape = (binary, allow_empty_rows, sequence_weights)
    if _values_pass(logps, advantages, mask, rollout_is_weights, *shape):  # the one host sync
        return False
    _raise_at_valid_positions(logps, advantages, mask, rollout_is_weights, allow_empty_rows, sequence_weights)
    full = [t for t in (log_prob, old_log_prob, rollout_log_prob, advantages, rollout_is_weights) if t is not None]
    return any(not bool(torch.isfinite(t.detach()).all()) for t in full)


def _values_pass(
    logps: dict[str, Tensor | None],
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor | None,
    binary: bool,
    allow_empty_rows: bool,
    sequence_weights: bool,
) -> bool:
    """The fast test: every condition over all positions with cheap reductions, fused into one host sync."""
    flags = []
    for t in logps.values():
        if t is not None:
            lo, hi = torch.aminmax(t.detach())
            flags.append((lo > -math.inf) & (hi <= LOG_PROB_MAX))  # NaN fails both comparisons
    flags.append(torch.isfinite(advantages.sum()))  # overflow of a finite sum only sends us to the exact check
    if weights is not None:
        lo, hi = torch.aminmax(weights)
        flags.append((lo >= 0) & (hi < math.inf))
        if sequence_weights and weights.shape == mask.shape:
            flags.append(_row_spread(weights, mask) <= 1e-6)
    if binary:  # bool or integer: binary exactly when within [0, 1]
        lo, hi = torch.aminmax(mask)
        flags.append((lo >= 0) & (hi <= 1))
    else:  # a float mask is compared exactly: 1e-30 padding is not 0 (m * m underflows, so a sum test misses it)
        flags.append(((mask == 0) | (mask == 1)).all())
    if not allow_empty_rows:
        flags.append((mask.sum(-1) > 0).all())
    return bool(torch.stack(flags).all())


def _raise_at_valid_positions(
    logps: dict[str, Tensor | None],
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor | None,
    allow_empty_rows: bool,
    sequence_weights: bool,
) -> None:
    """The slow path (the fast test failed): a one-line ValueError naming the first input bad at a valid position;
    returns when only the padding is off."""
    valid = mask > 0
    lengths = mask.sum(-1)  # (B,)
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
    if weights is None:
        return
    w = (weights if weights.shape == mask.shape else weights.expand(mask.shape))[valid]
    if not bool((torch.isfinite(w) & (w >= 0)).all()):
        raise ValueError("rollout_is_weights must be finite and >= 0 at valid positions")
    if sequence_weights and weights.shape == mask.shape:
        if not bool(_row_spread(torch.where(valid, weights, 0.0), mask) <= 1e-6):
            raise ValueError(
                "rollout_is_level is 'sequence' but rollout_is_weights vary along a sequence: they are "
                "token-level weights, set rollout_is_level='token'"
            )


def _zero_padding(b: PolicyBatch) -> PolicyBatch:
    """`b` with NaN/inf in its padding zeroed (valid positions were checked), so that 0 * NaN cannot reach a sum."""
    valid = b.response_mask > 0
    row_valid = valid.any(-1, keepdim=True)  # (B, 1), for per-sequence inputs of empty rows

    def clean(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        return torch.where(valid if t.shape == valid.shape else row_valid.reshape(t.shape), t, 0.0)

    fields = ("log_prob", "old_log_prob", "advantages", "rollout_log_prob", "rollout_is_weights")
    return replace(b, **{name: clean(getattr(b, name)) for name in fields})


def _row_spread(w: Tensor, mask: Tensor) -> Tensor:
    """Largest relative deviation of `w` (B, T) from its row's first valid value, over valid positions."""
    first = w.gather(1, (mask > 0).to(torch.uint8).argmax(-1, keepdim=True))  # (B, 1)
    return ((w - first).abs() * mask).amax() / first.abs().amax().clamp(min=1.0)


# --------------------------------------------------------------------------------------------------------------------
# Shared pieces: reductions, rollout correction, metrics
