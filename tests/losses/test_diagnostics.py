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


def _tiny_update(
    method: str = "vespo",
    n_mini_batches: int = 2,
    *,
    hparams: dict | None = None,
    lr: float = 1e-2,
    betas=(0.9, 0.99),
    micro_batch_size: int = 4,
    **kw,
):
    """ppo_update on a batch the tiny model sampled (4 prompts x 4, fixed seeds); returns (history, parameters after
    the update). `kw` goes to `UpdateSettings`, except `probe`, which goes to `ppo_update`."""
    from vespo.advantages import group_advantages
    from vespo.embedded.task import arithmetic_split, build_tiny_model, build_tokenizer
    from vespo.rollout import sample
    from vespo.train.learner import Learner, UpdateBatch, UpdateSettings, policy_log_probs, ppo_update

    tok = build_tokenizer()
    model = build_tiny_model(tok, num_hidden_layers=1, seed=0)
    prompts = [p.prompt for p in arithmetic_split(num_operands=2, max_operand=9, eval_size=1)[0][:4]]
    rollout = sample(model, tok, prompts, n=4, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    adv = group_advantages(torch.tensor([float(i % 3 == 0) for i in range(16)]), 4)
    with torch.no_grad():
        old, _ = policy_log_probs(model, rollout, torch.arange(16), micro_batch_size=8, temperature=1.0)
    probe = kw.pop("probe", False)
    cfg = UpdateSettings(method=method, hparams=hparams or {}, num_mini_batches=n_mini_batches,
                         seqs_per_mini_batch=16 // n_mini_batches, micro_batch_size=micro_batch_size, **kw)  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas)
    hist, _ = ppo_update(Learner(model, opt, cfg), UpdateBatch(rollout, adv, old), probe=probe)
    return hist, [p.detach().clone() for p in model.parameters()]


def _learner_history(betas=(0.9, 0.99)):
    return _tiny_update("vespo", betas=betas)[0]


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
    from vespo.train.step_metrics import summarize_update, to_floats

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
    import vespo.train.step_metrics as step_metrics
    from vespo.kernels import effective_sample_size

    assert lab_model.top_share is core.top_share is step_metrics.top_share
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


# --------------------------------------------------------------------------------------------------------------------
# the gradient probe


def test_compare_gradients_by_hand():
    cos, rel = diag.compare_gradients(torch.tensor([3.0, 4.0]), torch.tensor([4.0, 3.0]))
    assert float(cos) == pytest.approx(24 / 25, rel=1e-15)  # 12 + 12 over 5 * 5
    assert float(rel) == pytest.approx(math.sqrt(2) / 5, rel=1e-15)  # |(-1, 1)| / |(4, 3)|
    g = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    cos, rel = diag.compare_gradients(g, g.clone())
    assert float(cos) == 1.0 and float(rel) == 0.0  # exactly: g.g / sqrt((g.g)^2)
    assert float(diag.compare_gradients(g, -g)[0]) == -1.0 and float(diag.compare_gradients(g, -g)[1]) == 2.0
    zero, one = torch.zeros(3), torch.ones(3)
    assert math.isnan(float(diag.compare_gradients(zero, one)[0]))  # a zero gradient has no direction
    assert float(diag.compare_gradients(zero, one)[1]) == 1.0
    assert float(diag.compare_gradients(one, zero)[1]) == math.inf
    assert all(math.isnan(float(x)) for x in diag.compare_gradients(zero, zero))  # nothing to compare


def _hand_batch():
    """Two sequences of two tokens with log pi = theta - 1 at theta = 0; mu's log-probs put token 2 of the
    first (A = +1) at ratio e^0.5 = 1.649 > 1.28 and token 2 of the second (A = -1) at e^-0.5 = 0.607 < 0.8: GRPO
    (DAPO bounds) clips both, REINFORCE ignores the ratios, VESPO weighs each sequence by phi(W), log W = +-0.5."""
    theta = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
    old = torch.tensor([[-1.0, -1.5], [-1.0, -0.5]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    return theta, old, adv, mask


def _losses(theta, old, adv, mask, rows_per_micro: int):
    from vespo.losses import compute_policy_loss

    for start in range(0, 2, rows_per_micro):
        rows = slice(start, start + rows_per_micro)
        yield {
            name: compute_policy_loss(method, log_prob=theta[rows] - 1, old_log_prob=old[rows], advantages=adv[rows],
                                      response_mask=mask[rows], global_num_tokens=4.0, global_num_seqs=2.0)[0]
            for name, method in (("method", "vespo"), ("grpo", "grpo"), ("reinforce", "reinforce"))
        }  # fmt: skip


@pytest.mark.parametrize("rows_per_micro", [2, 1])
def test_gradient_probe_on_a_hand_built_batch(rows_per_micro):
    """Token-mean over 4 tokens: dL/dtheta_it = -w_it A_i / 4 with w = 1 (REINFORCE), 1 or 0 when clipped (GRPO),
    phi(W_i) (VESPO, App. I: phi = W^c1 exp(c2 (1 - W)), (c1, c2) = (2, 3) for A > 0 and (3, 2) for A < 0). Two
    micro-batches normalised by the whole mini-batch add up to one."""
    theta, old, adv, mask = _hand_batch()
    w0, w1 = math.exp(0.5), math.exp(-0.5)
    phi0, phi1 = w0**2 * math.exp(3 * (1 - w0)), w1**3 * math.exp(2 * (1 - w1))
    g_vespo = torch.tensor([-phi0, -phi0, phi1, phi1], dtype=torch.float64) / 4
    g_grpo = torch.tensor([-1.0, 0.0, 1.0, 0.0], dtype=torch.float64) / 4
    g_reinforce = torch.tensor([-1.0, -1.0, 1.0, 1.0], dtype=torch.float64) / 4
    losses = list(_losses(theta, old, adv, mask, rows_per_micro))  # the forward passes, before the guard
    with pytest.MonkeyPatch.context() as m:  # the probe itself converts no tensor to a Python number: no host sync
        for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
            m.setattr(torch.Tensor, name, _no_sync)
        out = diag.gradient_probe([theta], losses)
    cos_g, rel_g = diag.compare_gradients(g_vespo, g_grpo)
    cos_r, rel_r = diag.compare_gradients(g_vespo, g_reinforce)
    assert float(cos_r) == pytest.approx((phi0 + phi1) / math.sqrt(2 * (phi0**2 + phi1**2)), rel=1e-12)
    assert float(out["probe/cos_grpo"]) == pytest.approx(float(cos_g), rel=1e-12)
    assert float(out["probe/rel_diff_grpo"]) == pytest.approx(float(rel_g), rel=1e-12)
    assert float(out["probe/cos_reinforce"]) == pytest.approx(float(cos_r), rel=1e-12)
    assert float(out["probe/rel_diff_reinforce"]) == pytest.approx(float(rel_r), rel=1e-12)
    assert float(out["probe/cos_grpo_reinforce"]) == pytest.approx(1 / math.sqrt(2), rel=1e-12)
    assert theta.grad is None  # autograd.grad: the parameters' .grad is not touched
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in out.values())


def _no_sync(*args, **kwargs):
    raise AssertionError("host sync inside the probe")


def _probe_update(method: str, hparams: dict | None = None, probe: bool = True, n_mini_batches: int = 2, **kw):
    """`_tiny_update` with the probe at the last mini-batch (micro-batches of 3, lr 3e-2)."""
    return _tiny_update(method, n_mini_batches, hparams=hparams, lr=3e-2, micro_batch_size=3, probe=probe, **kw)


def test_probe_of_grpo_against_itself_is_exactly_one():
    """GRPO trained with the DAPO bounds spelled out is GRPO at its defaults: one gradient, cosine exactly 1."""
    for hparams in ({}, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}):
        hist, _ = _probe_update("grpo", hparams)
        last = hist[-1]
        assert float(last["probe/cos_grpo"]) == 1.0 and float(last["probe/rel_diff_grpo"]) == 0.0
        assert float(last["probe/cos_reinforce"]) == float(last["probe/cos_grpo_reinforce"])
    hist, _ = _probe_update("vespo")
    cos = float(hist[-1]["probe/cos_grpo"])
    assert -1.0 <= cos < 1.0 and float(hist[-1]["probe/rel_diff_grpo"]) > 0.0  # stale: W != 1, another gradient
    assert not any(k.startswith("probe/") for h in hist[:-1] for k in h)  # only the stalest mini-batch is probed


def test_probe_changes_no_number_of_the_update_and_stays_off_the_hot_path(monkeypatch):
    """The same update with and without the probe: identical weights and metrics; without it the probe is never
    called (its own arithmetic syncs nothing: `test_gradient_probe_on_a_hand_built_batch`)."""
    with_probe, w_probe = _probe_update("vespo", probe=True)
    monkeypatch.setattr(diag, "gradient_probe", lambda *a, **k: pytest.fail("probe called with probe=False"))
    without, w_plain = _probe_update("vespo", probe=False)
    monkeypatch.undo()
    assert all(torch.equal(a, b) for a, b in zip(w_probe, w_plain, strict=True))
    for h, g in zip(with_probe, without, strict=True):
        assert {k: v for k, v in h.items() if not k.startswith("probe/")}.keys() == g.keys()
        assert all(torch.equal(h[k], g[k]) for k in g if not math.isnan(float(g[k])))
