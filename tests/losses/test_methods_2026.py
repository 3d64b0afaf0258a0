"""Issue 54's methods: DPPO (TV and KL), LUSPO, Kimi K2.5's squared log-ratio penalty (`kl_tau`, any method) and
veRL's IcePop preset, against hand-computed values. Engine parity: tests/integrations/test_integration_verl.py
(veRL's dppo_*), tests/integrations/test_integration_trl.py (TRL's luspo)."""

import math

import pytest
import torch

import vespo
from vespo import compute_policy_loss
from vespo.losses import rollout_correction_preset

# 2 x 2 example: log pi and log mu per token, A = (+1, -1) per sequence, all tokens valid
LP = [[-0.1, -2.0], [-0.5, -1.0]]
OLD = [[-0.5, -1.0], [-0.1, -1.2]]


def _run(method, **kw):
    lp = torch.tensor(LP, dtype=torch.float64, requires_grad=True)
    old = torch.tensor(OLD, dtype=torch.float64)
    loss, metrics = compute_policy_loss(
        method, log_prob=lp, old_log_prob=old, advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
        response_mask=torch.ones(2, 2), **kw,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.item(), grad, {k: float(v) for k, v in metrics.items()}


def test_new_methods_are_registered():
    assert {"dppo_tv", "dppo_kl", "luspo"} <= set(vespo.available_methods())
    assert vespo.method_hparams("dppo_tv") | {} == {
        "clip_ratio_low": 0.15, "clip_ratio_high": 0.15, "clip_ratio_c": 20.0, **_common(),
    }  # fmt: skip
    assert vespo.losses.default_loss_agg_mode("luspo") == "seq-mean-token-sum"
    for method in vespo.available_methods():  # the penalty is an option of every method, off by default
        assert vespo.method_hparams(method)["kl_tau"] == 0.0


def _common():
    return {**vespo.losses.CORRECTION_OPTIONS, "kl_tau": 0.0}


def test_dppo_tv_hand_computed():
    # p - p_old per token: [e^-.1 - e^-.5, e^-2 - e^-1] = [0.2983, -0.2325]; [e^-.5 - e^-.1, e^-1 - e^-1.2]
    # A > 0 row: token 0 moved up by 0.298 > 0.15 -> masked; token 1 moved down: kept (A > 0 checks only up)
    # A < 0 row: token 0 moved down by 0.298 > 0.15 -> masked; token 1 moved up 0.067: kept
    r01, r11 = math.exp(-1.0), math.exp(0.2)  # pi/mu of the kept tokens
    loss, grad, m = _run("dppo_tv")
    # loss = -A sg(min(r, 20)) log pi summed over kept tokens / 4 tokens
    assert loss == pytest.approx((-1 * r01 * -2.0 + 1 * r11 * -1.0) / 4, rel=1e-12)
    expected = torch.tensor([[0.0, -r01 / 4], [0.0, r11 / 4]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)  # the PPO gradient A r grad log pi
    assert m["clip/frac"] == 0.5 and m["clip/frac_lower"] == 0.0
    # a cap C = 1.1 truncates the A < 0 token's weight r = e^0.2 = 1.22
    _, grad, m = _run("dppo_tv", clip_ratio_c=1.1)
    assert grad[1, 1].item() == pytest.approx(1.1 / 4, rel=1e-12) and m["clip/frac_lower"] == 0.25
    # wider trust region: nothing masked
    _, _, m = _run("dppo_tv", clip_ratio_low=0.5, clip_ratio_high=0.5)
    assert m["clip/frac"] == 0.0


def _bkl(p, q):
    return q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))


def test_dppo_kl_hand_computed():
    kls = [
        [_bkl(math.exp(a), math.exp(b)) for a, b in zip(ra, rb, strict=True)] for ra, rb in zip(LP, OLD, strict=True)
    ]
    assert kls[0][0] > 0.05 and kls[1][0] > 0.05 and kls[1][1] < 0.05  # the masked / kept split below
    loss, grad, m = _run("dppo_kl")
    # A > 0 row: token 0 moved up with KL > 0.05 -> masked; token 1 moved down: kept. A < 0 row: token 0 moved
    # down with KL > 0.05 -> masked; token 1 moved up: kept
    r01, r11 = math.exp(-1.0), math.exp(0.2)
    assert loss == pytest.approx((r01 * 2.0 - r11 * 1.0) / 4, rel=1e-12)
    assert grad[0, 0].item() == 0.0 and grad[1, 0].item() == 0.0 and m["clip/frac"] == 0.5


