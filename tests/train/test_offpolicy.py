"""The off-policy corrections of 2025-26 (issue 40): M2PO, OPSM, AIPO and VCPO, against hand-computed values, their
sources (TRL's code called; the others' formulas transcribed as oracles, each citing its file), gradients, the
mini-batch decision under micro-batching, and VCPO's step control and baseline in the learner."""

import copy
import math

import pytest
import torch
from _optional import require

import vespo
from vespo import PolicyBatch, compute_policy_loss, policy_loss_terms
from vespo.advantages import group_advantages, opob_advantages
from vespo.losses.adaptive import BatchContext, batch_context
from vespo.losses.offpolicy import m2po_cutoff, off_policy_sequence_mask
from vespo.step_control import sampler_log_w, step_scale


def run(method, lp, old, adv, mask, **kw):
    loss, metrics = compute_policy_loss(method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, **kw)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.item(), grad, {k: float(v) for k, v in metrics.items()}


def batch(B=6, T=7, scale=0.4, seed=0):
    """Random off-policy batch in float64: ragged rows, per-token log(pi/mu) ~ N(0, scale^2), A of both signs."""
    g = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 4.0).requires_grad_()
    old = lp.detach() - scale * torch.randn(B, T, generator=g, dtype=torch.float64)  # log-probs <= 0 for scale <= 1
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T)
    for i in range(B):
        mask[i, 2 + (i * 3) % (T - 2) :] = 0
    return lp, old, adv, mask


# ---------------------------------------------------------------------------------------------------------------------
# M2PO


# log(pi/mu) per token; A = (+1, -1). Trust-region tokens (A > 0, r > 1 or A < 0, r < 1): 0.5, 0.1 | -0.3, -0.05,
# M2 = 0.25, 0.01, 0.09, 0.0025: mean 0.088 > 0.04; without 0.25 the mean is 0.1025 / 3 = 0.0342 <= 0.04: stop.
M2_DELTA = [[0.5, -0.2, 0.1], [-0.3, 0.4, -0.05]]


def m2_example():
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.5, -2.5]], dtype=torch.float64, requires_grad=True)
    return lp, lp.detach() - torch.tensor(M2_DELTA, dtype=torch.float64), torch.tensor([1.0, -1.0]), torch.ones(2, 3)


def test_m2po_hand_computed():
    lp, old, adv, mask = m2_example()
    loss, grad, m = run("m2po", lp, old, adv, mask)
    r = torch.tensor(M2_DELTA, dtype=torch.float64).exp()
    keep = torch.ones(2, 3, dtype=torch.float64)
    keep[0, 0] = 0  # the largest M2 goes; the rest meet tau = 0.04
    a = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, -(r * a * keep) / 6, rtol=1e-12, atol=0)  # token-mean over all 6 tokens
    assert loss == pytest.approx(float((-(r * a * keep)).sum() / 6), rel=1e-12)
    assert m["m2po/masked_frac"] == pytest.approx(1 / 6)
    assert m["m2po/m2"] == pytest.approx(0.3525 / 4) and m["m2po/m2_after"] == pytest.approx(0.1025 / 3)
    _, grad, m = run("m2po", lp, old, adv, mask, m2_threshold=0.1)  # 0.088 <= 0.1: nothing masked
    assert m["m2po/masked_frac"] == 0.0 and grad[0, 0].item() == pytest.approx(-math.exp(0.5) / 6)
    _, grad, m = run("m2po", lp, old, adv, mask, m2_threshold=0.001)  # every trust-region token goes, the others stay
    assert m["m2po/masked_frac"] == pytest.approx(4 / 6) and m["m2po/m2_after"] == 0.0
    assert grad[0, 1].item() == pytest.approx(-math.exp(-0.2) / 6) and grad[1, 1].item() == pytest.approx(
        math.exp(0.4) / 6
    )
    assert grad[0, 0].item() == grad[0, 2].item() == grad[1, 0].item() == grad[1, 2].item() == 0.0


