"""VESPO's reshaping kernel and the closed-form quantities of the paper, all as pure functions.

phi(W) = W^c1 * exp(c2 * (1 - W))            (shifted kernel, paper Sec. 3.3; phi(1) = 1)
f(W)   = integral of phi(w)/w, i.e. a lower incomplete gamma function (Appendix B)
K      = sup_w phi(w)/w                       (Proposition 3.1, Eq. K-formula)
phi_max = sup_w phi(w)                        (Proposition C.1)

Everything that touches W takes log W, so no value overflows for any finite log W.
"""

from __future__ import annotations

import math

import torch

# exp(80) ~ 5.5e34 is finite in float32 (max ~3.4e38). Capping the exponent only where W is exponentiated keeps
# log phi = c1*log W + c2*(1 - W) finite for log W up to +inf-ish inputs; phi there is ~exp(-1e34) = 0 either way.
_MAX_LOG_W_IN_EXP = 80.0


def check_c(c1: float, c2: float) -> None:
    if not (math.isfinite(c1) and math.isfinite(c2)) or c1 <= 0 or c2 <= 0:
        raise ValueError(f"VESPO kernel needs c1 > 0 and c2 > 0 (Prop. 3.1), got c1={c1}, c2={c2}")


def vespo_log_phi(log_w: torch.Tensor, c1: float | torch.Tensor, c2: float | torch.Tensor) -> torch.Tensor:
    """log phi(W) = c1 * log W + c2 * (1 - W), evaluated from log W (paper Sec. 3.5, "computed in log-space").

    `c1`, `c2` may be tensors broadcastable to `log_w` (per-sequence asymmetric choice). Finite for every finite
    `log_w`: half-precision input is computed in float32, and W is exponentiated with its exponent capped at 80,
    where phi has long underflowed to 0.
    """
    if log_w.dtype in (torch.float16, torch.bfloat16):
        log_w = log_w.float()
    w = torch.exp(log_w.clamp(max=_MAX_LOG_W_IN_EXP))
    return c1 * log_w + c2 * (1.0 - w)


KERNEL_C_MAX = 1000.0  # c1, c2 <= 1000: c1 log W and c2 W stay far inside float32 for |log W| <= 20
KERNEL_LOG_MAX = 80.0  # log phi_max and log(K phi W) <= 80: phi, and the logged bound K phi W, stay finite


def kernel_range_problem(c1: float, c2: float, sign: str = "", *, bound: bool = False) -> str | None:
    """Why (c1, c2) would overflow float32 in the loss, or None: phi peaks at phi_max (Prop. C.1), which must stay
    below e^80; `bound=True` also keeps the logged side of Prop. 3.1, K phi W <= K phi_max(c1 + 1, c2), below it."""
    if not (0 < c1 <= KERNEL_C_MAX and 0 < c2 <= KERNEL_C_MAX):
        return f"c1{sign} and c2{sign} must be in (0, {KERNEL_C_MAX:g}], got {c1}, {c2}"
    log_peak = c1 * math.log(c1 / c2) + c2 - c1
    if bound and c1 >= 1:
        log_peak = max(log_peak, log_variance_bound_K(c1, c2) + (c1 + 1) * math.log((c1 + 1) / c2) + c2 - c1 - 1)
    if log_peak > KERNEL_LOG_MAX:
        what = "phi" + " or K phi W (Prop. 3.1)" * bound
        return (
            f"(c1{sign}, c2{sign}) = ({c1}, {c2}) gives {what} up to exp({log_peak:.4g}) (Prop. C.1: phi_max = "
            f"(c1/c2)^c1 e^(c2 - c1)), beyond float32; need it <= exp({KERNEL_LOG_MAX:g}): c2 closer to c1"
        )
    return None


def phi_max(c1: float, c2: float) -> float:
    """sup_W phi(W) = (c1/c2)^c1 * exp(c2 - c1), attained at W = c1/c2 (paper Prop. C.1)."""
    check_c(c1, c2)
    return math.exp(c1 * math.log(c1 / c2) + c2 - c1)


def phi_argmax(c1: float, c2: float) -> float:
    """The W at which phi is largest: c1 / c2 (paper Prop. C.1)."""
    check_c(c1, c2)
    return c1 / c2


def log_variance_bound_K(c1: float, c2: float) -> float:
    """log K, K = sup_w phi(w)/w (Prop. 3.1): (c1-1) log((c1-1)/c2) + c2 - c1 + 1 for c1 > 1, c2 at c1 = 1, inf
    below."""
    check_c(c1, c2)
    if c1 < 1.0:
        return math.inf
    if c1 == 1.0:
        return c2
    return (c1 - 1.0) * math.log((c1 - 1.0) / c2) + c2 - c1 + 1.0


def variance_bound_K(c1: float, c2: float) -> float:
    """K = sup_w phi(w)/w from Prop. 3.1: ((c1-1)/c2)^(c1-1) * exp(c2-c1+1) for c1 > 1, e^c2 at c1 = 1, inf below."""
    log_k = log_variance_bound_K(c1, c2)
    return math.inf if log_k > 709.0 else math.exp(log_k)


def variance_bound_argmax(c1: float, c2: float) -> float:
    """The w attaining K: (c1-1)/c2 for c1 > 1; 0 (approached, not attained) for c1 = 1; nan where K is infinite."""
    check_c(c1, c2)
    if c1 < 1.0:
        return math.nan
    return (c1 - 1.0) / c2


def surrogate(w: torch.Tensor, c1: float, c2: float) -> torch.Tensor:
    """The implicit objective f with f'(W) = phi(W)/W and f(0) = 0 (paper Appendix B).

    For the shifted kernel, f(W) = e^c2 * c2^-c1 * gamma_lower(c1, c2 * W), where gamma_lower is the lower incomplete
    gamma function; torch's `igamma` is the regularised P(a, x) = gamma_lower(a, x) / Gamma(a).
    """
    check_c(c1, c2)
    w = torch.as_tensor(w)
    if torch.any(w < 0):
        raise ValueError("surrogate is defined for W >= 0")
    wf = w.double() if w.dtype != torch.float64 else w
    a = torch.full_like(wf, float(c1))
    log_scale = c2 - c1 * math.log(c2) + math.lgamma(c1)
    return (math.exp(log_scale) * torch.special.gammainc(a, c2 * wf)).to(w.dtype if w.is_floating_point() else wf.dtype)


def effective_sample_size(log_weights: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Normalised Kish ESS, (sum w)^2 / (n * sum w^2) in [0, 1], computed from log-weights (shift-invariant).

    1 means all weights equal; 1/n means one sample carries all the weight. `mask` selects the samples counted.
    """
    lw = log_weights if log_weights.dtype == torch.float64 else log_weights.float()
    if mask is None:
        mask = torch.ones_like(lw, dtype=torch.bool)
    mask = mask.bool()
    n = mask.sum()
    lw = torch.where(mask, lw, torch.full_like(lw, -math.inf))
    # log((sum w)^2 / sum w^2) = 2*lse(lw) - lse(2*lw); the max-shift inside logsumexp keeps it finite.
    log_ess = 2.0 * torch.logsumexp(lw, dim=-1) - torch.logsumexp(2.0 * lw, dim=-1)
    ess = (torch.exp(log_ess) / n.clamp(min=1)).clamp(max=1.0)  # <= 1 by Cauchy-Schwarz, up to rounding
    return torch.where(n > 0, ess, torch.zeros_like(ess))
