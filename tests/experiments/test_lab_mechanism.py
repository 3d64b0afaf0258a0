"""The lab's optimiser controls and shared metric definitions (issue 29): beta1, the momentum echo remedies
(`momentum_scale`, `step_scale`), ESS / top-share as the learner defines them, and the graded chain reward."""

import math

import pytest
import torch

from vespo.experiments.lab import LabCell, LabConfig, cells, init_logits, sample_tokens, token_log_probs
from vespo.experiments.lab_model import EOS, ChainPolicy, ChainSpec, lab_step, run_chain_cell
from vespo.losses import compute_policy_loss
from vespo.losses.core import seq_log_ratio, top_share

ADV = torch.tensor([1.0, -1.0] * 4, dtype=torch.float64)


def _stale_pair(cfg: LabConfig, shift: float = 0.0):
    """A v1 lab parameter and Adam after one on-policy step (k = 0), and the mini-batch of the next, stale step
    (`shift` subtracted from mu's log-probs: log W = shift x T on every sequence, so phi is tiny for large shifts)."""
    theta = torch.nn.Parameter(init_logits(8, 4, 0.5, seed=0))
    opt = torch.optim.AdamW([theta], lr=0.1, betas=(cfg.beta1, 0.99), weight_decay=0.0)
    tokens = sample_tokens(theta, 8, torch.Generator().manual_seed(0))
    old = token_log_probs(theta, tokens).detach()
    mask = torch.ones(8, 8, dtype=torch.float64)
    cell = LabCell("vespo", 8, 2, 1.0, 0)
    lab_step(cfg, cell, opt, [theta], token_log_probs(theta, tokens), old, ADV, mask, 0)
    return theta, opt, cell, token_log_probs(theta, tokens), old - shift, mask


def test_beta1_zero_makes_every_lab_step_the_current_gradient():
    for beta1, want_stale in ((0.0, 1.0), (0.9, None)):
        cfg = LabConfig(preset="v1", beta1=beta1)
        theta, opt, cell, lp, old, mask = _stale_pair(cfg)
        assert opt.param_groups[0]["betas"] == (beta1, 0.99)
        stats = lab_step(cfg, cell, opt, [theta], lp, old, ADV, mask, 1)
        if want_stale is not None:
            assert float(stats["momentum_share"]) == want_stale
            # no momentum: the step is the current gradient's part alone
            assert float(stats["update_g_norm"]) == pytest.approx(float(stats["update_norm"]), rel=1e-9)
        else:
            assert 0.0 < float(stats["momentum_share"]) < 1.0
    # the chain cell builds its optimiser from cfg.beta1 too: beta1 = 0 gives share 1 at every mini-batch index
    out = run_chain_cell(LabConfig(beta1=0.0, optimizer_steps=4, mini_batch_seqs=8, rollout_n=4, eval_points=1),
                         LabCell("vespo", 8, 2, 1.0, 0), ChainSpec(vocab=16, rank=4, eval_samples=16))  # fmt: skip
    assert out["per_k"]["momentum_share"] == [1.0, 1.0]


def test_momentum_scale_multiplies_adams_first_moment_by_mean_phi():
    """m_t = beta1 (Z m) + (1 - beta1) g with Z = mean phi (<= 1), instead of beta1 m + (1 - beta1) g."""
    cfg = LabConfig(preset="v1", momentum_scale="mean_phi")
    theta, opt, cell, lp, old, mask = _stale_pair(cfg, shift=0.5)  # log W = 4 per sequence: phi tiny
    m_before = opt.state[theta]["exp_avg"].clone()
    _, metrics = compute_policy_loss("vespo", log_prob=lp.detach(), old_log_prob=old, advantages=ADV,
                                     response_mask=mask)  # fmt: skip
    z = min(float(metrics["vespo/Z"]), 1.0)
    assert z < 0.05  # the stale mini-batch's phi has collapsed
    lab_step(cfg, cell, opt, [theta], lp, old, ADV, mask, 1)
    g = theta.grad
    want = 0.9 * z * m_before + 0.1 * g
    torch.testing.assert_close(opt.state[theta]["exp_avg"], want, rtol=1e-12, atol=1e-15)
    # the default keeps the momentum: m_t = beta1 m + (1 - beta1) g
    cfg0 = LabConfig(preset="v1")
    theta0, opt0, cell0, lp0, old0, mask0 = _stale_pair(cfg0, shift=0.5)
    m0 = opt0.state[theta0]["exp_avg"].clone()
    lab_step(cfg0, cell0, opt0, [theta0], lp0, old0, ADV, mask0, 1)
    torch.testing.assert_close(opt0.state[theta0]["exp_avg"], 0.9 * m0 + 0.1 * theta0.grad, rtol=1e-12, atol=1e-15)


