"""Policy losses: hand-computed values, gradients, limits, invariances, bad input, extreme inputs."""

import math

import pytest
import torch
from _optional import require
from hypothesis import given, settings
from hypothesis import strategies as st

import vespo
from vespo import PolicyBatch, compute_policy_loss, policy_loss_terms
from vespo.kernels import phi_max
from vespo.losses import default_loss_agg_mode, register_method
from vespo.losses.adaptive import ADAPTIVE_METHODS

# vespo_schedule needs the index of its mini-batch (a BatchContext); tests/losses/test_adaptive.py covers it.
METHODS = [m for m in vespo.available_methods() if m != "vespo_schedule"]
# BAPO picks its clip bounds from the whole batch, so per-row or per-micro-batch calls differ from one batch by design;
# so do M2PO and the adaptive VESPO variants unless given the mini-batch's statistics (tests/losses/test_adaptive.py,
# tests/train/test_offpolicy.py).
BATCH_INDEPENDENT = [m for m in METHODS if m != "bapo" and not vespo.losses.uses_batch_context(m)]


def test_registry_names():
    assert vespo.available_methods() == sorted(
        [
            "aipo",
            "bapo",
            "cispo",
            "dppo_kl",
            "dppo_tv",
            "grpo",
            "gspo",
            "luspo",
            "m2po",
            "opsm",
            "reinforce",
            "sapo",
            "topr",
            "vcpo",
            "vespo",
        ]
        + list(ADAPTIVE_METHODS)
    )
    with pytest.raises(ValueError, match="already registered"):
        register_method("vespo")(lambda *a, **k: None)
    with pytest.raises(ValueError, match=r"unknown policy-loss method 'ppo'.*'vespo'"):
        vespo.method_hparams("ppo")
    assert vespo.method_hparams("vespo") == {
        "c1_pos": 2.0,
        "c2_pos": 3.0,
        "c1_neg": 3.0,
        "c2_neg": 2.0,
        "length_norm": "none",
        "positive_weight": "phi",
        "rollout_is": "auto",
        "rollout_is_threshold": 2.0,
        "rollout_rs": None,
        "rollout_rs_threshold": None,
        "kl_tau": 0.0,
    }


def test_optional_inputs_are_declared_in_the_registry_not_matched_by_name():
    """A method gets the core's optional inputs it declared (`register_method(inputs=...)`), nothing by its
    parameter names: an undeclared one, a declared one missing from the signature or an unknown name raise."""
    from vespo.losses.registry import OPTIONAL_INPUTS, get_method

    declared = {m: get_method(m).inputs for m in vespo.available_methods() if get_method(m).inputs}
    assert declared == {
        "vespo": {"rollout_log_w", "seq_log_ratio"},
        "cispo": {"log_ratio"},
        "m2po": {"log_ratio", "batch_context"},
        "opsm": {"rollout_log_prob"},
        **dict.fromkeys(ADAPTIVE_METHODS, {"rollout_log_w", "seq_log_ratio", "batch_context"}),
    }
    assert set(OPTIONAL_INPUTS) == {"rollout_log_w", "log_ratio", "seq_log_ratio", "batch_context", "rollout_log_prob"}

    def takes_log_ratio(log_prob, old_log_prob, advantages, mask, *, log_ratio=None):
        return log_prob, {}

    def takes_nothing(log_prob, old_log_prob, advantages, mask, *, scale: float = 1.0):
        return log_prob, {}

    with pytest.raises(ValueError, match=r"'t1': \['log_ratio'\] are the core's optional inputs; declare them"):
        register_method("t1")(takes_log_ratio)
    with pytest.raises(ValueError, match=r"'t2': declared inputs \['log_ratio'\] must be keyword-only"):
        register_method("t2", inputs=("log_ratio",))(takes_nothing)
    with pytest.raises(ValueError, match=r"'t3': unknown inputs \['log_w'\]"):
        register_method("t3", inputs=("log_w",))(takes_nothing)
    with pytest.raises(ValueError, match="rollout_log_w"):
        register_method("t4", rollout_correction="fold")(takes_nothing)
    assert "t1" not in vespo.available_methods()


def test_default_aggregation_is_each_primary_sources():
    # VESPO official code, DAPO, MiniMax-M1, BAPO's recipe: token-mean; GSPO paper, veRL's and TRL's SAPO:
    # seq-mean-token-mean; TOPR's gradient sums over the whole sequence: seq-mean-token-sum.
    want = {
        "vespo": "token-mean",
        "grpo": "token-mean",
        "cispo": "token-mean",
        "bapo": "token-mean",
        "reinforce": "token-mean",
        "gspo": "seq-mean-token-mean",
        "sapo": "seq-mean-token-mean",
        "topr": "seq-mean-token-sum",
        # M2PO's objective and prime-rl's AIPO divide by all tokens; DeepSeek-V3.2's GRPO objective and VCPO's scripts
        # average tokens, then sequences
        "m2po": "token-mean",
        "aipo": "token-mean",
        "opsm": "seq-mean-token-mean",
        "vcpo": "seq-mean-token-mean",
        # veRL's dppo_* default (prime-rl divides by all tokens too); TRL's luspo sums each sequence, mean over them
        "dppo_tv": "token-mean",
        "dppo_kl": "token-mean",
        "luspo": "seq-mean-token-sum",
    } | {m: "token-mean" for m in ADAPTIVE_METHODS}  # adaptive VESPO keeps VESPO's aggregation
    assert {m: default_loss_agg_mode(m) for m in vespo.available_methods()} == want
    from pathlib import Path

    table = (Path(__file__).parents[2] / "docs" / "methods" / "index.md").read_text().split("## The methods", 1)[1]
    for m, mode in want.items():  # the docs table says the same
        row = next(line for line in table.splitlines() if line.startswith(f"| `{m}` |"))
        assert f"| {mode} |" in row, row


# ---------------------------------------------------------------------------------------------------------------------
# A 2 x 2 worked example: log pi, per-token log(pi/mu) = delta, A = (+1, -2), all tokens valid.
LP = [[-1.0, -2.0], [-0.5, -1.5]]
DELTA = [[0.1, 0.2], [-0.3, 0.0]]
ADV = [1.0, -2.0]


def example(dtype=torch.float64):
    lp = torch.tensor(LP, dtype=dtype, requires_grad=True)
    old = lp.detach() - torch.tensor(DELTA, dtype=dtype)
    return lp, old, torch.tensor(ADV, dtype=dtype), torch.ones(2, 2)


def run(method, lp, old, adv, mask, **kw):
    loss, metrics = compute_policy_loss(method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, **kw)
    (grad,) = torch.autograd.grad(loss, lp)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad for v in metrics.values())
    return loss.item(), grad, {k: float(v) for k, v in metrics.items()}


def hand_phi(log_w, c1, c2):
    return math.exp(c1 * log_w + c2 * (1 - math.exp(log_w)))