def m2po_algorithm1(log_ratio, adv, mask, tau):
    """The oracle, written as the source states it: Algorithm 1 of M2PO (Infini-AI-Lab/M2PO, project page
    `docs/index.html`, figure `docs/static/m2po-images/alg.jpg`) over the trust-region tokens of
    `verl/trainer/ppo/core_algos.py::_get_trust_region_tokens_delta_sq` (A > 0 and r > 1, or A < 0 and r < 1):
    while the mean M2 of T exceeds tau, mask argmax M2 and remove it from T. Returns the keep mask."""
    keep = torch.ones_like(log_ratio, dtype=torch.bool)
    region = {}
    for i, j in mask.nonzero().tolist():
        x, a = log_ratio[i, j].item(), adv[i].item()
        if (a > 0 and x > 0) or (a < 0 and x < 0):
            region[(i, j)] = x * x
    while region and sum(region.values()) / len(region) > tau:
        worst = max(region, key=region.get)
        keep[worst] = False
        del region[worst]
    return keep


@pytest.mark.parametrize("tau", [0.04, 0.01, 0.2])
@pytest.mark.parametrize("seed", range(4))
def test_m2po_equals_algorithm1(tau, seed):
    lp, old, adv, mask = batch(seed=seed, scale=0.4)
    keep = m2po_algorithm1((lp.detach() - old), adv, mask, tau)
    loss_mat, m = policy_loss_terms("m2po", PolicyBatch(lp, old, adv, mask), m2_threshold=tau)
    want = -(lp.detach() - old).exp() * adv[:, None] * keep
    valid = mask.bool()
    torch.testing.assert_close(loss_mat[valid].detach(), want[valid], rtol=1e-12, atol=0)
    masked = ((~keep) & valid).sum().item()
    assert float(m["m2po/masked_frac"]) == pytest.approx(masked / valid.sum().item())
    if tau == 0.04:
        assert masked > 0  # the case can fail: the cutoff binds


def test_m2po_cutoff_ties_and_empty():
    # no trust-region token: nothing to mask
    cutoff, before, after = m2po_cutoff(torch.full((3, 2), -1.0), 0.04)
    assert math.isinf(cutoff.item()) and before.item() == 0.0 and after.item() == 0.0
    # two tied largest values: masking the first already meets tau; the tie goes with it (the mean only falls)
    cutoff, _, after = m2po_cutoff(torch.tensor([0.5, 0.5, 0.01, -1.0]), 0.2)
    assert cutoff.item() == 0.5 and after.item() == pytest.approx(0.01)


def test_m2po_mini_batch_decision_is_micro_batch_invariant():
    """Micro-batches given the mini-batch's statistics accumulate exactly the one-pass gradient; deciding on each
    micro-batch's own tokens (what AReaL and the official code do per call) gives another."""
    lp, old, adv, mask = batch(B=8, seed=3, scale=0.5)
    _, grad_full, m = run("m2po", lp, old, adv, mask)
    assert m["m2po/masked_frac"] > 0
    ctx = batch_context(PolicyBatch(lp.detach(), old, adv, mask))
    n_tok = mask.sum()

    def accumulate(context):
        total = torch.zeros_like(lp)
        for sl in (slice(0, 3), slice(3, 8)):
            x = lp.detach()[sl].clone().requires_grad_()
            kw = {} if context is None else {"batch_context": context}
            loss, _ = compute_policy_loss(
                "m2po", log_prob=x, old_log_prob=old[sl], advantages=adv[sl], response_mask=mask[sl],
                global_num_tokens=n_tok, **kw,
            )  # fmt: skip
            loss.backward()
            total[sl] = x.grad
        return total

    torch.testing.assert_close(accumulate(ctx), grad_full, rtol=1e-12, atol=1e-15)
    assert not torch.allclose(accumulate(None), grad_full, rtol=1e-6, atol=1e-9)


