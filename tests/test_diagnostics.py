"""Regime diagnostics (`vespo.diagnostics`, issue 29): each on a constructed case with the arithmetic written out,
and the learner and the lab both going through the one definition."""

import math

import pytest
import torch

import vespo.diagnostics as diag
from vespo.diagnostics import clip_bound, clip_fraction, mean_phi, momentum_parts, momentum_share, stale_drift


def k3(x: float) -> float:
    return math.exp(x) - 1 - x


# --------------------------------------------------------------------------------------------------------------------
# clip fraction


def test_clip_fraction_by_hand():
    norms = torch.tensor([0.5, 1.5, 1.0, 2.0, 1.0 + 1e-6])
    flags = [clip_bound(n, 1.0) for n in norms]
    # strictly above the bound is cut; a norm equal to it is not (torch leaves it unscaled)
    assert [float(f) for f in flags] == [0.0, 1.0, 0.0, 1.0, 1.0]
    assert float(clip_fraction(flags)) == pytest.approx(3 / 5)
    assert float(clip_fraction(torch.stack(flags[:4]))) == 0.5  # 2 of 4 steps cut
    assert float(clip_bound(torch.tensor(1e9), 0.0)) == 0.0  # max_norm 0: clipping off, never binds


# --------------------------------------------------------------------------------------------------------------------
# KL(mu || pi) and the spread of log W


def test_stale_drift_on_a_hand_made_batch():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], dtype=torch.float64))
    x = torch.tensor([[0.1, -0.2, 0.0], [0.3, 9.0, 0.0], [7.0, 7.0, 7.0]], dtype=torch.float64)  # log pi - log mu
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # row 1's 9.0 and all of row 2 are padding
    out = stale_drift(old + x, old, mask)
    # tokens 0.1, -0.2, 0.3: KL = mean of exp(x) - 1 - x
    assert float(out["kl_mu_pi"]) == pytest.approx((k3(0.1) + k3(-0.2) + k3(0.3)) / 3, rel=1e-12)
    # log W = -0.1 and 0.3 over the two valid sequences (the empty one is not a sequence): mean 0.1, std 0.2
    assert float(out["log_w_std"]) == pytest.approx(0.2, rel=1e-12)
    # on-policy: both 0; one sequence: std 0 (population std, never nan)
    zero = stale_drift(old, old, mask)
    assert float(zero["kl_mu_pi"]) == 0.0 and float(zero["log_w_std"]) == 0.0
    assert float(stale_drift(old[:1] + x[:1], old[:1], mask[:1])["log_w_std"]) == 0.0


def test_stale_drift_uses_the_exact_ratios_not_the_losses_guard():
    """A token 30 nats below mu: the losses clamp its log-ratio at -20, the diagnostic does not."""
    old = torch.zeros(1, 2, dtype=torch.float64)
    lp = torch.tensor([[-30.0, 0.0]], dtype=torch.float64)
    out = stale_drift(torch.cat([lp, old]), torch.cat([old, old]), torch.ones(2, 2))
    assert float(out["log_w_std"]) == pytest.approx(15.0)  # log W = -30 and 0
    assert float(out["kl_mu_pi"]) == pytest.approx(k3(-30.0) / 4)


def test_mean_phi_reads_the_losses_metric():
    assert float(mean_phi({"vespo/Z": torch.tensor(0.25)})) == 0.25
    assert math.isnan(float(mean_phi({"loss/pg": torch.tensor(1.0)})))  # no phi: nan, not 0


# --------------------------------------------------------------------------------------------------------------------
# the momentum share


