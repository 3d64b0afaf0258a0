"""Rollout correction (vespo.losses.correction) against the installed veRL's own functions, mode by mode, and its
effect on the loss: rejected tokens leave W and the loss, IS weights multiply or fold as registered."""

import math

import pytest
import torch
from _optional import require

helper = require("verl.trainer.ppo.rollout_corr_helper")

import vespo  # noqa: E402
from vespo.losses.correction import parse_rollout_correction, rollout_correction  # noqa: E402

B, T = 64, 12


def _batch(seed: int, scale: float = 0.3):
    """Random float64 (old, rollout, mask): log-probs <= 0, log-ratios ~ N(0, scale^2), right-padded rows."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    rollout = (old - scale * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    return old, rollout, mask


def _options(**kw):
    full = {"rollout_is": "auto", "rollout_is_threshold": 2.0, "rollout_rs": None, "rollout_rs_threshold": None}
    return parse_rollout_correction(*(full | kw).values())


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, 1.1, "1.2", "0.8_1.25", "0.9_1.05"])
def test_is_weights_equal_verls(level, threshold):
    """Truncated IS (a number) and IcePop ('lower_upper') at token and sequence level: vespo's weights equal veRL's
    `compute_rollout_correction_weights` at every valid position, and so do the truncated / masked shares."""
    old, rollout, mask = _batch(1, scale=0.3 if level == "token" else 0.05)
    opts = _options(rollout_is=level, rollout_is_threshold=threshold)
    ours, keep, m = rollout_correction(old, rollout, None, mask, opts, level, fold=False)
    theirs, tm = helper.compute_rollout_correction_weights(
        old - rollout, mask, rollout_is=level, rollout_is_threshold=threshold
    )
    assert keep is None
    valid = mask > 0
    torch.testing.assert_close(ours.expand(B, T)[valid], theirs[valid], rtol=1e-12, atol=0)
    icepop = isinstance(threshold, str) and "_" in threshold
    if level == "token":
        if icepop:
            assert m["rollout_is/masked_frac"].item() == pytest.approx(
                tm["rollout_is_oob_ratio"], rel=1e-7
            )  # veRL: +1e-8
        else:
            assert m["rollout_is/frac_truncated"].item() == pytest.approx(tm["rollout_is_ratio_fraction_high"])
        # veRL's ESS of token weights is Kish's normalised ESS (with +1e-8 in the mean)
        assert m["rollout_is/ess"].item() == pytest.approx(tm["rollout_is_eff_sample_size"], rel=1e-6)
        assert m["rollout_is/mean"].item() == pytest.approx(tm["rollout_is_mean"], rel=1e-7)  # veRL: +1e-8
    zero = (theirs[valid] == 0).double().mean().item()
    truncated = (theirs[valid] < torch.exp((old - rollout).clamp(-20, 20))[valid]).any().item()
    assert (0 < zero < 1) if icepop else (threshold == 2.0 and level == "sequence") or truncated  # both regimes


RS_CASES = [  # option(s), threshold: each masks some tokens and keeps others on the random batch
    ("token_k1", "0.8_1.25"),
    ("token_k1", 1.3),  # one number u: ratio bounds [1/u, u]
    ("token_k2", 0.02),
    ("token_k3", 0.02),
    ("seq_sum_k1", "0.5_2.0"),
    ("seq_sum_k2", 0.2),
    ("seq_sum_k3", 0.2),
    ("seq_mean_k1", "0.95_1.05"),  # geometric-mean sequence mask (Geo-RS)
    ("seq_mean_k2", 0.04),
    ("seq_mean_k3", 0.04),
    ("seq_max_k2", 0.2),
    ("seq_max_k3", 0.2),
    ("token_k1,seq_mean_k3", "0.7_1.4,0.05"),  # chained: every criterion must pass
    ("seq_max_k2,seq_sum_k1,token_k3", 1.5),  # one threshold shared
]


@pytest.mark.parametrize(("rs", "threshold"), RS_CASES)
def test_rejection_masks_equal_verls(rs, threshold):
    """k1/k2/k3 rejection at token, sequence-sum, sequence-mean (geometric) and sequence-max level: vespo's keep mask
    equals veRL's `compute_rollout_rejection_mask`, and so does the masked share."""
    old, rollout, mask = _batch(2)
    opts = _options(rollout_is=None, rollout_rs=rs, rollout_rs_threshold=threshold)
    weight, keep, m = rollout_correction(old, rollout, None, mask, opts, "token", fold=False)
    theirs, tm = helper.compute_rollout_rejection_mask(
        old - rollout, mask, rollout_rs=rs, rollout_rs_threshold=threshold
    )
    assert weight is None  # rollout_is=None: rejection only, as veRL's
    torch.testing.assert_close(keep * mask, theirs.double(), rtol=0, atol=0)
    assert m["rollout_rs/masked_frac"].item() == pytest.approx(
        tm["rollout_rs_masked_fraction"], rel=1e-7
    )  # veRL: +1e-8
    assert 0.02 < m["rollout_rs/masked_frac"].item() < 0.98, m  # the case tests both outcomes