def test_trainer_micro_batches_decide_m2po_like_one_pass(monkeypatch):
    """`vespo train`'s update: a mini-batch of 4 sequences in micro-batches of 3 moves the weights as one pass (the
    extra no-grad forward gives every micro-batch the mini-batch's M2), and a per-micro-batch decision does not."""
    from _support import run_update

    from vespo.embedded.task import arithmetic_split, build_tiny_model, build_tokenizer
    from vespo.rollout import sample
    from vespo.train.config import TrainConfig
    from vespo.train.learner import policy_log_probs

    tok = build_tokenizer()
    prompts = [p.prompt for p in arithmetic_split(num_operands=2, max_operand=9, eval_size=1)[0][:4]]

    def update(micro):
        model = build_tiny_model(tok, num_hidden_layers=1, seed=1)
        rollout = sample(model, tok, prompts, n=4, max_new_tokens=6, generator=torch.Generator().manual_seed(1))
        adv = group_advantages(torch.tensor([float(i % 3 == 0) for i in range(16)]), 4)
        cfg = TrainConfig(method="m2po", hparams={"m2_threshold": 3e-4}, train_batch_size=4, ppo_mini_batch_size=1,
                          rollout_n=4, micro_batch_size=micro, lr=0.05)  # fmt: skip
        with torch.no_grad():
            old, _ = policy_log_probs(model, rollout, torch.arange(16), micro_batch_size=16, temperature=1.0)
        hist = run_update(model, torch.optim.SGD(model.parameters(), lr=cfg.optimizer.lr), rollout, adv, old, cfg)
        return torch.cat([p.detach().flatten() for p in model.parameters()]), hist

    one, hist = update(16)
    split, _ = update(3)
    torch.testing.assert_close(split, one, rtol=1e-5, atol=1e-6)
    assert float(hist[-1]["m2po/masked_frac"]) > 0  # stale mini-batch: the mask acted
    import vespo.train.learner as learner

    monkeypatch.setattr(
        learner, "_batch_context", lambda *a, index, **kw: BatchContext(mini_batch_index=index, num_mini_batches=4)
    )
    local, _ = update(3)
    assert not torch.allclose(local, one, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# OPSM: TRL's own `GRPOTrainer.get_off_policy_mask` on the same inputs


def opsm_batch(seed=0):
    lp, old, adv, mask = batch(B=8, seed=seed, scale=0.3)
    g = torch.Generator().manual_seed(100 + seed)
    # rows drift from pi by a growing mean KL(sampler || pi): 0 for row 0 to ~0.5 per token for row 7
    sampler = lp.detach() + torch.rand(old.shape, generator=g, dtype=old.dtype) * torch.arange(8)[:, None] / 7
    return lp, old, adv, mask, sampler


@pytest.mark.parametrize("seed", range(3))
def test_opsm_mask_and_loss_equal_trls(seed):
    require("trl")
    from trl import GRPOTrainer

    lp, old, adv, mask, sampler = opsm_batch(seed)
    threshold = 0.3
    keep_trl = GRPOTrainer.get_off_policy_mask(adv[:, None], lp, sampler, mask.double(), threshold)
    keep = off_policy_sequence_mask(adv[:, None], lp, sampler, mask.double(), threshold)
    assert torch.equal(keep, keep_trl)
    assert 0 < int((keep == 0).sum()) < int((adv < 0).sum())  # some negative sequences dropped, not all
    # TRL's loss_type="grpo" with that mask (trl/trainer/grpo_trainer.py, `_compute_loss`): PPO clip at epsilon 0.2,
    # averaged per sequence, then over sequences; no vLLM ratio (vespo: rollout_is=None, the sampler only measured)
    coef_1 = torch.exp(lp - old)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.2)
    per_token = -torch.min(coef_1 * adv[:, None], coef_2 * adv[:, None]) * keep_trl
    ref = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    (ref_grad,) = torch.autograd.grad(ref, lp)
    loss, grad, m = run("opsm", lp, old, adv, mask, rollout_log_prob=sampler, rollout_is=None,
                        off_policy_mask_threshold=threshold)  # fmt: skip
    assert loss == pytest.approx(ref.item(), rel=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-9)
    assert m["opsm/masked_frac"] == pytest.approx(int((keep == 0).sum()) / 8)