def test_step_scale_moves_the_weights_by_mean_phi_times_adams_step():
    base, scaled = LabConfig(preset="v1"), LabConfig(preset="v1", step_scale="mean_phi")
    moves = []
    for cfg in (base, scaled):
        theta, opt, cell, lp, old, mask = _stale_pair(cfg, shift=0.02)  # log W = 0.16: phi < 1, not tiny
        before = theta.detach().clone()
        stats = lab_step(cfg, cell, opt, [theta], lp, old, ADV, mask, 1)
        moves.append((theta.detach() - before, float(stats["mean_phi"])))
    (full, z), (part, z2) = moves
    assert z == z2 and 0.5 < z < 1.0
    torch.testing.assert_close(part, min(z, 1.0) * full, rtol=1e-9, atol=1e-15)


def test_remedies_refuse_methods_without_phi():
    with pytest.raises(ValueError, match="momentum_scale"):
        cells(LabConfig(methods=("grpo",), momentum_scale="mean_phi"))
    with pytest.raises(ValueError, match="step_scale"):
        cells(LabConfig(methods=("vespo", "topr"), step_scale="mean_phi"))
    with pytest.raises(ValueError, match="beta1"):
        cells(LabConfig(beta1=1.0))


def test_lab_ess_and_top_share_are_the_learners():
    """ESS = the losses' is/ess (guarded log W), W top-share = the learner's is/top1pct_w_share, on a stale batch."""
    cfg = LabConfig(preset="v1")
    theta, opt, cell, lp, old, mask = _stale_pair(cfg)
    lp_d = lp.detach()
    _, metrics = compute_policy_loss("vespo", log_prob=lp_d, old_log_prob=old, advantages=ADV, response_mask=mask)
    stats = lab_step(cfg, cell, opt, [theta], lp, old, ADV, mask, 1)
    assert float(stats["ess"]) == float(metrics["is/ess"]) and float(stats["ess"]) < 1.0
    assert float(stats["w_top1_share"]) == float(top_share(seq_log_ratio(lp_d, old, mask)))
    # by hand: one of 8 sequences carries the top 1% (ceil(0.08) = 1): its W over the sum of all W
    w = torch.exp(seq_log_ratio(lp_d, old, mask))
    assert float(stats["w_top1_share"]) == pytest.approx(float(w.max() / w.sum()), rel=1e-12)


def test_graded_reward_is_the_accuracy_of_a_gradable_response():
    spec = ChainSpec(vocab=16, rank=4, knots=3, min_length=0.5)
    assert spec.reward == "accuracy"  # the lab's default: it does not saturate on-policy
    policy = ChainPolicy(spec, 6, seed=0)
    a = policy.answer
    good = [int(a[16])]
    for _ in range(3):
        good.append(int(a[good[-1]]))
    wrong = next(t for t in range(1, 16) if t != int(a[good[1]]))  # not the answer after good[1]
    tokens = torch.tensor(
        [
            good + [EOS, 5],  # 4 of 4 content tokens correct, ended: R = 1
            good[:2] + [wrong] + [EOS, 5, 5],  # 2 of 3 correct, length 4 >= 3: R = 2/3
            good[:1] + [EOS, 5, 5, 5, 5],  # too short (2 < 3): 0
            good + good[:2],  # no EOS: truncated, 0
        ]
    )
    mask = policy.response_mask(tokens)
    want = torch.tensor([1.0, 2 / 3, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(policy.rewards(tokens, mask, 0.9), want, rtol=1e-12, atol=0)
    thresh = ChainPolicy(ChainSpec(vocab=16, rank=4, knots=3, min_length=0.5, reward="threshold"), 6, seed=0)
    torch.testing.assert_close(thresh.rewards(tokens, mask, 0.6), torch.tensor([1.0, 1.0, 0.0, 0.0]).double())
    assert not math.isclose(float(thresh.rewards(tokens, mask, 0.9)[1]), 2 / 3)
