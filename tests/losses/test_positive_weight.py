"""VESPO's `positive_weight` ablation (issue 29): weight 1 on A >= 0 sequences (TOPR's), phi(W) kept on A < 0."""

import math

import pytest
import torch

import vespo
from vespo import compute_policy_loss
from vespo.experiments.presets import NAMED

# 2 sequences x 2 tokens: log pi, per-token log(pi/mu), A = (+1, -2), all tokens valid (token-mean over 4 tokens)
LP = [[-1.0, -2.0], [-0.5, -1.5]]
DELTA = [[0.1, 0.2], [-0.3, 0.0]]


def run(**hp):
    lp = torch.tensor(LP, dtype=torch.float64, requires_grad=True)
    old = lp.detach() - torch.tensor(DELTA, dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, metrics = compute_policy_loss("vespo", log_prob=lp, old_log_prob=old, advantages=adv,
                                        response_mask=torch.ones(2, 2), **hp)  # fmt: skip
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.item(), grad, {k: float(v) for k, v in metrics.items()}


def phi(log_w, c1, c2):
    return math.exp(c1 * log_w + c2 * (1 - math.exp(log_w)))


def test_unit_positive_weight_hand_computed():
    loss, grad, m = run(positive_weight="one")
    phi_neg = phi(-0.3, 3, 2)  # A < 0 keeps VESPO's kernel: 0.682743...
    assert phi_neg == pytest.approx(0.682743, abs=1e-6)
    # loss = token-mean of -w * A * log pi with w = (1, phi_neg): A >= 0 row uses weight 1, not phi(e^0.3) = 0.638
    want = (-1 * 1 * (-1.0 - 2.0) + -phi_neg * -2 * (-0.5 - 1.5)) / 4
    assert loss == pytest.approx(want, rel=1e-12)
    # gradient -w * A / 4 per token: -0.25 on the positive row exactly, phi_neg / 2 on the negative one
    assert grad[0].tolist() == pytest.approx([-0.25, -0.25], rel=1e-12)
    assert grad[1].tolist() == pytest.approx([phi_neg / 2, phi_neg / 2], rel=1e-12)
    assert m["vespo/Z"] == pytest.approx((1 + phi_neg) / 2, rel=1e-12)


def test_default_is_phi_and_unchanged():
    assert vespo.method_hparams("vespo")["positive_weight"] == "phi"
    loss_default, grad_default, _ = run()
    loss_phi, grad_phi, _ = run(positive_weight="phi")
    assert loss_phi == loss_default and torch.equal(grad_phi, grad_default)
    phi_pos = phi(0.3, 2, 3)  # VESPO's own weight on the positive row: 0.637898..., not 1
    assert grad_default[0, 0].item() == pytest.approx(-phi_pos / 4, rel=1e-12)
    loss_one, grad_one, _ = run(positive_weight="one")
    assert torch.equal(grad_one[1], grad_default[1])  # negatives untouched by the ablation
    assert grad_one[0, 0].item() != pytest.approx(grad_default[0, 0].item(), rel=1e-3)


def test_positive_weight_accepts_only_its_values_and_is_a_sweep_variant():
    with pytest.raises(ValueError, match=r"positive_weight must be one of \['phi', 'one'\]"):
        vespo.validate_hparams("vespo", positive_weight="clip")
    assert NAMED["vespo-unitpos"] == ("vespo", {"positive_weight": "one"}, {})