def test_opsm_hand_computed_and_sampler_fallback():
    # one sequence, A = -1, per-token log(pi_sampler/pi) = (0.2, 0.6): mean 0.4 > delta = 0.3 -> dropped
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    sampler = lp.detach() + torch.tensor([[0.2, 0.6]], dtype=torch.float64)
    adv, mask = torch.tensor([-1.0]), torch.ones(1, 2)
    only = {"rollout_log_prob": sampler, "rollout_is": None}  # the sampler measured, no importance weight from it
    loss, grad, m = run("opsm", lp, lp.detach(), adv, mask, off_policy_mask_threshold=0.3, **only)
    assert loss == 0.0 and grad.abs().max() == 0 and m["opsm/masked_frac"] == 1.0
    _, grad, m = run("opsm", lp, lp.detach(), adv, mask, off_policy_mask_threshold=0.5, **only)
    assert m["opsm/masked_frac"] == 0.0 and grad[0, 0].item() == pytest.approx(0.5)  # kept: -A r / |o|, r = 1
    _, _, m = run("opsm", lp, lp.detach(), torch.tensor([1.0]), mask, off_policy_mask_threshold=0.3, **only)
    assert m["opsm/masked_frac"] == 0.0  # A >= 0 is never dropped
    # without the sampler's log-probs the divergence is measured from mu (TRL's fallback): here mu = pi, KL 0
    _, _, m = run("opsm", lp, lp.detach(), adv, mask, off_policy_mask_threshold=0.3)
    assert m["opsm/masked_frac"] == 0.0
    _, _, m = run("opsm", lp, sampler, adv, mask, off_policy_mask_threshold=0.3)
    assert m["opsm/masked_frac"] == 1.0


# ---------------------------------------------------------------------------------------------------------------------
# AIPO: prime-rl's token-level loss


def aipo_oracle(lp, old, adv, mask, clip_ratio=8.0):
    """prime-rl `src/prime_rl/trainer/loss.py::grpo_loss_ratio` (the `ratio` loss, `RatioConfig.clip_ratio` = 8 in
    `src/prime_rl/trainer/config.py`): ratio = clamp(exp(lp - old), 0, clip_ratio), loss = -ratio * A, masked sum over
    the total token count (docs/async.md's 1 / sum |y|)."""
    ratio = torch.clamp(torch.exp(lp - old), 0, clip_ratio)
    return (-ratio * adv[:, None] * mask).sum() / mask.sum()


@pytest.mark.parametrize("clip_ratio", [8.0, 1.3])
def test_aipo_equals_prime_rl(clip_ratio):
    lp, old, adv, mask = batch(seed=5, scale=0.8)
    ref = aipo_oracle(lp, old, adv, mask, clip_ratio)
    (ref_grad,) = torch.autograd.grad(ref, lp)
    loss, grad, m = run("aipo", lp, old, adv, mask, delta=clip_ratio)
    assert loss == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=0)
    capped = ((lp.detach() - old).exp() > clip_ratio) & mask.bool()
    assert m["clip/frac"] == pytest.approx(capped.sum().item() / mask.sum().item())
    if clip_ratio < 2:
        assert capped.any() and (grad[capped] == 0).all()  # min(r, delta): a capped token has no gradient


