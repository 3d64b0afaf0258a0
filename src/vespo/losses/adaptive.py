"""Adaptive VESPO: the kernel phi(W) = g * W^c1 exp(c2 (1 - W)) with (c1, c2, g) chosen per mini-batch and sign of A.

The paper fixes (c1, c2) = (2, 3) for A >= 0 and (3, 2) for A < 0 and names adaptive schemes as its open direction
(Appendix "Limitations and Future Directions"). Its derivation (Sec. 3.2, Eqs. moment-constraint to gamma-kernel)
says what c2 is: lambda, the Lagrange multiplier of the moment constraint E_Q[W] <= C, with Q proportional to
mu * phi(W). Four registered methods choose the kernel from the batch; every one is exactly `vespo` when its control
is inactive, REINFORCE on-policy (W = 1 gives phi = 1 and every controller inactive), and phi stays detached.

- `vespo_moment`: per sign, the smallest c2 >= the paper's c2 with sum_i phi_i W_i / sum_i phi_i <= C (the
  self-normalised E_Q[W], decreasing in c2: d/dc2 = -Var_Q[W]); 1-D bisection in log c2 (complementary slackness:
  lambda grows only while the constraint binds).
- `vespo_ess`: per sign, phi^tau = W^(tau c1) exp(tau c2 (1 - W)) with the largest tau in [1/c1, 1] whose Kish ESS
  over the group is >= the target (ESS of w^tau decreases in tau); tau >= 1/c1 keeps c1 >= 1 (Prop. 3.1's K finite).
- `vespo_selfnorm`: phi / Z with Z = mean of phi over the sign group (or the whole batch), gain capped at `max_gain`.
- `vespo_schedule`: c2 grows linearly with the index k of the mini-batch (k = 0..N-1; N = `num_mini_batches`).

Decisions use the statistics of the whole mini-batch when the caller passes a `BatchContext` (`batch_context`), so
a mini-batch split into micro-batches gets exactly the gradient of one pass; without one, the call's own batch is
the mini-batch. All controllers are fixed-iteration tensor bisections: no host synchronisation.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Literal

import torch

from vespo.kernels import effective_sample_size, kernel_range_problem, vespo_log_phi
from vespo.losses.core import (
    LOG_W_MAX,
    LOG_W_MIN,
    BatchContext,
    PolicyBatch,
    compact_advantages,
    row_sum,
    seq_advantage,
    seq_log_ratio,
    token_log_ratio,
    top_share,
    trust_region_m2,
    weight_metrics,
)
from vespo.losses.correction import CORRECTION_OPTIONS, parse_rollout_correction, rollout_correction
from vespo.losses.registry import register_method

Tensor = torch.Tensor
_BISECT_ITERS = 40  # bisection halves the bracket 40 times: ~1e-12 of its width, far below float32 resolution


def batch_context(
    batch: PolicyBatch,
    *,
    mini_batch_index: int | None = None,
    num_mini_batches: int | None = None,
    **correction: object,
) -> BatchContext:
    """The `BatchContext` of a whole mini-batch `batch`, log W computed the way the loss computes it (token
    log-ratios clamped to +-20, summed, plus the folded rollout log-weight from `rollout_log_prob` under the
    rollout-correction options in `correction` (`CORRECTION_OPTIONS`, rejected tokens left out), or from an
    engine's ready `rollout_is_weights` at `rollout_is_level`), and M2PO's trust-region M2 of its tokens. Detached."""
    b = batch.cast()
    mask, weights = b.response_mask, b.rollout_is_weights
    fold = None
    if b.rollout_log_prob is not None or weights is not None:
        options = parse_rollout_correction(*(correction.get(k, d) for k, d in CORRECTION_OPTIONS.items()))
        if weights is not None and b.rollout_is_level is None:
            raise ValueError("rollout_is_weights need rollout_is_level 'token' or 'sequence': None")
        level = b.rollout_is_level if weights is not None else options.level
        level = level if level in ("token", "sequence") else "token"
        fold, keep, _ = rollout_correction(b.old_log_prob, b.rollout_log_prob, weights, mask, options, level, fold=True)
        mask = mask if keep is None else mask * keep
    log_ratio = token_log_ratio(b.log_prob.detach(), b.old_log_prob)  # (M, T)
    log_w = row_sum(log_ratio, mask)  # (M,) = `seq_log_ratio`
    if fold is not None:
        log_w = log_w + fold
    adv = b.token_advantages()
    m2 = trust_region_m2(log_ratio, compact_advantages(adv), mask)  # (M, T)
    return BatchContext(log_w, seq_advantage(adv, mask), mask.sum(-1) > 0, mini_batch_index, num_mini_batches, m2)


# --------------------------------------------------------------------------------------------------------------------
# Controllers: pure functions of the mini-batch's (log W, sign of A); tensors (2,) indexed [A >= 0, A < 0]


def _group_masks(pos: Tensor, valid: Tensor) -> Tensor:
    """(2, M) membership of each sequence in the A >= 0 and A < 0 groups."""
    return torch.stack([valid & pos, valid & ~pos])


def _log_phi_2(log_w: Tensor, c1: Tensor, c2: Tensor, groups: Tensor) -> Tensor:
    """log phi of every sequence under both signs' kernels, -inf outside the group: (2, M)."""
    lp = vespo_log_phi(log_w.unsqueeze(0), c1.unsqueeze(-1), c2.unsqueeze(-1))  # (2, M), finite
    return lp.masked_fill(~groups, -math.inf)


def _group_lse(x: Tensor) -> Tensor:
    """logsumexp over the last dim; -inf for an empty (all -inf) group instead of NaN."""
    return torch.logsumexp(x, dim=-1)  # logsumexp of all -inf is -inf in torch


def _bisect_decreasing(f, lo: Tensor, hi: Tensor) -> Tensor:
    """Per element, x in [lo, hi] with f(x) = 0 for f decreasing (f(lo) > 0 >= f(hi) assumed; callers select)."""
    for _ in range(_BISECT_ITERS):
        mid = 0.5 * (lo + hi)
        above = f(mid) > 0
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return hi  # the feasible end of the final bracket


def _log_moment(log_w: Tensor, c1: Tensor, c2: Tensor, groups: Tensor) -> Tensor:
    """log of the self-normalised E_Q[W] = sum phi_i W_i / sum phi_i per group (2,), -inf for an empty group."""
    lp = _log_phi_2(log_w, c1, c2, groups)
    return torch.nan_to_num(_group_lse(lp + log_w) - _group_lse(lp), nan=-math.inf)


def moment_control(
    log_w: Tensor, pos: Tensor, valid: Tensor, c1: Tensor, c2: Tensor, target: Tensor, c2_max: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Per sign, the smallest c2' in [c2, c2_max] with sum phi W / sum phi <= C; returns (c2', active, E_Q[W]).

    The constraint E_Q[W] <= C of the paper's Eq. (moment-constraint), estimated self-normalised on the batch; it is
    decreasing in c2 (its derivative is -Var_Q[W]), so bisection in log c2 finds the multiplier. `active` says the
    paper's c2 violated it; when even c2_max does, c2' = c2_max (saturated: a batch with no spread in W cannot
    meet C by reweighting).
    """
    groups = _group_masks(pos, valid)
    log_c = torch.log(target)
    excess = lambda log_c2: _log_moment(log_w, c1, torch.exp(log_c2), groups) - log_c  # noqa: E731 (decreasing)
    lo, hi = torch.log(c2), torch.full_like(c2, math.log(c2_max))
    active = excess(lo) > 0
    c2_new = torch.where(active, torch.exp(_bisect_decreasing(excess, lo, hi)), c2)
    return c2_new, active, torch.exp(_log_moment(log_w, c1, c2_new, groups))


def _log_ess(log_weights: Tensor, groups: Tensor) -> Tensor:
    """log of the normalised Kish ESS per group (2,) of weights given in log space (-inf outside), 0 if empty."""
    n = groups.sum(-1).clamp(min=1)
    log_ess = 2 * _group_lse(log_weights) - _group_lse(2 * log_weights) - torch.log(n.to(log_weights.dtype))
    return torch.nan_to_num(log_ess, nan=0.0)


def ess_control(
    log_w: Tensor, pos: Tensor, valid: Tensor, c1: Tensor, c2: Tensor, target: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per sign, the largest tau in [1/c1, 1] with ESS(phi^tau) >= target; returns (tau, active, ESS before, after).

    ESS(w^tau) is decreasing in tau (d log ESS / d tau = 2 (E_tau[log w] - E_2tau[log w]) <= 0), so bisection finds
    it; tau >= 1/c1 keeps the tempered kernel's c1 >= 1, where Prop. 3.1's bound is finite.
    """
    groups = _group_masks(pos, valid)
    lp = _log_phi_2(log_w, c1, c2, groups)  # (2, M)
    log_target = math.log(target)
    short = lambda tau: log_target - _log_ess(tau.unsqueeze(-1) * lp, groups)  # noqa: E731 (decreasing in -tau)
    before = _log_ess(lp, groups)
    active = before < log_target
    lo = 1.0 / c1  # flattest allowed kernel
    # f(x) = ESS shortfall at tau = 1 - x is decreasing in x; search x in [0, 1 - 1/c1]
    x = _bisect_decreasing(lambda x: short(1.0 - x), torch.zeros_like(c1), 1.0 - lo)
    tau = torch.where(active, 1.0 - x, torch.ones_like(c1))
    return tau, active, torch.exp(before), torch.exp(_log_ess(tau.unsqueeze(-1) * lp, groups))


def selfnorm_gain(
    log_w: Tensor, pos: Tensor, valid: Tensor, c1: Tensor, c2: Tensor, groups_kind: str, max_gain: float
) -> tuple[Tensor, Tensor]:
    """log gain per sign (2,) = -log Z, Z = mean phi over the sign group (or all sequences), capped at log max_gain;
    and Z itself."""
    groups = _group_masks(pos, valid)
    lp = _log_phi_2(log_w, c1, c2, groups)  # (2, M)
    if groups_kind == "sign":
        log_z = _group_lse(lp) - torch.log(groups.sum(-1).clamp(min=1).to(lp.dtype))
    else:
        log_z = (torch.logsumexp(lp.flatten(), 0) - torch.log(valid.sum().clamp(min=1).to(lp.dtype))).expand(2)
    log_z = torch.nan_to_num(log_z, neginf=0.0)  # empty group: no sequence to scale, gain 1
    return (-log_z).clamp(max=math.log(max_gain)), torch.exp(log_z)


# --------------------------------------------------------------------------------------------------------------------
# The registered methods share one body: sequence log W -> controller -> phi -> loss


def _adaptive_loss(
    kind: str,
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    rollout_log_w: Tensor | None,
    seq_log_w: Tensor | None,
    ctx: BatchContext | None,
    c: tuple[float, float, float, float],
    hp: dict[str, object],
) -> tuple[Tensor, dict[str, Tensor]]:
    """loss = -sg(phi_g(W)) * A * log pi (B, T), with (c1, c2, log gain) per sign from the controller `kind`."""
    log_w = seq_log_w  # (B,) log prod_t pi/mu from the core (or computed here when called directly)
    if log_w is None:
        log_w = seq_log_ratio(log_prob.detach(), old_log_prob, mask)
    if rollout_log_w is not None:
        log_w = log_w + rollout_log_w
    log_w = log_w.clamp(LOG_W_MIN, LOG_W_MAX)  # (B,) as `vespo`
    a_seq = seq_advantage(advantages, mask)  # (B,)
    seq_valid = mask.sum(-1) > 0
    # the decision's statistics: the whole mini-batch if given, else this batch
    if ctx is not None and ctx.log_w is not None:
        g_log_w = ctx.log_w.to(log_w.dtype).clamp(LOG_W_MIN, LOG_W_MAX)
        g_pos, g_valid = ctx.advantages >= 0, ctx.valid
    else:
        g_log_w, g_pos, g_valid = log_w, a_seq >= 0, seq_valid
    c1 = torch.tensor([c[0], c[2]], dtype=log_w.dtype, device=log_w.device)  # (2,) [A >= 0, A < 0]
    c2 = torch.tensor([c[1], c[3]], dtype=log_w.dtype, device=log_w.device)
    before = _log_phi_2(g_log_w, c1, c2, _group_masks(g_pos, g_valid)).logsumexp(0)  # (M,) paper kernel, log phi
    c1, c2, log_gain, metrics = _control(kind, g_log_w, g_pos, g_valid, c1, c2, ctx, hp)
    metrics |= _per_sign("adaptive/c1", c1) | _per_sign("adaptive/c2", c2)

    idx = (a_seq < 0).long()  # (B,) 0 for A >= 0, 1 for A < 0
    log_phi = vespo_log_phi(log_w, c1[idx], c2[idx]) + log_gain[idx]  # (B,)
    phi = torch.exp(log_phi)  # detached: log_w came from log_prob.detach()
    loss = log_prob * (-phi.unsqueeze(-1) * compact_advantages(advantages))  # (B, T)

    g_idx = (~g_pos).long()
    after = vespo_log_phi(g_log_w, c1[g_idx], c2[g_idx]) + log_gain[g_idx]  # (M,) the controlled kernel, log phi
    metrics["adaptive/ess_before"] = effective_sample_size(before, g_valid)
    metrics["adaptive/ess"] = effective_sample_size(after, g_valid)
    metrics["adaptive/top1_share"] = top_share(after, g_valid)
    metrics |= weight_metrics("weight", phi, a_seq, seq_valid)
    metrics["vespo/Z"] = (phi * seq_valid).sum() / seq_valid.sum().clamp(min=1)
    return loss, {k: v.detach() for k, v in metrics.items()}


def _control(
    kind: str,
    g_log_w: Tensor,
    g_pos: Tensor,
    g_valid: Tensor,
    c1: Tensor,
    c2: Tensor,
    ctx: BatchContext | None,
    hp: dict[str, object],
) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
    """The controller `kind` on the decision's statistics: (c1, c2, log gain) per sign (2,) and its metrics."""
    log_gain = torch.zeros_like(c1)
    metrics: dict[str, Tensor] = {}
    if kind == "moment":
        target = torch.tensor([hp["moment_target_pos"], hp["moment_target_neg"]], dtype=c1.dtype, device=c1.device)
        c2, active, moment = moment_control(g_log_w, g_pos, g_valid, c1, c2, target, hp["c2_max"])
        metrics |= _per_sign("adaptive/moment", moment) | _per_sign("adaptive/active", active.float())
    elif kind == "ess":
        tau, active, ess_before, ess_after = ess_control(g_log_w, g_pos, g_valid, c1, c2, hp["ess_target"])
        c1, c2 = c1 * tau, c2 * tau
        metrics |= _per_sign("adaptive/tau", tau) | _per_sign("adaptive/active", active.float())
        metrics |= _per_sign("adaptive/ess_group_before", ess_before) | _per_sign("adaptive/ess_group", ess_after)
    elif kind == "selfnorm":
        log_gain, z = selfnorm_gain(g_log_w, g_pos, g_valid, c1, c2, hp["normalize"], hp["max_gain"])
        metrics |= _per_sign("adaptive/log_gain", log_gain) | _per_sign("adaptive/Z", z)  # log: 1/Z can overflow
    else:  # schedule
        k, n = _mini_batch_index(ctx)
        c2 = c2 * (1.0 + (hp["c2_scale_max"] - 1.0) * k / max(n - 1, 1))
        metrics["adaptive/mini_batch_index"] = torch.tensor(float(k))
    return c1, c2, log_gain, metrics


def _per_sign(name: str, x: Tensor) -> dict[str, Tensor]:
    return {f"{name}_pos": x[0], f"{name}_neg": x[1]}


def _mini_batch_index(ctx: BatchContext | None) -> tuple[int, int]:
    """(k, N) of the mini-batch; a schedule without them would silently be plain VESPO, so that is an error."""
    if ctx is None or ctx.mini_batch_index is None or ctx.num_mini_batches is None:
        raise ValueError(
            "vespo_schedule needs the mini-batch's index: pass batch_context=BatchContext("
            "mini_batch_index=k, num_mini_batches=N) (vespo train does; see docs/methods/adaptive.md for veRL/TRL)"
        )
    k, n = int(ctx.mini_batch_index), int(ctx.num_mini_batches)
    if not (n >= 1 and 0 <= k < n):
        raise ValueError(f"batch_context needs 0 <= mini_batch_index < num_mini_batches, got k={k}, N={n}")
    return k, n


_PAPER = dict(c1_pos=2.0, c2_pos=3.0, c1_neg=3.0, c2_neg=2.0)
_C_BOUNDS = {name: ("[1, inf)" if name.startswith("c1") else "(0, inf)", "Prop. 3.1") for name in _PAPER}


def _kernel_check(largest_c2: Callable[[dict[str, object], float], float], field: str | None = None):
    """A `check` keeping every kernel the controller can reach finite in float32 (`kernels.kernel_range_problem`):
    (c1, c2) and (c1, largest_c2(hp, c2)) per sign, the ends of the c2 range it moves in (tempering only shrinks)."""

    def check(hp: dict[str, object]) -> str | None:
        for sign in ("_pos", "_neg"):
            c1, c2 = hp[f"c1{sign}"], hp[f"c2{sign}"]
            problem = kernel_range_problem(c1, c2, sign)
            top = largest_c2(hp, c2)
            if problem is None and top != c2 and kernel_range_problem(c1, top, sign) is not None:
                problem = f"{field} = {hp[field]} takes c2{sign} to {top:g}, where " + kernel_range_problem(c1, top)
            if problem:
                return problem
        return None

    return check


def _moment_check(hp: dict[str, object]) -> str | None:
    if not hp["c2_max"] >= max(hp["c2_pos"], hp["c2_neg"]):
        return f"need c2_max >= c2_pos and c2_neg, got c2_max={hp['c2_max']}"
    return _kernel_check(lambda hp, c2: hp["c2_max"], "c2_max")(hp)


def _register_adaptive(name: str, kind: str, extra: dict[str, tuple[object, object]], doc: str, **registry) -> None:
    """Register `name`: VESPO's four constants (paper defaults) plus the controller's `extra` hyperparameters
    (name -> (default, type)), all keyword-only in the function's signature, which is what the registry reads."""
    defaults = _PAPER | {k: default for k, (default, _) in extra.items()}

    def method(log_prob, old_log_prob, advantages, mask, *, rollout_log_w=None, seq_log_ratio=None,
               batch_context=None, **hp):  # fmt: skip
        hp = defaults | hp
        c = tuple(hp.pop(k) for k in _PAPER)
        args = (log_prob, old_log_prob, advantages, mask, rollout_log_w, seq_log_ratio, batch_context, c, hp)
        return _adaptive_loss(kind, *args)

    P = inspect.Parameter
    inputs = [
        P(n, P.POSITIONAL_OR_KEYWORD, annotation=Tensor) for n in ("log_prob", "old_log_prob", "advantages", "mask")
    ]
    optional_inputs = {
        "rollout_log_w": Tensor | None,
        "seq_log_ratio": Tensor | None,
        "batch_context": BatchContext | None,
    }
    optional = [P(n, P.KEYWORD_ONLY, default=None, annotation=a) for n, a in optional_inputs.items()]
    kinds = dict.fromkeys(_PAPER, float) | {k: kind_ for k, (_, kind_) in extra.items()}
    hparams = [P(k, P.KEYWORD_ONLY, default=v, annotation=kinds[k]) for k, v in defaults.items()]
    method.__signature__ = inspect.Signature(inputs + optional + hparams)
    method.__annotations__ = {p.name: p.annotation for p in inputs + optional + hparams}
    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc
    register = register_method(name, rollout_correction="fold", inputs=tuple(optional_inputs), **registry)
    globals()[name] = register(method)


_register_adaptive(
    "vespo_moment",
    "moment",
    {"moment_target_pos": (1.0, float), "moment_target_neg": (1.5, float), "c2_max": (50.0, float)},
    """VESPO whose lambda = c2 is the multiplier of E_Q[W] <= C (paper Eqs. moment-constraint, lagrangian, Q-solution).

    Per sign, c2 = the smallest value >= the paper's with sum_i phi_i W_i / sum_i phi_i <= C over the mini-batch
    (c1 fixed), found by bisection in log c2 up to `c2_max`. Default C = max(1, c1/c2) per sign, (1, 1.5): E_Q[W]
    is 1 on-policy and tends to c1/c2 (the mean of Gamma(c1, c2)) when log W is spread wide, so the paper's
    constants never bind in either limit; the constraint binds when a heavy upper tail of W dominates Q.
    """,
    bounds=_C_BOUNDS | {"moment_target_pos": ("[1, inf)", "E_Q[W] = 1 on-policy"), "moment_target_neg": "[1, inf)"},
    check=_moment_check,
)
_register_adaptive(
    "vespo_ess",
    "ess",
    {"ess_target": (0.5, float)},
    """VESPO tempered to an ESS target: phi^tau = W^(tau c1) exp(tau c2 (1 - W)) per sign (same mode c1/c2).

    tau = 1 (the paper's kernel) when the group's Kish ESS of phi is >= `ess_target`; else the largest tau in
    [1/c1, 1] that reaches it (bisection; ESS of phi^tau decreases in tau), tau = 1/c1 if none does.
    """,
    bounds=_C_BOUNDS | {"ess_target": ("(0, 1]", "normalised Kish ESS")},
    check=_kernel_check(lambda hp, c2: c2),
)
_register_adaptive(
    "vespo_selfnorm",
    "selfnorm",
    {"normalize": ("sign", Literal["sign", "all"]), "max_gain": (math.inf, float)},
    """Self-normalised VESPO: phi(W) / Z, Z = mean phi over the mini-batch's sign group ("sign") or all ("all").

    The gain 1/Z is capped at `max_gain`; max_gain = 1 only ever scales down, and is the paper's VESPO when Z >= 1.
    A batch whose every phi is tiny still steps in the direction of its least-stale samples (the weights of a
    group average 1); the price is that one sequence can carry up to the whole group's weight.
    """,
    bounds=_C_BOUNDS | {"max_gain": ("[1, inf]", "1 = paper VESPO")},
    check=_kernel_check(lambda hp, c2: c2),
)
_register_adaptive(
    "vespo_schedule",
    "schedule",
    {"c2_scale_max": (2.0, float)},
    """VESPO with c2 scheduled on the index k of the mini-batch: c2(k) = c2 (1 + (s - 1) k / (N - 1)).

    k = 0 (on-policy) uses the paper's c2, the last mini-batch k = N - 1 uses s * c2 (s = `c2_scale_max`): a tighter
    moment constraint (larger lambda) where the weights are stalest. Needs `batch_context` with k and N.
    """,
    bounds=_C_BOUNDS | {"c2_scale_max": ("[1, inf)", "1 = paper VESPO")},
    check=_kernel_check(lambda hp, c2: c2 * hp["c2_scale_max"], "c2_scale_max"),
)

ADAPTIVE_METHODS = ("vespo_ess", "vespo_moment", "vespo_schedule", "vespo_selfnorm")

__all__ = ["ADAPTIVE_METHODS", "BatchContext", "batch_context"]
