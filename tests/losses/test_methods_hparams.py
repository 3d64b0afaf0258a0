"""Every registered method's hyperparameters: the one validation (`vespo.validate_hparams`) accepts a value only if
the loss computes finite values with it, on hostile batches (log W = +-1e4, bf16); a refusal is one line naming the
field. Also: every method called directly, as the docstrings promise (issue 50)."""

import math
import sys

import pytest
import torch

import vespo
from vespo import compute_policy_loss
from vespo.losses.adaptive import BatchContext
from vespo.losses.registry import get_method

# vespo_schedule needs its mini-batch index; it gets one below
METHODS = vespo.available_methods()
EXTREMES = [0.0, 1e-45, 1e-38, 1e-30, 1e-12, 1e-6, 0.5, 1 - 1e-7, 1.0, 1 + 1e-7, 2.0, 10.0, 50.0, 1e6, 1e12,
            1e30, 3e38, 1e39, -1e-30, -1.0, -1e30]  # fmt: skip


def _float_hparams(method):
    spec = get_method(method)
    return [
        name
        for name, kind in spec.kinds.items()
        if not name.startswith("rollout_") and (kind is float or float in getattr(kind, "__args__", ()))
    ]


CASES = [(m, name) for m in METHODS for name in _float_hparams(m)]


def _batches():
    """Hostile batches: every sequence log W at -1e4 or +1e4 (both signs of A), a spread of moderate W, bf16."""
    out = []
    T = 4
    for log_w in (-1e4, 1e4):
        d = log_w / T
        lp = torch.full((2, T), -1.0 + min(d, 0.0))
        old = torch.full((2, T), -1.0 - max(d, 0.0))
        out.append((lp, old, torch.tensor([1.0, -1.0]), torch.ones(2, T)))
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(6, 5, generator=g) * 3
    lp = (old + torch.randn(6, 5, generator=g) * 4).clamp(max=0.0)
    adv = torch.tensor([2.0, -1.0, 0.5, -3.0, 1e-3, -1e-3])
    out.append((lp, old, adv, torch.ones(6, 5)))
    out.append((lp.bfloat16(), old.bfloat16(), adv.bfloat16(), torch.ones(6, 5)))
    return out


def _context(method):
    return {"batch_context": BatchContext(mini_batch_index=1, num_mini_batches=3)} if method == "vespo_schedule" else {}


@pytest.mark.parametrize(("method", "name"), CASES, ids=[f"{m}-{n}" for m, n in CASES])
def test_every_accepted_value_computes_finite_losses(method, name):
    """A value validate_hparams accepts gives a finite loss, gradient and metrics on every hostile batch; one it
    refuses is refused in one line naming the field, by the loss as well."""
    accepted = 0
    for value in EXTREMES:
        try:
            vespo.validate_hparams(method, **{name: value})
        except ValueError as exc:
            assert name in str(exc) and "\n" not in str(exc), str(exc)
            with pytest.raises(ValueError, match=name):
                lp, old, adv, mask = _batches()[0]
                compute_policy_loss(method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask,
                                    **_context(method), **{name: value})  # fmt: skip
            continue
        accepted += 1
        for lp0, old, adv, mask in _batches():
            lp = lp0.clone().requires_grad_()
            loss, metrics = compute_policy_loss(
                method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask,
                **_context(method), **{name: value},
            )  # fmt: skip
            (grad,) = torch.autograd.grad(loss, lp)
            where = f"{method} {name}={value!r} dtype={lp.dtype}"
            assert math.isfinite(loss.item()) and bool(torch.isfinite(grad).all()), where
            bad = {k: float(v) for k, v in metrics.items() if not math.isfinite(float(v))}
            assert not bad, (where, bad)
    assert accepted > 0  # the sweep reaches the field's accepted range


@pytest.mark.parametrize("value", [1e39, 3.5e38, 1e-45, 1e-40])
def test_float_hyperparameters_must_be_float32_numbers(value):
    with pytest.raises(ValueError, match=r"^vespo hyperparameter c1_pos must be 0 or a float32 number") as err:
        vespo.validate_hparams("vespo", c1_pos=value)
    assert "\n" not in str(err.value)


def test_sapo_tiny_temperature_is_refused_not_minus_inf():
    """Issue 50: sapo tau_pos=1e-45 gave a loss of -inf (4 / tau overflows float32)."""
    with pytest.raises(ValueError, match=r"^sapo hyperparameter tau_pos must be"):
        vespo.validate_hparams("sapo", tau_pos=1e-45)
    with pytest.raises(ValueError, match=r"tau_neg must be in"):
        vespo.validate_hparams("sapo", tau_neg=1e-30)


# ---------------------------------------------------------------------------------------------------------------------
# Direct calls: every registered function is callable as fn(log_prob, old_log_prob, advantages, mask)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_called_directly_equals_the_core(method):
    """The registered function itself, called with the four tensors only (advantages (B, T), float mask), gives
    the core's loss matrix when no rollout correction is given (issue 50: `methods.vespo` called None)."""
    spec = get_method(method)
    lp, old, adv, mask = _batches()[2]
    lp = lp.double().requires_grad_()
    old, adv = old.double(), adv.double()
    kw = {k: v for k, v in _context(method).items() if "batch_context" in spec.inputs}
    theirs, _ = vespo.policy_loss_terms(method, vespo.PolicyBatch(lp, old, adv, mask), **kw)
    modules = [sys.modules[f"vespo.losses.{name}"] for name in ("methods", "offpolicy", "adaptive")]
    fn = next(getattr(m, method) for m in modules if hasattr(m, method))  # as a user calls it: methods.vespo
    assert fn is spec.fn
    ours, metrics = fn(lp, old, adv.reshape(-1, 1).expand(lp.shape), mask.double(), **kw)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