def test_aipo_hand_computed():
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = lp.detach() - torch.tensor([[0.5, 2.5]], dtype=torch.float64)  # r = e^0.5, e^2.5 = 12.2 > 8
    loss, grad, _ = run("aipo", lp, old, torch.tensor([2.0]), torch.ones(1, 2))
    assert loss == pytest.approx(-2.0 * (math.exp(0.5) + 8.0) / 2)
    assert grad[0, 0].item() == pytest.approx(-2.0 * math.exp(0.5) / 2) and grad[0, 1].item() == 0.0


# ---------------------------------------------------------------------------------------------------------------------
# VCPO: its loss, ESS step scaling in the learner's step path, the off-policy optimal baseline


def test_vcpo_loss_hand_computed():
    lp, old, adv, mask = batch(seed=6, scale=0.6)
    _, grad, _ = run("vcpo", lp, old, adv, mask)
    r = (lp.detach() - old).exp()
    lengths = mask.sum(-1, keepdim=True)
    want = -r * adv[:, None] * mask / lengths / mask.shape[0]  # unclipped r * A, seq-mean-token-mean
    torch.testing.assert_close(grad, want, rtol=1e-12, atol=0)


def test_ess_step_scale_hand_computed():
    # w = (1, 3): ESS = (1 + 3)^2 / (2 (1 + 9)) = 0.8, s = sqrt(0.8); the sampler's part of w counts
    out = step_scale("ess_sqrt", log_w=torch.tensor([0.0, math.log(3.0)]), valid=torch.tensor([True, True]))
    assert out["actor/step_ess"].item() == pytest.approx(0.8) and out["actor/step_scale"].item() == pytest.approx(
        0.8**0.5
    )
    lp = torch.zeros(2, 2)
    mask = torch.ones(2, 2)
    log_w = sampler_log_w(lp, lp - 0.1, lp - 0.1 - torch.tensor([[0.0, 0.0], [0.3, 0.0]]), mask)
    torch.testing.assert_close(log_w, torch.tensor([0.2, 0.5]))  # sum log(pi/mu) + sum log(mu/pi_rollout)
    far = step_scale("ess_sqrt", log_w=torch.tensor([0.0, -1e4]), valid=torch.tensor([True, True]))
    assert far["actor/step_ess"].item() == pytest.approx(0.5)  # one sample carries it all: 1/n, finite


def _learner_setup(seed=0):
    from vespo.embedded.task import arithmetic_split, build_tiny_model, build_tokenizer
    from vespo.rollout import sample
    from vespo.train.learner import policy_log_probs

    tok = build_tokenizer()
    model = build_tiny_model(tok, num_hidden_layers=1, seed=seed)
    prompts = [p.prompt for p in arithmetic_split(num_operands=2, max_operand=9, eval_size=1)[0][:4]]
    rollout = sample(model, tok, prompts, n=4, max_new_tokens=6, generator=torch.Generator().manual_seed(seed))
    rewards = torch.tensor([float(i % 3 == 0) + 0.1 * (i % 4) for i in range(16)])
    with torch.no_grad():
        old, _ = policy_log_probs(model, rollout, torch.arange(16), micro_batch_size=8, temperature=1.0)
    return model, rollout, rewards, old