def test_vespo_hand_computed():
    lp, old, adv, mask = example()
    loss, grad, m = run("vespo", lp, old, adv, mask)
    phi1 = hand_phi(0.1 + 0.2, 2, 3)  # A >= 0: (c1, c2) = (2, 3) -> 0.637898...
    phi2 = hand_phi(-0.3 + 0.0, 3, 2)  # A < 0: (3, 2) -> 0.682743...
    assert phi1 == pytest.approx(0.637898, abs=1e-6) and phi2 == pytest.approx(0.682743, abs=1e-6)
    loss_mat = [[-phi1 * 1 * -1.0, -phi1 * 1 * -2.0], [-phi2 * -2 * -0.5, -phi2 * -2 * -1.5]]
    assert loss == pytest.approx(sum(map(sum, loss_mat)) / 4, rel=1e-6)
    # gradient = -phi * A / N_tokens (token-mean): the detached kernel only scales the REINFORCE gradient
    want = torch.tensor([[-phi1 / 4, -phi1 / 4], [2 * phi2 / 4, 2 * phi2 / 4]], dtype=torch.float64)
    torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-9)
    assert m["weight/mean_pos"] == pytest.approx(phi1, rel=1e-6)
    assert m["weight/mean_neg"] == pytest.approx(phi2, rel=1e-6)
    assert m["is/log_w_max"] == pytest.approx(0.3, rel=1e-6) and m["is/log_w_min"] == pytest.approx(-0.3, rel=1e-6)
    w = [phi1, phi2]
    assert m["weight/ess"] == pytest.approx(sum(w) ** 2 / (2 * sum(x * x for x in w)), rel=1e-5)
    # Prop. 3.1 on the batch: E[phi^2] <= E[K phi W]; K(2,3) = e^2/3, K(3,2) = 1
    assert m["vespo/phi_sq_mean"] == pytest.approx((phi1**2 + phi2**2) / 2, rel=1e-6)
    rhs = (math.e**2 / 3 * phi1 * math.exp(0.3) + 1.0 * phi2 * math.exp(-0.3)) / 2
    assert m["vespo/bound_K_phi_w_mean"] == pytest.approx(rhs, rel=1e-6)
    assert m["vespo/phi_sq_mean"] <= m["vespo/bound_K_phi_w_mean"]


def test_grpo_hand_computed():
    lp, old, adv, mask = example()
    loss, grad, m = run("grpo", lp, old, adv, mask)
    r = [[math.exp(0.1), math.exp(0.2)], [math.exp(-0.3), 1.0]]
    # row 1 (A=+1): both ratios < 1.28 -> -A r.  row 2 (A=-2): r=0.741 < 0.8 is clipped to 0.8 (no gradient), r=1 kept.
    want_loss = (-r[0][0] - r[0][1] + 2 * 0.8 + 2 * 1.0) / 4
    assert loss == pytest.approx(want_loss, rel=1e-6)
    want_grad = torch.tensor([[-r[0][0] / 4, -r[0][1] / 4], [0.0, 2 * 1.0 / 4]], dtype=torch.float64)
    torch.testing.assert_close(grad, want_grad, rtol=1e-6, atol=1e-9)
    assert m["clip/frac"] == pytest.approx(0.25) and m["clip/frac_lower"] == 0.0
    # token weights: r where the gradient flows, 0 where clipped; same whether A comes per sequence or per token
    w = [r[0][0], r[0][1], 0.0, 1.0]
    for a in (adv, adv.unsqueeze(-1).expand(2, 2).contiguous()):
        _, _, m = run("grpo", lp, old, a, mask)
        assert m["weight/mean_pos"] == pytest.approx((w[0] + w[1]) / 2, rel=1e-6)
        assert m["weight/max_pos"] == pytest.approx(w[1], rel=1e-6)
        assert m["weight/mean_neg"] == pytest.approx(0.5) and m["weight/max_neg"] == pytest.approx(1.0)
        assert m["weight/ess"] == pytest.approx(sum(w) ** 2 / (4 * sum(x * x for x in w)), rel=1e-6)


def test_grpo_dual_clip():
    # A < 0 and r = e^2 = 7.39 > c = 3: loss capped at -A c = 3 with zero gradient
    lp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    loss, grad, m = run("grpo", lp, lp.detach() - 2.0, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1))
    assert loss == pytest.approx(3.0) and grad.item() == 0.0 and m["clip/frac_lower"] == 1.0


def test_gspo_hand_computed():
    lp, old, adv, mask = example()
    loss, grad, m = run("gspo", lp, old, adv, mask, clip_ratio_low=0.5, clip_ratio_high=0.5)
    s1, s2 = math.exp(0.15), math.exp(-0.15)  # geometric means of the token ratios
    assert loss == pytest.approx((-1 * s1 + 2 * s2) / 2, rel=1e-6)  # seq-mean-token-mean of -A s
    # d/dlogpi_t of -A s_t = -A s; token mean (1/2) and sequence mean (1/2)
    want = torch.tensor([[-s1 / 4, -s1 / 4], [2 * s2 / 4, 2 * s2 / 4]], dtype=torch.float64)
    torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-9)
    # with the paper's bounds (1-3e-4, 1+4e-4) both sequences are outside the trust region: no gradient
    _, grad, m = run("gspo", lp, old, adv, mask)
    assert torch.count_nonzero(grad) == 0 and m["clip/frac"] == 1.0


def test_sapo_hand_computed():
    lp, old, adv, mask = example()
    loss, grad, _ = run("sapo", lp, old, adv, mask)
    r = [[math.exp(0.1), math.exp(0.2)], [math.exp(-0.3), 1.0]]
    tau = [1.0, 1.05]
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want_loss, want_grad = 0.0, []
    for i in range(2):
        row = []
        for j in range(2):
            g = sig(tau[i] * (r[i][j] - 1))
            want_loss += -(4 / tau[i]) * g * ADV[i] / 4
            row.append(-4 * g * (1 - g) * r[i][j] * ADV[i] / 4)
        want_grad.append(row)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("ratio_level,w2", [("product", math.exp(-0.3)), ("geometric", math.exp(-0.15))])
def test_topr_hand_computed(ratio_level, w2):
    lp, old, adv, mask = example()
    loss, grad, m = run("topr", lp, old, adv, mask, ratio_level=ratio_level)
    # A = +1: weight 1 (even though W = e^0.3 > 1).  A = -2: weight clip(W, 0, 1). Default aggregation: the mean
    # over the 2 sequences of each sequence's token sum (TOPR's whole-sequence gradient).
    assert loss == pytest.approx((-1 * (-1 - 2) + w2 * 2 * (-0.5 - 1.5)) / 2, rel=1e-6)
    want = torch.tensor([[-1 / 2, -1 / 2], [2 * w2 / 2, 2 * w2 / 2]], dtype=torch.float64)
    torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-9)
    assert m["clip/frac"] == 0.0  # the one A < 0 sequence has W < 1: clip(W, 0, 1) = W, nothing clipped


def test_topr_clamps_the_sequence_log_w_not_the_tokens():
    # A < 0 sequence with token log-ratios -30 and +15: log W = -15, weight e^-15. Clamping each token at +-20 first
    # would give log W = -5, a weight 22000 times larger.
    lp = torch.tensor([[-31.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, -16.0]], dtype=torch.float64)
    _, grad, m = run("topr", lp, old, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 2))
    torch.testing.assert_close(grad, torch.full((1, 2), math.exp(-15.0), dtype=torch.float64), rtol=1e-12, atol=0)