def test_verl_unified_entry_point_and_vespo_agree_on_weights_and_mask():
    """veRL's `compute_rollout_correction_and_rejection_mask` (IS + RS together) against one vespo call."""
    old, rollout, mask = _batch(3, scale=0.05)
    kw = dict(rollout_is="sequence", rollout_is_threshold=1.5, rollout_rs="seq_mean_k1", rollout_rs_threshold=1.01)
    proto, new_mask, _ = helper.compute_rollout_correction_and_rejection_mask(old, rollout, mask, **kw)
    weight, keep, _ = rollout_correction(old, rollout, None, mask, _options(**kw), "sequence", fold=False)
    valid = mask > 0
    torch.testing.assert_close(weight.expand(B, T)[valid], proto.batch["rollout_is_weights"][valid], rtol=1e-12, atol=0)
    torch.testing.assert_close(keep * mask, new_mask.double(), rtol=0, atol=0)


def _loss(method, mask, **kw):
    g = torch.Generator().manual_seed(9)
    old, rollout, _ = _batch(4, scale=0.2)
    lp = (old + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=0).requires_grad_(True)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    loss, m = vespo.compute_policy_loss(
        method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_log_prob=rollout,
        allow_empty_rows=True, loss_agg_mode="token-mean", global_num_tokens=100.0, **kw,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, lp)
    return loss, grad, m


@pytest.mark.parametrize("method", ["vespo", "grpo", "gspo"])
def test_rejection_removes_tokens_from_w_and_loss(method):
    """A rejected token is as if it were padding: W (folded or not) and the loss are those of the pre-masked batch,
    the IS weights are computed on the full rows (as veRL's), and the metrics report the masked share and ESS."""
    _, _, mask = _batch(4)
    old, rollout, _ = _batch(4, scale=0.2)
    rs = dict(rollout_rs="token_k2,seq_max_k3", rollout_rs_threshold="0.01,0.5")
    opts = _options(**rs)
    _, keep, _ = rollout_correction(old, rollout, None, mask, opts, "token", fold=False)
    assert 0 < (keep * mask).sum() < mask.sum()
    loss, grad, m = _loss(method, mask, **rs, rollout_is_threshold=None)
    ref, ref_grad, _ = _loss(method, mask * keep, rollout_is_threshold=None)
    if method == "gspo":  # the sequence weight is prod_t over the full row (veRL's), not the kept tokens
        assert not torch.allclose(loss, ref)
    else:
        torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-14)
    assert m["rollout_rs/masked_frac"] > 0 and 0 < m["rollout_is/ess"] <= 1


def test_icepop_and_sequence_level_fold_into_vespo_w():
    """vespo folds the catalogue's weights into W: IcePop zeros drop a sequence (W floored at 1e-8), a sequence-level
    weight enters once; rollout_is=None leaves W = pi/mu."""
    _, _, mask = _batch(5)
    plain, g_plain, _ = _loss("vespo", mask, rollout_is=None)
    none_ref, g_none, _ = _loss("vespo", mask, rollout_is=None, rollout_is_threshold=None)
    torch.testing.assert_close(plain, none_ref)
    _, g_ice, m = _loss("vespo", mask, rollout_is_threshold="0.8_1.25")
    assert 0 < m["rollout_is/masked_frac"] < 1
    _, g_seq, m_seq = _loss("vespo", mask, rollout_is="sequence", rollout_is_threshold=1.5)
    assert not torch.allclose(g_ice, g_plain) and not torch.allclose(g_seq, g_plain)
    assert m_seq["rollout_is/frac_truncated"] > 0 and math.isfinite(m_seq["rollout_is/log_w_mean"].item())


def test_ready_engine_weights_refuse_vespo_side_options():
    old, rollout, mask = _batch(6)
    with pytest.raises(ValueError, match="rollout_is_weights come corrected by the engine"):
        vespo.compute_policy_loss(
            "grpo", log_prob=old, old_log_prob=old, advantages=torch.ones(B), response_mask=mask,
            rollout_is_weights=torch.ones(B, T, dtype=old.dtype), rollout_rs="token_k2", rollout_rs_threshold=1.0,
            allow_empty_rows=True,
        )  # fmt: skip