def test_ess_sqrt_moves_the_weights_like_adamw_at_the_scaled_lr():
    """VCPO scales AdamW's lr by s = sqrt(ESS/B) for the step; the learner's step path (theta_old + s (theta_adam -
    theta_old), shared with mean_phi) gives the same weights, and s is the ESS of pi/pi_sampler."""
    from vespo.train.learner import Learner, UpdateBatch, UpdateSettings, ppo_update

    model, rollout, rewards, old = _learner_setup()
    adv = group_advantages(rewards, 4)
    stale = old + 0.4 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2)) * rollout.response_mask
    sampler = stale - 0.2 * rollout.response_mask
    settings = UpdateSettings(method="vcpo", seqs_per_mini_batch=16, micro_batch_size=8, step_scale="ess_sqrt")
    scaled = copy.deepcopy(model)
    hist, _ = ppo_update(Learner(scaled, torch.optim.AdamW(scaled.parameters(), lr=1e-2), settings),
                         UpdateBatch(rollout, adv, stale, rollout_log_prob=sampler))  # fmt: skip
    s = float(hist[0]["actor/step_scale"])
    assert 0.05 < s < 0.95  # the test can fail: the step is far from unscaled
    with torch.no_grad():
        from vespo.train.learner import policy_log_probs

        lp, _ = policy_log_probs(model, rollout, torch.arange(16), micro_batch_size=8, temperature=1.0)
    rho = vespo.kernels.effective_sample_size(sampler_log_w(lp, stale, sampler, rollout.response_mask.float()))
    assert float(hist[0]["actor/step_ess"]) == pytest.approx(float(rho), rel=1e-5) and s == pytest.approx(rho**0.5)
    plain = copy.deepcopy(model)
    plain_settings = UpdateSettings(method="vcpo", seqs_per_mini_batch=16, micro_batch_size=8)
    ppo_update(Learner(plain, torch.optim.AdamW(plain.parameters(), lr=1e-2 * s), plain_settings),
               UpdateBatch(rollout, adv, stale, rollout_log_prob=sampler))  # fmt: skip
    for a, b in zip(scaled.parameters(), plain.parameters(), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def opob_oracle(rewards, weights, group_size, norm_by_std=True, eps=1e-8):
    """VCPO's baseline and advantage as its code assembles them (mit-han-lab/vcpo: `recipe/fully_async_policy/
    staleness_utils.py::compute_opob_baseline`, group scope, `get_weighted_mean`; `verl/workers/actor/
    megatron_actor.py::_update_grad_buffers`: grad = sum_i (R_i / std) g_i - b sum_i g_i / std, std the group's
    population std when > 1e-8), one group at a time in Python floats."""
    out = []
    for start in range(0, len(rewards), group_size):
        r, w = rewards[start : start + group_size], weights[start : start + group_size]
        b = sum(x * y for x, y in zip(r, w, strict=True)) / (sum(w) + eps)
        std = float(torch.tensor(r, dtype=torch.float64).std(unbiased=False))
        scale = std if norm_by_std and std > 1e-8 else 1.0
        out += [(x - b) / scale for x in r]
    return out


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_opob_equals_vcpos_baseline(norm_by_std):
    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(12, generator=g) > 0.5).double() + 0.1 * torch.rand(12, generator=g, dtype=torch.float64)
    rewards[8:] = 1.0  # a group with zero std: no division
    log_w = 2.0 * torch.randn(12, generator=g, dtype=torch.float64)
    got = opob_advantages(rewards, 4, log_w, norm_by_std=norm_by_std)
    want = opob_oracle(rewards.tolist(), log_w.exp().tolist(), 4, norm_by_std)
    torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype), rtol=1e-12, atol=1e-15)
    # equal weights: the baseline is the group mean, i.e. GRPO's advantage with the population std
    flat = opob_advantages(rewards, 4, torch.zeros(12, dtype=torch.float64), norm_by_std=norm_by_std)
    r = rewards.view(-1, 4)
    grpo = (r - r.mean(-1, keepdim=True)) / torch.where(
        (r.std(-1, keepdim=True, unbiased=False) > 1e-8) & norm_by_std, r.std(-1, keepdim=True, unbiased=False), 1.0
    )
    torch.testing.assert_close(flat, grpo.flatten(), rtol=1e-7, atol=1e-7)


def test_opob_extreme_weights_are_finite():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = opob_advantages(rewards, 4, torch.tensor([1e4, 0.0, -1e4, 0.0]))  # w^2 overflows every float format
    assert torch.isfinite(adv).all()
    torch.testing.assert_close(adv, (rewards - 1.0) / rewards.std(unbiased=False))  # b = R of the dominant sample
    adv = opob_advantages(rewards, 4, torch.full((4,), -math.inf))  # every weight 0: b = 0, as VCPO's eps gives
    torch.testing.assert_close(adv, rewards / rewards.std(unbiased=False))
    with pytest.raises(ValueError, match="divisible by group_size=3"):
        opob_advantages(rewards, 3, torch.zeros(4))


