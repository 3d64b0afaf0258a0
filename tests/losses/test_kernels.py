"""The kernel and the paper's closed forms: phi, K, phi_max, surrogate, ESS."""

import math

import pytest
import torch

from vespo import kernels
from vespo.cli import bound_cli
from vespo.kernels import effective_sample_size, phi_max, surrogate, variance_bound_K, vespo_log_phi

C_PAIRS = [(2.0, 3.0), (3.0, 2.0), (1.5, 0.7), (0.5, 2.0), (5.0, 5.0)]


def phi(w: float, c1: float, c2: float) -> float:
    return w**c1 * math.exp(c2 * (1 - w))


@pytest.mark.parametrize("c1,c2", C_PAIRS)
def test_phi_at_one_is_one(c1, c2):
    assert torch.exp(vespo_log_phi(torch.tensor(0.0), c1, c2)).item() == pytest.approx(1.0, abs=1e-7)


@pytest.mark.parametrize("c1,c2", C_PAIRS)
def test_log_phi_matches_direct_formula(c1, c2):
    w = torch.linspace(0.01, 6.0, 200, dtype=torch.float64)
    got = torch.exp(vespo_log_phi(torch.log(w), c1, c2))
    want = torch.tensor([phi(x, c1, c2) for x in w.tolist()], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_paper_numbers():
    # Appendix C: K(2,3) = e^2/3 ~ 2.46, K(3,2) = 1, phi_max(2,3) = (2/3)^2 e ~ 1.21, phi_max(3,2) = (3/2)^3/e ~ 1.24
    assert variance_bound_K(2, 3) == pytest.approx(math.e**2 / 3, rel=1e-12)
    assert variance_bound_K(2, 3) == pytest.approx(2.463, abs=5e-4)
    assert variance_bound_K(3, 2) == pytest.approx(1.0, rel=1e-12)
    assert phi_max(2, 3) == pytest.approx(1.208, abs=5e-4)
    assert phi_max(3, 2) == pytest.approx(1.242, abs=5e-4)
    assert variance_bound_K(1, 2) == pytest.approx(math.e**2)
    assert math.isinf(variance_bound_K(0.5, 2))


@pytest.mark.parametrize("c1,c2", C_PAIRS)
def test_phi_max_is_the_maximum_at_c1_over_c2(c1, c2):
    w = torch.linspace(1e-4, 20.0, 400_001, dtype=torch.float64)
    vals = torch.exp(vespo_log_phi(torch.log(w), c1, c2))
    assert vals.max().item() == pytest.approx(phi_max(c1, c2), rel=1e-8)
    assert w[vals.argmax()].item() == pytest.approx(c1 / c2, abs=1e-4)
    assert phi(c1 / c2, c1, c2) == pytest.approx(phi_max(c1, c2), rel=1e-12)


@pytest.mark.parametrize("c1,c2", [(2.0, 3.0), (3.0, 2.0), (1.5, 0.7), (5.0, 5.0)])
def test_K_is_sup_of_phi_over_w(c1, c2):
    w = torch.linspace(1e-4, 20.0, 400_001, dtype=torch.float64)
    ratio = torch.exp(vespo_log_phi(torch.log(w), c1, c2)) / w
    assert ratio.max().item() == pytest.approx(variance_bound_K(c1, c2), rel=1e-7)
    assert w[ratio.argmax()].item() == pytest.approx(kernels.variance_bound_argmax(c1, c2), abs=1e-4)


@pytest.mark.parametrize("c1,c2", C_PAIRS)
def test_surrogate_derivative_is_phi_over_w(c1, c2):
    w = torch.tensor([0.05, 0.3, 1.0, 1.7, 4.0], dtype=torch.float64)
    h = 1e-6
    fd = (surrogate(w + h, c1, c2) - surrogate(w - h, c1, c2)) / (2 * h)
    want = torch.tensor([phi(x, c1, c2) / x for x in w.tolist()], dtype=torch.float64)
    torch.testing.assert_close(fd, want, rtol=1e-6, atol=1e-9)
    assert surrogate(torch.tensor(0.0, dtype=torch.float64), c1, c2).item() == 0.0
    # saturates: f(inf) = e^c2 c2^-c1 Gamma(c1)
    limit = math.exp(c2 - c1 * math.log(c2) + math.lgamma(c1))
    assert surrogate(torch.tensor(1e3, dtype=torch.float64), c1, c2).item() == pytest.approx(limit, rel=1e-10)


@pytest.mark.parametrize("bad", [(0.0, 1.0), (-1.0, 2.0), (2.0, 0.0), (2.0, -3.0), (math.nan, 1.0)])
def test_invalid_c_raise(bad):
    for fn in (phi_max, variance_bound_K):
        with pytest.raises(ValueError, match="c1 > 0 and c2 > 0"):
            fn(*bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_log_phi_finite_for_extreme_log_w(dtype):
    big = 6e4 if dtype == torch.float16 else 1e30  # largest finite-ish magnitude the dtype holds
    log_w = torch.tensor([-1e4, -100.0, 0.0, 30.0, 88.0, 1e4, big], dtype=dtype)
    out = vespo_log_phi(log_w, 2.0, 3.0)
    assert torch.isfinite(out).all()
    phi_vals = torch.exp(out.float())
    assert (phi_vals <= phi_max(2.0, 3.0) * 1.01).all() and (phi_vals >= 0).all()
    assert phi_vals[-1] == 0 and phi_vals[0] == 0


def test_ess_values():
    n = 8
    assert effective_sample_size(torch.zeros(n)).item() == pytest.approx(1.0)
    one_hot = torch.full((n,), -1e4)
    one_hot[3] = 0.0
    assert effective_sample_size(one_hot).item() == pytest.approx(1 / n)
    lw = torch.randn(n, dtype=torch.float64)
    w = torch.exp(lw)
    kish = (w.sum() ** 2 / (n * (w**2).sum())).item()
    assert effective_sample_size(lw).item() == pytest.approx(kish, rel=1e-6)
    assert effective_sample_size(lw + 500.0).item() == pytest.approx(kish, rel=1e-6)  # shift-invariant, no overflow
    mask = torch.tensor([1, 1, 1, 0, 0, 0, 0, 0], dtype=torch.bool)
    w3 = w[:3]
    assert effective_sample_size(lw, mask).item() == pytest.approx(
        (w3.sum() ** 2 / (3 * (w3**2).sum())).item(), rel=1e-6
    )


def test_bound_cli(capsys):
    assert bound_cli(["--c1", "2", "--c2", "3"]) == 0
    out = capsys.readouterr().out
    assert "K       = 2.46302" in out and "w = (c1-1)/c2 = 0.333333" in out
    assert "phi_max = 1.20813" in out and "W = c1/c2 = 0.666667" in out
    assert bound_cli(["--c1", "0.5", "--c2", "2"]) == 0
    captured = capsys.readouterr()
    assert "K       = inf" in captured.out and "vacuous" in captured.err