def test_topr_clip_frac_counts_negative_sequences_with_w_above_one():
    # A < 0 with log W = +0.4 (clip(W, 0, 1) = 1 != W: clipped), A < 0 with log W = -0.4 (kept), A > 0 with log W = 1
    lp = torch.full((3, 2), -1.0, dtype=torch.float64, requires_grad=True)
    old = lp.detach() - torch.tensor([[0.2, 0.2], [-0.2, -0.2], [0.5, 0.5]], dtype=torch.float64)
    old = old.clamp(max=0.0)
    _, _, m = run("topr", lp, old, torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64), torch.ones(3, 2))
    assert m["clip/frac"] == 0.5  # one of the two negative-advantage sequences


def test_cispo_hand_computed():
    lp, old, adv, mask = example()
    loss, grad, m = run("cispo", lp, old, adv, mask, ratio_max=1.15)
    w = [[math.exp(0.1), 1.15], [math.exp(-0.3), 1.0]]  # e^0.2 = 1.2214 capped at 1.15, keeps its gradient
    want = torch.tensor([[-w[0][0] / 4, -w[0][1] / 4], [2 * w[1][0] / 4, 2 * w[1][1] / 4]], dtype=torch.float64)
    torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-9)
    assert loss == pytest.approx(sum(-w[i][j] * ADV[i] * LP[i][j] for i in range(2) for j in range(2)) / 4, rel=1e-6)
    assert m["clip/frac"] == pytest.approx(0.25)


def test_reinforce_hand_computed():
    lp, old, adv, mask = example()
    loss, grad, _ = run("reinforce", lp, old, adv, mask)
    assert loss == pytest.approx((1 * 3 - 2 * 2) / 4)
    torch.testing.assert_close(grad, torch.tensor([[-0.25, -0.25], [0.5, 0.5]], dtype=torch.float64))


def _bapo_batch(ratios, advs):
    """One row per token (B = n, T = 1): log pi = -1, old log-prob set so that pi/mu = the given ratio."""
    lp = torch.full((len(ratios), 1), -1.0, dtype=torch.float64, requires_grad=True)
    old = lp.detach() - torch.tensor(ratios, dtype=torch.float64).log().unsqueeze(-1)
    return lp, old, torch.tensor(advs, dtype=torch.float64), torch.ones(len(ratios), 1)