def test_opob_weights_are_per_sequence_gradient_norms_and_train_any_method():
    """`opob_log_weights` = log ||grad sum_t r_t||^2 + 2 log w per sequence (checked with one backward per row by
    hand), and the opob update equals a plain update on the advantages they give, for VESPO as for VCPO's loss."""
    from vespo.train.learner import Learner, UpdateBatch, UpdateSettings, policy_log_probs, ppo_update
    from vespo.train.opob import opob_log_weights

    model, rollout, rewards, old = _learner_setup(1)
    sampler = old - 0.1 * rollout.response_mask
    s = UpdateSettings(method="vespo", seqs_per_mini_batch=16, micro_batch_size=16, adv_estimator="opob", group_size=4)
    rows = torch.arange(16)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    log_probs = lambda row: policy_log_probs(model, rollout, row, micro_batch_size=1, temperature=1.0)[0]
    log_v = opob_log_weights(log_probs, params, rows, old_log_prob=old, rollout_log_prob=sampler,
                             response_mask=rollout.response_mask)  # fmt: skip
    for i in (0, 7):
        lp, _ = policy_log_probs(model, rollout, rows[i : i + 1], micro_batch_size=1, temperature=1.0)
        m = rollout.response_mask[i : i + 1]
        score = ((lp - old[i : i + 1]).exp() * m).sum()
        sq = sum(g.square().sum() for g in torch.autograd.grad(score, params))
        log_w = ((lp.detach() - old[i : i + 1]) * m).sum() + ((old[i : i + 1] - sampler[i : i + 1]) * m).sum()
        assert log_v[i].item() == pytest.approx((sq.log() + 2 * log_w).item(), rel=1e-5)
    adv = opob_advantages(rewards, 4, log_v)
    for method in ("vespo", "vcpo"):
        a, b = copy.deepcopy(model), copy.deepcopy(model)
        opob = UpdateSettings(method=method, seqs_per_mini_batch=16, micro_batch_size=16, adv_estimator="opob",
                              group_size=4)  # fmt: skip
        hist, _ = ppo_update(Learner(a, torch.optim.SGD(a.parameters(), lr=0.05), opob),
                             UpdateBatch(rollout, group_advantages(rewards, 4), old, rollout_log_prob=sampler,
                                         rewards=rewards))  # fmt: skip
        plain = UpdateSettings(method=method, seqs_per_mini_batch=16, micro_batch_size=16)
        ppo_update(Learner(b, torch.optim.SGD(b.parameters(), lr=0.05), plain),
                   UpdateBatch(rollout, adv, old, rollout_log_prob=sampler))  # fmt: skip
        for x, y in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)
        assert float(hist[0]["opob/baseline_gap"]) > 1e-3  # the baseline moved off the group mean
    with pytest.raises(ValueError, match="needs the rewards"):
        ppo_update(Learner(model, torch.optim.SGD(model.parameters(), lr=0.05), s), UpdateBatch(rollout, adv, old))


def test_config_checks_for_the_new_controls():
    from vespo.train.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="adv_estimator=opob .* needs mode=sync and shuffle=false"):
        TrainConfig(adv_estimator="opob", shuffle=True, run_dir="/tmp/vespo-test-unused")
    with pytest.raises(ConfigError, match=r"eval_top_p must be a finite number in \[1e-06, 1\]"):
        TrainConfig(eval_top_p=1.5, run_dir="/tmp/vespo-test-unused")
    TrainConfig(method="grpo", step_scale="ess_sqrt", run_dir="/tmp/vespo-test-unused")  # any method