def _adam_shares(beta1: float, grads: list[list[float]], **kw) -> tuple[list[float], list[float]]:
    """Momentum shares before each step of AdamW on the gradient sequence, and |a + b - ||step|| | per step."""
    p = torch.nn.Parameter(torch.zeros(len(grads[0]), dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=0.1, betas=(beta1, 0.999), weight_decay=0.0, **kw)
    shares, gaps = [], []
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        a, b = momentum_parts(opt)
        shares.append(float(momentum_share(opt)))
        before = p.detach().clone()
        opt.step()
        gaps.append(abs(float(a + b) - float((p.detach() - before).norm())))
    return shares, gaps


def test_momentum_share_is_one_without_momentum_and_decays_with_it():
    """Scalar gradients 1, 1, 1, 0.01. Adam's scale D multiplies both parts of m_t = b1 m + (1 - b1) g alike, so the
    share is (1 - b1) |g| / ((1 - b1) |g| + b1 |m|) with m the moment before the step:
    step 1: m = 0 -> 1; step 2: m = 0.1 -> 0.1 / (0.1 + 0.09) = 0.5263; step 3: m = 0.19 -> 0.1 / 0.271 = 0.3690;
    step 4: m = 0.271, g = 0.01 -> 0.001 / (0.001 + 0.2439) = 0.00408 (the step is Adam's momentum echo)."""
    grads = [[1.0], [1.0], [1.0], [0.01]]
    shares, gaps = _adam_shares(0.9, grads)
    assert shares == pytest.approx([1.0, 0.1 / 0.19, 0.1 / 0.271, 0.001 / 0.2449], rel=1e-12)
    assert max(gaps) < 1e-15  # for a scalar the two parts are collinear: |u_g| + |u_m| is torch's actual step
    shares0, gaps0 = _adam_shares(0.0, grads)
    assert shares0 == [1.0] * 4 and max(gaps0) < 1e-15  # beta1 = 0: every step is the current gradient
    ams, _ = _adam_shares(0.9, grads, amsgrad=True)
    assert ams[:2] == pytest.approx(shares[:2], rel=1e-12)


def test_momentum_share_weighs_each_coordinate_by_adams_normaliser():
    """g1 = (1, 0), g2 = (0, 1): at step 2 u_g lives on coordinate 2, u_m on coordinate 1, each scaled by its own
    D_i = lr / (1 - b1^2) / (sqrt(v_i) / sqrt(1 - b2^2) + eps) with v = (b2 * 0.001, 0.001)."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    shares, _ = _adam_shares(b1, [[1.0, 0.0], [0.0, 1.0]])
    bc2 = math.sqrt(1 - b2**2)
    d1 = 1 / (math.sqrt(b2 * (1 - b2)) / bc2 + eps)
    d2 = 1 / (math.sqrt(1 - b2) / bc2 + eps)
    assert shares == pytest.approx([1.0, (1 - b1) * d2 / ((1 - b1) * d2 + b1 * d1 * (1 - b1))], rel=1e-12)


def test_momentum_share_sgd_and_empty_or_zero_cases():
    p = torch.nn.Parameter(torch.zeros(1))
    sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = torch.ones(1)
    assert float(momentum_share(sgd)) == 1.0  # first step: the buffer is g itself
    sgd.step()
    assert float(momentum_share(sgd)) == pytest.approx(1 / 1.9)  # buf = 0.9 * 1 + g: 1 / (1 + 0.9)
    plain = torch.optim.SGD([p], lr=0.1)
    assert float(momentum_share(plain)) == 1.0
    adam = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.zeros(1)
    assert float(momentum_share(adam)) == 1.0  # no gradient, no state: nothing moves, 1 and not nan
    p.grad = None
    assert float(momentum_share(adam)) == 1.0
    assert math.isnan(float(momentum_share(torch.optim.Adagrad([p], lr=0.1))))  # not defined for other optimizers


# --------------------------------------------------------------------------------------------------------------------
# one definition: the learner and the lab call the same functions


def _learner_history(n_mini_batches: int = 2, **settings):
    from vespo.advantages import group_advantages
    from vespo.embedded.task import arithmetic_split, build_tiny_model, build_tokenizer
    from vespo.rollout import sample
    from vespo.train.learner import UpdateSettings, policy_log_probs, ppo_update

    tok = build_tokenizer()
    model = build_tiny_model(tok, num_hidden_layers=1, seed=0)
    prompts = [p.prompt for p in arithmetic_split(num_operands=2, max_operand=9, eval_size=1)[0][:4]]
    rollout = sample(model, tok, prompts, n=4, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    adv = group_advantages(torch.tensor([float(i % 3 == 0) for i in range(16)]), 4)
    with torch.no_grad():
        old, _ = policy_log_probs(model, rollout, torch.arange(16), micro_batch_size=8, temperature=1.0)
    cfg = UpdateSettings(
        method="vespo", num_mini_batches=n_mini_batches, seqs_per_mini_batch=16 // n_mini_batches, micro_batch_size=4
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=settings.pop("betas", (0.9, 0.99)))
    return ppo_update(model, opt, rollout, adv, old, cfg)


def _lab_step_stats(method: str = "vespo"):
    from vespo.experiments.lab import LabCell, LabConfig, init_logits, sample_tokens, token_log_probs
    from vespo.experiments.lab_model import lab_step

    cfg = LabConfig(preset="v1")
    cell = LabCell(method, 8, 2, 1.0, 0)
    theta = torch.nn.Parameter(init_logits(8, 4, 0.5, seed=0))
    opt = torch.optim.AdamW([theta], lr=0.1, betas=(0.9, 0.99), weight_decay=0.0)
    tokens = sample_tokens(theta, 8, torch.Generator().manual_seed(0))
    old = token_log_probs(theta, tokens).detach()
    adv = torch.tensor([1.0, -1.0] * 4, dtype=torch.float64)
    mask = torch.ones(8, 8, dtype=torch.float64)
    return [lab_step(cfg, cell, opt, [theta], token_log_probs(theta, tokens), old, adv, mask, k) for k in range(2)]


def test_learner_and_lab_report_the_diagnostics():
    from vespo.train.learner import summarize_update, to_floats

    hist = _learner_history()
    summary = to_floats(summarize_update(hist))
    assert summary["actor/momentum_share/first_mini_batch"] <= 1.0
    assert summary["actor/momentum_share/last_mini_batch"] < 1.0  # the second step carries the first's momentum
    assert summary["is/kl_mu_pi/first_mini_batch"] == 0.0 and summary["is/log_w_std/first_mini_batch"] == 0.0
    assert summary["is/kl_mu_pi/last_mini_batch"] > 0.0 and summary["is/log_w_std/last_mini_batch"] > 0.0
    assert summary["vespo/Z/first_mini_batch"] == pytest.approx(1.0)  # phi(1) = 1 on-policy
    assert 0.0 <= summary["actor/grad_clipped"] <= 1.0
    no_momentum = to_floats(summarize_update(_learner_history(betas=(0.0, 0.99))))
    assert no_momentum["actor/momentum_share"] == 1.0
    stats = _lab_step_stats()
    assert float(stats[0]["momentum_share"]) == 1.0 and float(stats[1]["momentum_share"]) < 1.0
    assert float(stats[0]["kl_mu_pi"]) == 0.0 and float(stats[1]["kl_mu_pi"]) > 0.0
    assert float(stats[0]["mean_phi"]) == pytest.approx(1.0)  # phi(1) = 1
    assert math.isnan(float(_lab_step_stats("grpo")[0]["mean_phi"]))  # no phi: nan


def test_learner_and_lab_share_one_definition(monkeypatch):
    """Patch the shared functions: both loops report the patched values, so neither keeps a copy."""
    monkeypatch.setattr(diag, "momentum_share", lambda opt: torch.tensor(0.125))
    monkeypatch.setattr(diag, "stale_drift", lambda lp, old, mask: {"kl_mu_pi": lp.new_tensor(0.25),
                                                                     "log_w_std": lp.new_tensor(0.5)})  # fmt: skip
    monkeypatch.setattr(diag, "clip_bound", lambda norm, max_norm: torch.tensor(0.75))
    monkeypatch.setattr(diag, "mean_phi", lambda metrics: torch.tensor(0.375))
    for h in _learner_history():
        assert float(h["actor/momentum_share"]) == 0.125 and float(h["actor/grad_clipped"]) == 0.75
        assert float(h["is/kl_mu_pi"]) == 0.25 and float(h["is/log_w_std"]) == 0.5
    for s in _lab_step_stats():
        assert float(s["momentum_share"]) == 0.125 and float(s["grad_clipped"]) == 0.75
        assert float(s["kl_mu_pi"]) == 0.25 and float(s["log_w_std"]) == 0.5 and float(s["mean_phi"]) == 0.375


def test_ess_and_top_share_are_the_losses_own():
    """The lab keeps no ESS or top-share of its own: it calls the functions the losses and the learner call."""
    import vespo.experiments.lab_model as lab_model
    import vespo.losses.core as core
    import vespo.train.learner as learner
    from vespo.kernels import effective_sample_size

    assert lab_model.top_share is core.top_share is learner.top_share
    assert lab_model.effective_sample_size is effective_sample_size


@pytest.mark.parametrize("amsgrad", [False, True])
def test_momentum_parts_do_not_depend_on_how_parameters_are_bucketed(monkeypatch, amsgrad):
    """Parameters are concatenated into buckets and cut into slices (bounded temporaries, few kernels): a bucket of 7
    elements (every parameter cut, slices of several parameters sharing buckets) gives the float64 values of one
    bucket per parameter group, with a state-less parameter (m = v = 0) among stateful ones."""
    import vespo.diagnostics as diag

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n, dtype=torch.float64)) for n in (3, 11, 20, 1)]
    opt = torch.optim.AdamW(params, lr=0.1, amsgrad=amsgrad)
    for p in params[:3]:
        p.grad = torch.randn_like(p)
    opt.step()  # params[3] has no state yet
    for p in params:
        p.grad = torch.randn_like(p)
    want = momentum_parts(opt)
    monkeypatch.setattr(diag, "_BUCKET", 7)
    got = momentum_parts(opt)
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-12)
    assert float(got[1]) == pytest.approx(float(want[1]), rel=1e-12)
    assert float(want[1]) > 0  # the stateful parameters carry momentum