def test_bapo_raises_c_low_to_its_maximum_then_c_high():
    # authors' defaults: target pos/neg >= 1, c_low 0.6 -> 0.8 (step 0.05), c_high 1.2 -> 2.0 (step 0.05).
    # One A > 0 token with r = 1.5, three A < 0 tokens with r = 0.7, one A = 0 token.
    lp, old, adv, mask = _bapo_batch([1.5, 0.7, 0.7, 0.7, 1.0], [1.0, -1.0, -1.0, -1.0, 0.0])
    loss, grad, m = run("bapo", lp, old, adv, mask)
    # start: pos = min(1.5, 1.2) = 1.2, neg = 3 * max(0.7, 0.6) = 2.1 -> 0.57 < 1. Raising c_low only adds negative
    # mass (max(0.7, 0.8) = 0.8 -> neg 2.4); then c_high: pos grows to 1.5 at c_high >= 1.5 and stops, 1.5 / 2.4
    # = 0.625 < 1, so the search ends at both maxima.
    assert m["bapo/clip_low"] == pytest.approx(0.8) and m["bapo/clip_high"] == pytest.approx(2.0)
    assert m["bapo/positive_share"] == pytest.approx(1.5 / (1.5 + 2.4), rel=1e-6)
    # r = 1.5 < 2.0: gradient -A r / N; the A < 0 tokens (r = 0.7 < 0.8) are clipped: loss -A * 0.8, no gradient
    assert loss == pytest.approx((-1.5 + 3 * 0.8 + 0.0) / 5, rel=1e-9)
    torch.testing.assert_close(grad[:, 0], torch.tensor([-1.5 / 5, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    assert m["clip/frac"] == pytest.approx(3 / 5)


def test_bapo_stops_at_the_first_bounds_that_meet_the_target():
    # pos = min(1.5, c_high), neg = max(1.32, c_low) = 1.32: c_low moves to 0.8 without effect, then c_high
    # 1.25, 1.30 (1.30 / 1.32 < 1), 1.35 (1.35 / 1.32 >= 1): stop there.
    lp, old, adv, mask = _bapo_batch([1.5, 1.32], [1.0, -1.0])
    _, grad, m = run("bapo", lp, old, adv, mask)
    assert m["bapo/clip_low"] == pytest.approx(0.8) and m["bapo/clip_high"] == pytest.approx(1.35)
    assert m["bapo/positive_share"] == pytest.approx(1.35 / (1.35 + 1.32), rel=1e-6)
    # r = 1.5 > 1.35 is clipped for A > 0 (no gradient); the A < 0 token r = 1.32 keeps -A r / N
    torch.testing.assert_close(grad[:, 0], torch.tensor([0.0, 1.32 / 2], dtype=torch.float64))
    # a target met at the start keeps the start bounds
    _, _, m = run("bapo", lp, old, adv, mask, adv_ratio_target=0.9)
    assert (m["bapo/clip_low"], m["bapo/clip_high"]) == (pytest.approx(0.6), pytest.approx(1.2))


def bapo_authors_loop(r, adv, mask, target=1.0, low=0.6, low_max=0.8, low_step=0.05, high=1.2, high_max=2.0,
                      high_step=0.05):  # fmt: skip
    """BAPO's bound search written as the authors' loop (recipe/bapo/policy_loss.py), one step at a time."""

    def pos_neg(lo, hi):
        eff = torch.where(adv >= 0, torch.minimum(r, r.new_tensor(hi)), torch.maximum(r, r.new_tensor(lo)))
        contrib = eff * adv * mask
        pos, neg = contrib.clamp(min=0).sum().item(), (-contrib.clamp(max=0)).sum().item()
        return math.inf if neg <= 0 else pos / (neg + 1e-8)

    ratio = pos_neg(low, high)
    while ratio < target and low < low_max and low_step > 0:
        low = min(low + low_step, low_max)
        ratio = pos_neg(low, high)
    while ratio < target and high < high_max and high_step > 0:
        high = min(high + high_step, high_max)
        ratio = pos_neg(low, high)
    return low, high, ratio


@pytest.mark.parametrize("seed", range(8))
def test_bapo_bound_search_matches_the_authors_loop(seed):
    lp, old, adv, mask = random_batch(B=16, T=9, seed=seed, scale=0.6)
    g = torch.Generator().manual_seed(seed)
    adv_tok = adv.unsqueeze(-1) + 0.5 * torch.randn(16, 9, dtype=torch.float64, generator=g)  # token-level
    target = [0.3, 1.0, 1.5, 3.0][seed % 4]
    _, _, m = run("bapo", lp, old, adv_tok, mask, adv_ratio_target=target)
    r = (lp.detach() - old).clamp(-20, 20).exp()
    low, high, ratio = bapo_authors_loop(r, adv_tok, mask.double(), target=target)
    assert m["bapo/clip_low"] == pytest.approx(low) and m["bapo/clip_high"] == pytest.approx(high)
    assert m["bapo/positive_share"] == pytest.approx(1.0 if math.isinf(ratio) else ratio / (1 + ratio), rel=1e-9)


# ---------------------------------------------------------------------------------------------------------------------
# Properties every method must have


def random_batch(B=6, T=7, seed=0, scale=0.3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(B, T, generator=g, dtype=dtype) * 3).requires_grad_()
    old = -(lp.detach() + torch.randn(B, T, generator=g, dtype=dtype) * scale).abs()  # log-probs are <= 0
    adv = torch.randn(B, generator=g, dtype=dtype)
    mask = torch.ones(B, T)
    for i in range(B):
        mask[i, 1 + (i * 3) % T :] = 0  # ragged lengths, every row has >= 1 token
    return lp, old, adv, mask


@pytest.mark.parametrize("method", METHODS)
def test_on_policy_limit_is_reinforce(method):
    lp, _, adv, mask = random_batch()
    mode = default_loss_agg_mode(method)
    _, grad, _ = run(method, lp, lp.detach().clone(), adv, mask)
    _, grad_ref, _ = run("reinforce", lp, lp.detach().clone(), adv, mask, loss_agg_mode=mode)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-12)


# closed-form per-token gradient weight w such that d loss / d log pi_t = -w * A / N  (token-mean, no clipping)
def closed_form_weight(method, lp, old, adv, mask):
    log_r = (lp.detach() - old).clamp(-20, 20)
    r = log_r.exp()
    log_w = (log_r * mask).sum(-1, keepdim=True)
    A = adv.unsqueeze(-1).expand_as(lp)
    if method == "vespo":
        c1 = torch.where(A >= 0, 2.0, 3.0)
        c2 = torch.where(A >= 0, 3.0, 2.0)
        lw = log_w.clamp(math.log(1e-8), 20).expand_as(lp)
        return torch.exp(c1 * lw + c2 * (1 - lw.exp()))
    if method == "topr":
        return torch.where(A >= 0, 1.0, log_w.clamp(max=0).exp().expand_as(lp))
    if method == "cispo":
        return r.clamp(max=5.0)
    if method == "sapo":
        tau = torch.where(A > 0, torch.tensor(1.0, dtype=A.dtype), torch.tensor(1.05, dtype=A.dtype))
        g = torch.sigmoid(tau * (r - 1))
        return 4 * g * (1 - g) * r
    if method == "reinforce":
        return torch.ones_like(lp)
    raise AssertionError(method)


@pytest.mark.parametrize("method", ["vespo", "topr", "cispo", "sapo", "reinforce"])
def test_gradient_matches_closed_form(method):
    lp, old, adv, mask = random_batch(scale=0.5)
    _, grad, _ = run(method, lp, old, adv, mask, loss_agg_mode="token-mean")
    w = closed_form_weight(method, lp, old, adv, mask)
    want = -w * adv.unsqueeze(-1) * mask / mask.sum()
    torch.testing.assert_close(grad, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("method", ["grpo", "sapo", "reinforce", "bapo", "m2po", "opsm", "aipo", "vcpo", "luspo"])
def test_gradient_matches_finite_differences(method):
    # methods without a stop-gradient: the loss itself is the objective, so central differences must agree
    lp, old, adv, mask = random_batch(scale=0.15, seed=3)
    _, grad, _ = run(method, lp, old, adv, mask)
    h = 1e-6
    fd = torch.zeros_like(grad)
    for i, j in mask.nonzero().tolist():
        for s in (1, -1):
            x = lp.detach().clone()
            x[i, j] += s * h
            loss, _ = compute_policy_loss(method, log_prob=x, old_log_prob=old, advantages=adv, response_mask=mask)
            fd[i, j] += s * loss.item() / (2 * h)
    torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-8)


def test_vespo_gradient_is_gradient_of_gamma_surrogate():
    # Appendix B: grad of the VESPO loss = -(1/N) grad sum_i f(W_i) A_i, with f the incomplete-gamma surrogate.
    from vespo.kernels import surrogate

    lp, old, adv, mask = random_batch(scale=0.2, seed=5)
    _, grad, _ = run("vespo", lp, old, adv, mask)

    def objective(x):
        log_w = ((x - old) * mask).sum(-1)
        total = 0.0
        for lw, a in zip(log_w.tolist(), adv.tolist(), strict=True):
            c1, c2 = (2.0, 3.0) if a >= 0 else (3.0, 2.0)
            total += surrogate(torch.tensor(math.exp(lw), dtype=torch.float64), c1, c2).item() * a
        return total

    h = 1e-6
    for i, j in mask.nonzero().tolist():
        x_plus, x_minus = lp.detach().clone(), lp.detach().clone()
        x_plus[i, j] += h
        x_minus[i, j] -= h
        fd = (objective(x_plus) - objective(x_minus)) / (2 * h)
        assert grad[i, j].item() == pytest.approx(-fd / mask.sum().item(), rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_masked_tokens_do_not_matter(method):
    lp, old, adv, mask = random_batch(seed=7)
    loss_a, grad_a, _ = run(method, lp, old, adv, mask)
    pad = mask == 0
    lp2 = torch.where(pad, torch.full_like(lp, float("nan")), lp.detach()).requires_grad_()
    old2 = torch.where(pad, torch.full_like(old, -1e9), old)
    loss_b, grad_b, _ = run(method, lp2, old2, adv, mask)
    assert loss_a == pytest.approx(loss_b, rel=1e-12)
    torch.testing.assert_close(grad_a, grad_b.nan_to_num(0.0))
    assert torch.all(grad_b[pad] == 0)


@pytest.mark.parametrize("method", BATCH_INDEPENDENT)
def test_rowwise_loop_equals_batched(method):
    lp, old, adv, mask = random_batch(seed=11)
    batched, _ = policy_loss_terms(method, PolicyBatch(lp, old, adv, mask))
    for i in range(lp.shape[0]):
        row, _ = policy_loss_terms(method, PolicyBatch(*(t[i : i + 1] for t in (lp, old, adv, mask))))
        torch.testing.assert_close(row[0] * mask[i], batched[i] * mask[i], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("method", BATCH_INDEPENDENT)
def test_gradient_accumulation_equals_one_batch(method, mode):
    lp, old, adv, mask = random_batch(B=8, seed=13)
    _, grad_full, _ = run(method, lp, old, adv, mask, loss_agg_mode=mode)
    total = torch.zeros_like(lp)
    n_tok, n_seq = mask.sum(), (mask.sum(-1) > 0).sum()
    for sl in (slice(0, 3), slice(3, 8)):  # uneven micro-batches
        x = lp.detach()[sl].clone().requires_grad_()
        loss, _ = compute_policy_loss(
            method,
            log_prob=x,
            old_log_prob=old[sl],
            advantages=adv[sl],
            response_mask=mask[sl],
            loss_agg_mode=mode,
            global_num_tokens=n_tok,
            global_num_seqs=n_seq,
        )
        loss.backward()
        total[sl] = x.grad
    torch.testing.assert_close(total, grad_full, rtol=1e-10, atol=1e-13)


def test_gspo_length_conflation_prop_e1():
    # Prop. E.1: equal mean log-ratio r_bar, lengths 2 and 8 -> GSPO gives both the same weight; VESPO does not.
    r_bar = 0.05
    lp = torch.full((2, 8), -1.0, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 8)
    mask[0, :2], mask[1, :] = 1, 1
    old = lp.detach() - r_bar
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    _, g_gspo, _ = run(
        "gspo", lp, old, adv, mask, clip_ratio_low=0.9, clip_ratio_high=9.0, loss_agg_mode="seq-mean-token-sum"
    )
    assert g_gspo[0, 0].item() == pytest.approx(g_gspo[1, 0].item(), rel=1e-12)  # s = e^{r_bar} for both
    assert -2 * g_gspo[0, 0].item() == pytest.approx(math.exp(r_bar), rel=1e-12)
    _, g_vespo, _ = run("vespo", lp, old, adv, mask, loss_agg_mode="seq-mean-token-sum")
    assert -2 * g_vespo[0, 0].item() == pytest.approx(hand_phi(2 * r_bar, 2, 3), rel=1e-9)  # W = e^{0.1}
    assert -2 * g_vespo[1, 0].item() == pytest.approx(hand_phi(8 * r_bar, 2, 3), rel=1e-9)  # W = e^{0.4}
    assert abs(g_vespo[0, 0].item() - g_vespo[1, 0].item()) > 1e-3


@pytest.mark.parametrize("length_norm,divisor", [("none", 1.0), ("sqrt", 2.0), ("linear", 4.0)])
def test_vespo_length_norm_ablation(length_norm, divisor):
    lp = torch.full((1, 4), -1.0, dtype=torch.float64, requires_grad=True)
    old = lp.detach() - 0.1  # log W = 0.4 over T = 4 tokens
    _, grad, _ = run(
        "vespo", lp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 4), length_norm=length_norm
    )
    assert -4 * grad[0, 0].item() == pytest.approx(hand_phi(0.4 / divisor, 2, 3), rel=1e-9)


def test_rollout_log_prob_folds_into_vespo_and_truncates_token_methods():
    lp, old, adv, mask = example()
    rollout = old - torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)  # log(mu/pi_rollout) = 0.5 per token
    _, grad, m = run("vespo", lp, old, adv, mask, rollout_log_prob=rollout)
    phi1 = hand_phi(0.3 + 1.0, 2, 3)  # W = pi/pi_rollout; e^0.5 < 2 per token: no truncation
    assert grad[0, 0].item() == pytest.approx(-phi1 / 4, rel=1e-6)
    assert m["rollout_is/frac_truncated"] == 0.0
    # e^1 > C = 2 per token: W = pi/mu * prod_t min(mu/pi_rollout, 2) = e^0.3 * 4 (official code on veRL's weights)
    _, grad, m = run("vespo", lp, old, adv, mask, rollout_log_prob=old - 1.0)
    assert grad[0, 0].item() == pytest.approx(-hand_phi(0.3 + 2 * math.log(2.0), 2, 3) / 4, rel=1e-6)
    assert m["rollout_is/frac_truncated"] == 1.0
    _, grad, _ = run("vespo", lp, old, adv, mask, rollout_log_prob=old - 1.0, rollout_is_threshold=None)
    assert grad[0, 0].item() == pytest.approx(-hand_phi(0.3 + 2.0, 2, 3) / 4, rel=1e-6)  # untruncated
    _, grad, _ = run("reinforce", lp, old, adv, mask, rollout_log_prob=rollout, rollout_is_threshold=1.5)
    assert grad[0, 0].item() == pytest.approx(-1.5 / 4, rel=1e-9)  # min(e^0.5, 1.5) = 1.5
    _, grad, _ = run("topr", lp, old, adv, mask, rollout_log_prob=rollout, rollout_is_threshold=100.0)
    assert grad[0, 0].item() == pytest.approx(-math.exp(1.0) / 2, rel=1e-9)  # sequence-level TIS: e^{0.5 + 0.5}
    _, grad, _ = run("topr", lp, old, adv, mask, rollout_log_prob=rollout)
    assert grad[0, 0].item() == pytest.approx(-2.0 / 2, rel=1e-9)  # min(e^1, C = 2)


@pytest.mark.parametrize("method", METHODS)
def test_ready_is_weights_equal_rollout_log_probs(method):
    """An engine's ready weights min(mu/pi_rollout, C) give the loss the core computes from the log-probs."""
    lp, old, adv, mask = random_batch(seed=21)
    g = torch.Generator().manual_seed(4)
    rollout = -(old + 0.8 * torch.randn(old.shape, generator=g, dtype=old.dtype)).abs()
    log_r = (old - rollout).clamp(-20, 20)
    kind = vespo.losses.rollout_correction(method)
    if kind == "sequence":
        level, w = "sequence", (log_r * mask).sum(-1, keepdim=True).clamp(-20, 20).exp().clamp(max=2.0)  # (B, 1)
    else:
        level, w = "token", log_r.exp().clamp(max=2.0) * mask  # (B, T), 0 on padding as veRL
    ref, _, m_ref = run(method, lp, old, adv, mask, rollout_log_prob=rollout)
    got, grad, _ = run(method, lp, old, adv, mask, rollout_is_weights=w, rollout_is_level=level)
    _, grad_ref, _ = run(method, lp, old, adv, mask, rollout_log_prob=rollout)
    assert got == pytest.approx(ref, rel=1e-10) and ref != pytest.approx(run(method, lp, old, adv, mask)[0])
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-12)
    assert 0 < m_ref["rollout_is/frac_truncated"] < 1  # both regimes present


# ---------------------------------------------------------------------------------------------------------------------
# Bad input


def call(method="vespo", **over):
    lp, old, adv, mask = example()
    kw = dict(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    kw.update(over)
    return compute_policy_loss(method, **kw)


def test_bad_inputs_raise_clear_errors():
    lp, old, adv, mask = example()
    with pytest.raises(ValueError, match=r"old_log_prob has shape \(2, 3\)"):
        call(old_log_prob=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="advantages must have shape"):
        call(advantages=torch.zeros(3))
    with pytest.raises(ValueError, match=r"log_prob must be a \(B, T\) tensor"):
        call(log_prob=torch.zeros(4))
    bad = old.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="old_log_prob contains NaN or inf"):
        call(old_log_prob=bad)
    with pytest.raises(ValueError, match="advantages contain NaN or inf"):
        call(advantages=torch.tensor([1.0, float("inf")], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"rows with no valid token: \[1\]"):
        call(response_mask=torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="must be binary"):
        call(response_mask=torch.tensor([[1.0, 0.5], [1.0, 1.0]]))
    with pytest.raises(ValueError, match=r"c1_pos must be in \(0, inf\) \(Prop. 3.1\), got 0.0"):
        call(c1_pos=0.0)
    with pytest.raises(ValueError, match=r"c2_neg must be in \(0, inf\)"):
        call(c2_neg=-1.0)
    with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) \['clip_ratio'\]"):
        call(clip_ratio=0.2)
    with pytest.raises(ValueError, match="length_norm"):
        call(length_norm="log")
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        call(loss_agg_mode="sum")
    with pytest.raises(ValueError, match=r"known methods: \['aipo'"):
        call(method="ppo")
    with pytest.raises(ValueError, match=r"clip_ratio_c must be in \(1, inf\)"):
        call(method="grpo", clip_ratio_c=0.5)


# method, hyperparameters, what the one-line message must say
BAD_HPARAMS = [
    ("vespo", {"c1_pos": "abc"}, r"^vespo hyperparameter c1_pos must be a finite real number, got 'abc'$"),
    ("vespo", {"c1_pos": math.nan}, r"c1_pos must be a finite real number, got nan"),
    ("vespo", {"c2_pos": math.inf}, r"c2_pos must be a finite real number, got inf"),
    ("vespo", {"c1_neg": True}, r"c1_neg must be a finite real number, got True"),
    ("vespo", {"c1_pos": 0}, r"c1_pos must be in \(0, inf\) \(Prop. 3.1\), got 0$"),
    ("vespo", {"length_norm": "log"}, r"length_norm must be one of \['none', 'sqrt', 'linear'\], got 'log'"),
    ("vespo", {"k_pos": 2.0}, r"unknown hyperparameter\(s\) \['k_pos'\]; it accepts \['c1_neg', 'c1_pos'"),
    ("grpo", {"clip_ratio_low": 1.0}, r"clip_ratio_low must be in \[0, 1\), got 1.0"),
    ("grpo", {"rollout_is_threshold": 0}, r"^grpo hyperparameter rollout_is_threshold must be a number > 0 .*got 0$"),
    ("vespo", {"rollout_is_threshold": "2x"}, r"rollout_is_threshold must be a number > 0 or a 'lower_upper' .*'2x'$"),
    (
        "vespo",
        {"rollout_is_threshold": "3_2"},
        r"rollout_is_threshold needs lower <= upper in 'lower_upper', got '3_2'$",
    ),
    ("vespo", {"rollout_is": "seq"}, r"rollout_is must be one of \['auto', 'token', 'sequence', None\], got 'seq'$"),
    ("vespo", {"rollout_rs": "seq_max_k1", "rollout_rs_threshold": 2}, r"rollout_rs options must be among \["),
    ("vespo", {"rollout_rs": "token_k3"}, r"rollout_rs='token_k3' needs rollout_rs_threshold"),
    ("vespo", {"rollout_rs_threshold": 2}, r"rollout_rs_threshold is set but rollout_rs is not"),
    ("vespo", {"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": 0.5}, r"is a ratio bound u >= 1 \(\[1/u, u\]\)"),
    ("gspo", {"rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "2,3,4"}, r"needs one value or 2"),
    ("gspo", {"clip_ratio_high": -1e-4}, r"clip_ratio_high must be in \[0, inf\)"),
    ("sapo", {"tau_neg": 0.0}, r"tau_neg must be in \[1e-6, inf\)"),
    ("topr", {"ratio_level": "arith"}, r"ratio_level must be one of \['product', 'geometric'\]"),
    ("cispo", {"ratio_min": 6.0}, r"cispo hyperparameters: need ratio_min < ratio_max, got 6.0, 5.0"),
    ("cispo", {"ratio_max": None}, r"ratio_max must be a finite real number, got None"),
    ("bapo", {"ratio_lower_start": 0.9}, r"need 0 < ratio_lower_start <= ratio_lower_max < 1, got 0.9, 0.8"),
    ("bapo", {"ratio_upper_max": 1.0}, r"need 1 < ratio_upper_start <= ratio_upper_max, got 1.2, 1.0"),
    ("bapo", {"adv_ratio_target": -1}, r"adv_ratio_target must be in \[0, inf\)"),
    # issue 50: billions of candidate bounds (MemoryError); at most 100 raises per side
    ("bapo", {"ratio_upper_max": 1e9}, r"ratio_upper_step must be 0 or >= \(ratio_upper_max - ratio_upper_start\)"),
    ("bapo", {"ratio_lower_step": 1e-9}, r"ratio_lower_step must be 0 or >= .* got ratio_lower_step=1e-09"),
    ("vespo", {"c1_pos": 1e39}, r"c1_pos must be 0 or a float32 number, 1.18e-38 <= \|x\| <= 3.403e\+38"),
    ("sapo", {"tau_pos": 1e-45}, r"^sapo hyperparameter tau_pos must be in \[1e-6, inf\)"),
    ("vespo", {"c2_pos": 1e-45}, r"^vespo hyperparameter c2_pos must be 0 or a float32 number"),
    ("sapo", {"tau_pos": 1e-30}, r"^sapo hyperparameter tau_pos must be in \[1e-6, inf\)"),
    ("vespo", {"c2_neg": 60.0}, r"\(c1_neg, c2_neg\) = \(3.0, 60.0\) gives phi or K phi W"),
]


@pytest.mark.parametrize(("method", "hparams", "message"), BAD_HPARAMS)
def test_validate_hparams_names_the_hyperparameter(method, hparams, message):
    with pytest.raises(ValueError, match=message) as err:
        vespo.validate_hparams(method, **hparams)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=message):  # the losses apply the same check before any compute
        call(method=method, **hparams)


def test_validate_hparams_returns_all_values_with_defaults():
    assert vespo.validate_hparams("vespo", c1_pos=1) == {**vespo.method_hparams("vespo"), "c1_pos": 1.0}
    assert vespo.validate_hparams("cispo", ratio_min=None)["ratio_min"] is None
    for method in METHODS:  # the paper defaults themselves are valid
        assert vespo.validate_hparams(method) == vespo.method_hparams(method)


def _bad(name, value):
    def make(lp, old, adv, mask):
        t = {"log_prob": lp, "old_log_prob": old, "advantages": adv, "response_mask": mask}[name].detach().clone()
        t[0, 0] = value
        return {name: t}

    return make


# issue 10: each bad API input fails before compute with one line naming it
BAD_INPUTS = [
    ("global_num_tokens 0", lambda *_: {"global_num_tokens": 0},
      r"^global_num_tokens must be a finite number > 0, got 0$"),
    ("global_num_tokens < 0", lambda *_: {"global_num_tokens": -5.0}, r"global_num_tokens must be a finite number > 0"),
    ("global_num_tokens nan", lambda *_: {"global_num_tokens": math.nan}, r"global_num_tokens .* got nan"),
    ("global_num_seqs tensor 0", lambda *_: {"global_num_seqs": torch.tensor(0.0)},
      r"global_num_seqs must be a finite"),
    ("global_num_tokens bool", lambda *_: {"global_num_tokens": True}, r"global_num_tokens must be a finite number"),
    ("bool advantages", lambda lp, o, a, m: {"advantages": a > 0},
      r"^advantages must be a floating-point tensor, got torch.bool$"),
    ("int advantages", lambda lp, o, a, m: {"advantages": a.long()},
      r"advantages must be a floating-point tensor, got torch.int64"),
    ("int old_log_prob", lambda lp, o, a, m: {"old_log_prob": o.long()},
      r"old_log_prob must be a floating-point tensor"),
    ("list log_prob", lambda lp, o, a, m: {"log_prob": lp.tolist()}, r"^log_prob must be a torch.Tensor, got list$"),
    ("list advantages", lambda lp, o, a, m: {"advantages": [1.0, -1.0]},
      r"advantages must be a torch.Tensor, got list"),
    ("positive log_prob", _bad("log_prob", 5.0),
      r"^log_prob has values up to 5 at valid positions: log-probabilities must be <= 0$"),
    ("positive old_log_prob", _bad("old_log_prob", 0.5), r"old_log_prob has values up to 0.5"),
    ("nan log_prob", _bad("log_prob", math.nan), r"^log_prob contains NaN or inf at valid"),
    ("-inf old_log_prob", _bad("old_log_prob", -math.inf), r"old_log_prob contains NaN or inf at valid"),
    ("positive rollout", lambda lp, o, a, m: {"rollout_log_prob": o.detach() + 2.0},
      r"rollout_log_prob has values up to"),
    ("negative IS weights", lambda lp, o, a, m: {"rollout_is_weights": -torch.ones(2, 2), "rollout_is_level": "token"},
      r"rollout_is_weights must be finite and >= 0"),
    ("both rollout inputs", lambda lp, o, a, m: {"rollout_log_prob": o, "rollout_is_weights": torch.ones(2, 2)},
      r"not both"),
    ("int mask 2", lambda lp, o, a, m: {"response_mask": torch.tensor([[1, 2], [1, 1]])},
      r"response_mask must be binary"),
    ("str mask", lambda lp, o, a, m: {"response_mask": "11"}, r"response_mask must be a torch.Tensor, got str"),
    # issue 50: 1e-30 padding passed the m * m == sum m test (m * m underflows in float32) and counted as valid
    ("float mask 1e-30 padding", lambda lp, o, a, m: {"response_mask": torch.tensor([[1.0, 1e-30], [1.0, 1.0]])},
      r"^response_mask must be binary"),
    ("mask on another device", lambda lp, o, a, m: {"response_mask": m.to("meta")},
      r"^response_mask is on meta but log_prob is on cpu"),
    ("old_log_prob on another device", lambda lp, o, a, m: {"old_log_prob": o.to("meta")},
      r"^old_log_prob is on meta but log_prob is on cpu"),
    ("batch_context a dict", lambda *_: {"method": "vespo_moment", "batch_context": {"log_w": None}},
      r"^batch_context must be a vespo.losses.BatchContext .* got dict$"),
    ("batch_context on another device",
      lambda *_: {"method": "m2po", "batch_context": vespo.losses.BatchContext(m2=torch.zeros(2, 2, device="meta"))},
      r"^batch_context.m2 is on meta but log_prob is on cpu$"),
]  # fmt: skip


def test_float_mask_with_tiny_padding_is_refused_by_the_one_input_check():
    """Issue 50: M2PO's loss changed sign when 1e-30 padding counted as valid tokens; the trainer's one check
    (`check_policy_inputs`) refuses it too, and a float 0/1 mask still passes."""
    lp, old, adv, mask = example(torch.float32)
    tiny = torch.tensor([[1.0, 1e-30], [1.0, 1.0]])
    with pytest.raises(ValueError, match="response_mask must be binary"):
        vespo.check_policy_inputs(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=tiny)
    vespo.check_policy_inputs(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)


@pytest.mark.parametrize(("case", "make", "message"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_api_inputs_name_the_input(case, make, message):
    lp, old, adv, mask = example()
    with pytest.raises(ValueError, match=message) as err:
        call(**make(lp, old, adv, mask))
    assert "\n" not in str(err.value)


def test_validation_is_one_fused_check_and_can_be_switched_off(monkeypatch):
    """validate=True synchronises with the host once per call (the fused test); validate=False never does."""
    lp, old, adv, mask = example()
    syncs = []
    real_bool = torch.Tensor.__bool__
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: syncs.append(1) or real_bool(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: syncs.append(1) or t.tolist())
    kw = dict(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_log_prob=old - 0.1)
    for method in METHODS:
        syncs.clear()
        loss, metrics = compute_policy_loss(method, **kw)
        assert len(syncs) == 1, (method, len(syncs))
        syncs.clear()
        fast, _ = compute_policy_loss(method, validate=False, **kw)
        loss.backward()
        assert len(syncs) == 0, (method, len(syncs))
        assert fast.item() == pytest.approx(loss.detach().tolist(), rel=1e-12)
    # switched off, bad values are not looked at (the engine's responsibility)
    bad = old.clone()
    bad[0, 0] = 3.0
    compute_policy_loss("vespo", log_prob=lp, old_log_prob=bad, advantages=adv, response_mask=mask, validate=False)


def test_sequence_level_weights_must_be_constant_along_a_row():
    lp, old, adv, mask = example()
    w_tok = torch.tensor([[1.0, 2.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="vary along a sequence"):
        call(rollout_is_weights=w_tok, rollout_is_level="sequence")
    with pytest.raises(ValueError, match="'token' or per 'sequence'"):
        call(rollout_is_weights=w_tok)
    # (B, 1) weights are per sequence: folded once (W * w), not once per token
    _, grad, _ = run("vespo", lp, old, adv, mask, rollout_is_weights=torch.tensor([[1.5], [1.0]]))
    assert grad[0, 0].item() == pytest.approx(-hand_phi(0.3 + math.log(1.5), 2, 3) / 4, rel=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_empty_rows_allowed_explicitly_contribute_zero(method):
    lp, old, adv, _ = example()
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    old = torch.where(mask.bool(), old, torch.nan)  # garbage in the empty row must not leak either
    adv = torch.tensor([1.0, math.nan], dtype=adv.dtype)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        both, grad, _ = run(method, lp, old, adv, mask, loss_agg_mode=mode, allow_empty_rows=True)
        first, _ = compute_policy_loss(
            method, log_prob=lp[:1], old_log_prob=old[:1], advantages=adv[:1], response_mask=mask[:1],
            loss_agg_mode=mode,
        )  # fmt: skip
        assert both == pytest.approx(first.item(), rel=1e-12) and torch.all(grad[1] == 0)


# ---------------------------------------------------------------------------------------------------------------------
# Extreme inputs


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("log_w", [-1e4, 1e4])
def test_extreme_log_w_is_finite(method, log_w):
    T = 4
    d = log_w / T  # sum of token log-ratios = log_w; log-probs stay <= 0
    lp = torch.full((2, T), -1.0 + min(d, 0.0), requires_grad=True)
    old = torch.full((2, T), -1.0 - max(d, 0.0))
    rollout = torch.stack([old[0] - abs(d), old[1]])  # log(mu/pi_rollout) = |d| per token, and 0
    for ro in (None, rollout):
        loss, metrics = compute_policy_loss(
            method,
            log_prob=lp,
            old_log_prob=old,
            advantages=torch.tensor([1.0, -1.0]),
            response_mask=torch.ones(2, T),
            rollout_log_prob=ro,
        )
        (grad,) = torch.autograd.grad(loss, lp)
        assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
        assert all(math.isfinite(v) for v in metrics.values()), metrics


@pytest.mark.parametrize("method", METHODS)
def test_bf16_inputs(method):
    lp32, old, adv, mask = random_batch(dtype=torch.float32, scale=2.0)
    lp = lp32.detach().bfloat16().requires_grad_()
    loss, metrics = compute_policy_loss(
        method, log_prob=lp, old_log_prob=old.bfloat16(), advantages=adv.bfloat16(), response_mask=mask
    )
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad.dtype == torch.bfloat16 and torch.isfinite(grad).all() and math.isfinite(loss.item())


@settings(max_examples=60, deadline=None)
@given(
    log_ratios=st.lists(st.floats(-1e4, 1e4), min_size=6, max_size=6),
    advs=st.lists(st.floats(-10, 10), min_size=2, max_size=2),
    length=st.integers(1, 3),
)
def test_vespo_weights_bounded_and_finite(log_ratios, advs, length):
    lr = torch.tensor(log_ratios).view(2, 3)
    lp = (-1.0 + lr.clamp(max=0)).requires_grad_()  # log pi - log mu = lr, both <= 0
    old = -1.0 - lr.clamp(min=0)
    mask = torch.zeros(2, 3)
    mask[:, :length] = 1
    loss, m = compute_policy_loss(
        "vespo", log_prob=lp, old_log_prob=old, advantages=torch.tensor(advs), response_mask=mask
    )
    (grad,) = torch.autograd.grad(loss, lp)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
    assert 0 <= m["weight/max_pos"] <= phi_max(2, 3) * (1 + 1e-5)
    assert 0 <= m["weight/max_neg"] <= phi_max(3, 2) * (1 + 1e-5)
    assert m["vespo/phi_sq_mean"] <= m["vespo/bound_K_phi_w_mean"] * (1 + 1e-5) + 1e-30  # Prop. 3.1, pointwise
    assert 0 <= m["weight/ess"] <= 1 + 1e-6


@settings(max_examples=40, deadline=None)
@given(scale=st.floats(0.0, 50.0), seed=st.integers(0, 10_000), method=st.sampled_from(METHODS))
def test_all_methods_finite_on_random_off_policy_batches(scale, seed, method):
    lp, old, adv, mask = random_batch(seed=seed, scale=scale, dtype=torch.float32)
    loss, metrics = compute_policy_loss(method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    (grad,) = torch.autograd.grad(loss, lp)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


# ---------------------------------------------------------------------------------------------------------------------
# Cross-check against TRL's own VESPO weights (TRL mirrors the official code's guards)


@pytest.mark.parametrize("scale", [0.05, 1.0, 30.0])
def test_vespo_matches_trl_gamma_weights(scale):
    trl_grpo = require("trl.trainer.grpo_trainer")
    lp, old, adv, mask = random_batch(dtype=torch.float32, scale=scale, seed=17)
    mask = torch.ones_like(mask)  # TRL sums the rollout IS log-ratio without a mask
    rollout = -(old - torch.randn(old.shape, generator=torch.Generator().manual_seed(1)) * scale).abs()
    for ro in (None, rollout):
        ours, _ = policy_loss_terms("vespo", PolicyBatch(lp, old, adv, mask, rollout_log_prob=ro))
        is_ratio = None if ro is None else torch.exp(old - ro).clamp(max=2.0)  # TRL's token_truncate at C = 2
        phi = trl_grpo.GRPOTrainer.get_gamma_weights(
            advantages=adv.unsqueeze(1),
            log_ratio_per_token=lp.detach() - old,
            mask=mask,
            importance_sampling_ratio=is_ratio,
        )
        theirs = -phi * adv.unsqueeze(1) * lp
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)


def test_docs_list_exactly_the_registered_methods():
    import re
    from pathlib import Path

    pages = sorted((Path(__file__).parents[2] / "docs" / "methods").glob("*.md"))
    text = "\n".join(p.read_text() for p in pages)
    table = (pages[0].parent / "index.md").read_text().split("## The methods", 1)[1].split("\n\n", 2)[1]
    assert sorted(re.findall(r"^\| `([a-z0-9_]+)` \|", table, flags=re.M)) == vespo.available_methods()
    for name in vespo.available_methods():
        for hp in vespo.method_hparams(name):
            if hp not in vespo.losses.CORRECTION_OPTIONS:
                assert hp in text, f"docs/methods/ does not mention {name}'s hyperparameter {hp}"


def test_policy_batch_checks_its_structure_once_when_built():
    """The loss inputs are one object whose construction refuses what the loss refuses, before any compute; the
    checks read no data (so they cost no host sync), and the batch normalises the (B, 1) weights' level."""
    lp, old, adv, mask = random_batch(seed=2)
    cases = {
        "old_log_prob has shape": {"old_log_prob": old[:, :3]},
        "advantages must have shape": {"advantages": adv[:2]},
        "response_mask must be a torch.Tensor": {"response_mask": mask.tolist()},
        "rollout_is_weights must have shape": {"rollout_is_weights": torch.ones(2, 2, dtype=lp.dtype)},
        "not both": {"rollout_log_prob": old, "rollout_is_weights": torch.ones_like(old)},
        "rollout_is_level must be": {"rollout_is_weights": torch.ones_like(old), "rollout_is_level": "row"},
        "are per sequence": {"rollout_is_weights": torch.ones(6, 1, dtype=lp.dtype), "rollout_is_level": "token"},
    }
    fields = {"log_prob": lp, "old_log_prob": old, "advantages": adv, "response_mask": mask}
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=message):
            PolicyBatch(**(fields | bad))
    seq = PolicyBatch(lp, old, adv, mask, rollout_is_weights=torch.ones(6, 1, dtype=lp.dtype))
    assert seq.rollout_is_level == "sequence"
    cast = PolicyBatch(lp.float(), old.float(), adv.float(), mask.bool()).cast()
    assert (
        cast.response_mask.dtype == torch.float32
        and cast.log_prob.requires_grad
        and not cast.old_log_prob.requires_grad
    )
    assert cast.token_advantages().shape == lp.shape and cast.token_advantages().stride(-1) == 0


def test_batch_context_refuses_the_weights_the_loss_refuses():
    """(B, 1) IS weights declared per token are an error for the loss; the adaptive methods' mini-batch statistics,
    built from the same batch, refuse them too instead of silently reading them per sequence."""
    from vespo.losses.adaptive import batch_context

    lp, old, adv, mask = random_batch(seed=4)
    with pytest.raises(ValueError, match="are per sequence"):
        batch_context(
            PolicyBatch(
                lp, old, adv, mask, rollout_is_weights=torch.ones(6, 1, dtype=lp.dtype), rollout_is_level="token"
            )
        )


def test_check_policy_inputs_is_the_loss_check_run_once_and_refuses_padding_nan():
    """What the trainer runs once per rollout batch before calling the loss with validate=False."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.5, 0.0])
    vespo.check_policy_inputs(log_prob=None, old_log_prob=old, advantages=adv, response_mask=mask)
    padded = old.clone()
    padded[0, 4] = math.nan  # the loss with validate=True would zero this; validate=False would not
    with pytest.raises(ValueError, match="in the padding"):
        vespo.check_policy_inputs(log_prob=None, old_log_prob=padded, advantages=adv, response_mask=mask)
    with pytest.raises(ValueError, match="old_log_prob has values up to"):
        vespo.check_policy_inputs(log_prob=None, old_log_prob=old + 0.5 * mask, advantages=adv, response_mask=mask)
    with pytest.raises(ValueError, match="advantages must have shape"):
        vespo.check_policy_inputs(log_prob=None, old_log_prob=old, advantages=adv[:2], response_mask=mask)
    # with validate=False the loss on clean inputs equals the validated loss exactly
    lp = (old + 0.1 * torch.randn(3, 5, generator=g)).clamp(max=0)
    a, _ = compute_policy_loss("vespo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    b, _ = compute_policy_loss(
        "vespo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, validate=False
    )
    assert torch.equal(a, b)