def test_luspo_is_gspo_scaled_by_length():
    """LUSPO (seq-mean-token-sum) = GSPO's per-token loss summed over each sequence, mean over sequences: a
    sequence's weight grows with its length |y| instead of 1/|y| (TRL's luspo aggregation)."""
    lp = torch.tensor([[-0.3, -0.2, -1.0], [-0.5, -0.7, -0.9]], dtype=torch.float64, requires_grad=True)
    old = lp.detach() - 1e-4
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    kw = dict(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    luspo, _ = compute_policy_loss("luspo", **kw)
    s = math.exp(1e-4)  # the sequence ratio, inside GSPO's band [1 - 3e-4, 1 + 4e-4]
    assert luspo.item() == pytest.approx((3 * -s * 1.0 + 1 * -s * -2.0) / 2, rel=1e-9)
    gspo_as_luspo, _ = compute_policy_loss("gspo", loss_agg_mode="seq-mean-token-sum", **kw)
    assert luspo.item() == pytest.approx(gspo_as_luspo.item(), rel=1e-12)


@pytest.mark.parametrize("method", vespo.available_methods())
def test_kl_tau_adds_the_squared_log_ratio_to_every_method(method):
    """kl_tau * (log pi/mu)^2 on each valid token, through the method's aggregation; gradient 2 tau log r."""
    ctx = {"batch_context": vespo.losses.BatchContext(mini_batch_index=0, num_mini_batches=2)}
    ctx = ctx if method == "vespo_schedule" else {}
    base, g0, _ = _run(method, **ctx)
    tau = 1e-3
    with_pen, g1, m = _run(method, kl_tau=tau, **ctx)
    d = torch.tensor(LP, dtype=torch.float64) - torch.tensor(OLD, dtype=torch.float64)
    mode = vespo.losses.default_loss_agg_mode(method)
    per_token = tau * d.square()
    extra = {"token-mean": per_token.mean(), "seq-mean-token-mean": per_token.mean(-1).mean(),
             "seq-mean-token-sum": per_token.sum(-1).mean()}[mode]  # fmt: skip
    assert with_pen - base == pytest.approx(extra.item(), rel=1e-9)
    scale = {"token-mean": 4, "seq-mean-token-mean": 4, "seq-mean-token-sum": 2}[mode]
    torch.testing.assert_close(g1 - g0, 2 * tau * d / scale, rtol=1e-9, atol=1e-15)
    assert m["kl_tau/log_ratio_sq"] == pytest.approx(d.square().mean().item(), rel=1e-12)


def test_kl_tau_is_a_checked_hyperparameter():
    with pytest.raises(ValueError, match=r"^grpo hyperparameter kl_tau must be in \[0, 1e6\]"):
        vespo.validate_hparams("grpo", kl_tau=-1e-3)


def test_icepop_is_verls_decoupled_token_icepop_preset():
    """IcePop is a mode of the one rollout-correction mechanism, findable by veRL's preset name: token weights
    mu/pi_rollout outside [0.5, 5] become 0, the others are kept as they are (not truncated)."""
    options = rollout_correction_preset("decoupled_token_icepop")
    assert options == {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0", "rollout_rs": None,
                       "rollout_rs_threshold": None}  # fmt: skip
    lp = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = lp.detach().clone()
    rollout = old - torch.tensor([[math.log(0.4), math.log(3.0), math.log(6.0)]], dtype=torch.float64)
    loss, _ = compute_policy_loss(
        "reinforce", log_prob=lp, old_log_prob=old, advantages=torch.tensor([1.0], dtype=torch.float64),
        response_mask=torch.ones(1, 3), rollout_log_prob=rollout, **options,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -3.0 / 3, 0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"unknown rollout-correction preset 'bypass_ppo_clip'"):
        rollout_correction_preset("bypass_ppo_clip")