def test_the_four_are_registered_with_their_sources_defaults():
    hp = {m: vespo.method_hparams(m) for m in ("m2po", "opsm", "aipo", "vcpo")}
    assert hp["m2po"]["m2_threshold"] == 0.04  # the paper's tau_M2, every run
    assert (hp["opsm"]["clip_ratio_low"], hp["opsm"]["clip_ratio_high"]) == (0.2, 0.2)  # TRL's epsilon
    assert hp["opsm"]["off_policy_mask_threshold"] == 0.5  # TRL's documented example
    assert hp["aipo"]["delta"] == 8.0  # prime-rl's RatioConfig.clip_ratio
    for method, bad, message in [
        ("m2po", {"m2_threshold": 0.0}, r"m2_threshold must be in \(0, inf\)"),
        ("aipo", {"delta": -1.0}, r"delta must be in \(0, inf\)"),
        ("opsm", {"off_policy_mask_threshold": "high"}, "must be a finite real number"),
    ]:
        with pytest.raises(ValueError, match=message):
            vespo.validate_hparams(method, **bad)


@pytest.mark.parametrize("method", ["m2po", "opsm", "aipo", "vcpo"])
def test_lab_trains_the_four(method):
    from vespo.experiments.lab import LabCell, LabConfig, run_cell

    out = run_cell(LabConfig(optimizer_steps=4, mini_batch_seqs=16, eval_points=1), LabCell(method, 8, 2, 1.0, 0))
    assert out["summary"]["finite"] == 1 and math.isfinite(out["summary"]["final_reward"])


def test_lab_step_scale_ess_sqrt_is_the_learners():
    """The lab's `--step-scale ess_sqrt` is the learner's control (`vespo.step_control`): accepted for any method (it
    needs no phi), and it shrinks a stale mini-batch's step; `mean_phi` stays VESPO-family only."""
    from vespo.experiments.lab import LabCell, LabConfig, cells, run_cell

    assert len(cells(LabConfig(methods=("grpo", "vcpo"), step_scale="ess_sqrt", length=(8,), num_mini_batches=(4,),
                               lr_scale=(1.0,), seeds=(0,)))) == 2  # fmt: skip
    with pytest.raises(ValueError, match="step_scale must be none or ess_sqrt unless every method is VESPO-family"):
        cells(LabConfig(methods=("grpo",), step_scale="mean_phi"))
    runs = {}
    for kind in ("none", "ess_sqrt"):
        cfg = LabConfig(optimizer_steps=4, mini_batch_seqs=16, eval_points=1, step_scale=kind)  # one rollout step
        runs[kind] = run_cell(cfg, LabCell("grpo", 16, 4, 3.0, 0))["per_k"]["update_norm"]
    assert runs["ess_sqrt"][0] == pytest.approx(runs["none"][0], rel=1e-6)  # k = 0: W = 1, ESS = 1, s = 1
    assert runs["ess_sqrt"][-1] < runs["none"][-1]  # the stalest mini-batch moves less


@pytest.mark.parametrize(("eval_top_p", "want"), [(None, 0.9), (0.7, 0.7)])
def test_eval_top_p_is_the_held_out_nucleus(monkeypatch, eval_top_p, want):
    """The official VESPO evaluation samples at top_p 0.7 (its scripts' val_kwargs): `eval_top_p` sets the held-out
    nucleus; None keeps the training top_p (every earlier result)."""
    import vespo.train.setup as setup
    from vespo.train.config import TrainConfig

    seen = {}
    monkeypatch.setattr(setup, "evaluate_records", lambda *a, **kw: seen.update(kw) or {"eval/heldout/avg@1": 0.5})
    cfg = TrainConfig(top_p=0.9, eval_top_p=eval_top_p, temperature=0.8)
    assert setup.evaluate(None, None, [], cfg.run, cfg.sampling, chat=False, chunk=1) == {"eval/accuracy": 0.5}
    assert (seen["top_p"], seen["temperature"]) == (want, 0.8)
