"""veRL integration: plugin registration, equality with vespo and with veRL's built-ins, rollout IS, Hydra, bypass."""

import math
import os

import pytest
import torch
from _optional import require

verl = require("verl")  # importing verl loads vespo through the `verl.plugins` entry point
core_algos = require("verl.trainer.ppo.core_algos")
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

import vespo  # noqa: E402
from vespo.integrations import verl as vverl  # noqa: E402

B, T = 6, 9
# veRL's seq-mean-token-mean divides each sequence by (length + 1e-8), vespo by the length: relative gaps ~1e-8.


def _batch(seed: int, scale: float = 0.3, dtype=torch.float64):
    """Random veRL-style inputs: log-probs (B, T), token-broadcast advantages, right-padded bool mask."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 2 - 0.05
    lp = (-(old + scale * torch.randn(B, T, generator=g, dtype=dtype)).abs()).requires_grad_(True)  # log-probs <= 0
    adv = torch.randn(B, 1, generator=g, dtype=dtype).expand(B, T).clone()
    lengths = torch.tensor([9, 7, 4, 1, 8, 5])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return old, lp, adv, mask


def _actor(policy_loss=None, **kw) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=8,
        ppo_micro_batch_size_per_gpu=2,
        policy_loss=policy_loss if policy_loss is not None else vverl.VespoPolicyLossConfig(),
        **kw,
    )


def _grad(loss, lp):
    (g,) = torch.autograd.grad(loss, lp)
    return g


def test_plugin_registers_every_method_under_its_own_name():
    assert core_algos.get_policy_loss_fn("vespo") is core_algos.POLICY_LOSS_REGISTRY["vespo"]
    for m in vespo.available_methods():
        fn = core_algos.get_policy_loss_fn(vverl.verl_loss_name(m))
        assert fn.vespo_method == m
        assert vverl.vespo_method(vverl.verl_loss_name(m)) == m
    assert set(vverl.REGISTERED) == {"vespo"} | {f"vespo_{m}" for m in vespo.available_methods() if m != "vespo"}
    # veRL's built-ins are untouched
    for name in ("vanilla", "gspo", "sapo", "cispo", "bypass_mode"):
        assert core_algos.POLICY_LOSS_REGISTRY[name].__module__ == "verl.trainer.ppo.core_algos"
    # the loss was registered by veRL's own plugin discovery, not by this test's import
    from importlib.metadata import entry_points

    assert "vespo.integrations.verl" in {ep.value for ep in entry_points(group="verl.plugins")}
    # re-registering our own functions is a refresh; someone else's loss under our name is refused
    assert vverl.register_all() == vverl.REGISTERED
    saved = core_algos.POLICY_LOSS_REGISTRY["vespo_grpo"]
    core_algos.POLICY_LOSS_REGISTRY["vespo_grpo"] = core_algos.POLICY_LOSS_REGISTRY["vanilla"]
    try:
        with pytest.raises(ValueError, match="already registered"):
            vverl.register_all()
    finally:
        core_algos.POLICY_LOSS_REGISTRY["vespo_grpo"] = saved


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_vespo_equals_compute_policy_loss(mode):
    old, lp, adv, mask = _batch(0)
    fn = core_algos.get_policy_loss_fn("vespo")
    loss, metrics = fn(old, lp, adv, mask, loss_agg_mode=mode, config=_actor())
    ref, ref_metrics = vespo.compute_policy_loss(
        "vespo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, loss_agg_mode=mode
    )
    tol = dict(rtol=1e-7, atol=1e-12) if mode == "seq-mean-token-mean" else dict(rtol=1e-12, atol=1e-14)  # veRL 1e-8
    torch.testing.assert_close(loss, ref, **tol)
    torch.testing.assert_close(_grad(loss, lp), _grad(ref, lp), **tol)
    for k in ("vespo/Z", "weight/mean_pos", "weight/ess", "is/log_w_mean"):
        assert metrics[f"actor/{k}"] == pytest.approx(float(ref_metrics[k]), rel=1e-12)
    assert set(metrics) >= {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}
    assert all(isinstance(v, float) for v in metrics.values())
    valid = mask.double()
    assert metrics["actor/ppo_kl"] == pytest.approx(float(((old - lp.detach()) * valid).sum() / valid.sum()), rel=1e-12)


def test_global_batch_info_makes_micro_batches_sum_to_the_mini_batch():
    """Two micro-batches normalised with veRL's global batch info give the gradient of the whole mini-batch."""
    old, lp, adv, mask = _batch(1)
    fn = core_algos.get_policy_loss_fn("vespo")
    for mode, info in (
        ("token-mean", {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": B}),
        ("seq-mean-token-mean", {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": B}),
    ):
        full, _ = fn(old, lp, adv, mask, loss_agg_mode=mode, config=_actor())
        cfg = _actor(global_batch_info=info)
        parts = [
            fn(old[s], lp[s], adv[s], mask[s], loss_agg_mode=mode, config=cfg)[0] for s in (slice(0, 2), slice(2, B))
        ]
        torch.testing.assert_close(sum(parts), full, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(_grad(sum(parts), lp), _grad(full, lp), rtol=1e-12, atol=1e-14)
    # data parallel: each of dp_size ranks scales by dp_size / global count, DDP then averages the gradients
    info = {"dp_size": 2, "batch_num_tokens": int(mask.sum()), "global_batch_size": B}
    cfg = _actor(global_batch_info=info)
    ranks = [
        fn(old[s], lp[s], adv[s], mask[s], loss_agg_mode="token-mean", config=cfg)[0]
        for s in (slice(0, 3), slice(3, B))
    ]
    full, _ = fn(old, lp, adv, mask, loss_agg_mode="token-mean", config=_actor())
    torch.testing.assert_close(sum(ranks) / 2, full, rtol=1e-12, atol=1e-14)


# vespo method, veRL built-in, vespo hparams, veRL actor-config fields, aggregation
BUILTIN_PAIRS = [
    ("grpo", "vanilla", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0},
     {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}, "token-mean"),
    ("gspo", "gspo", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
     {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}, "seq-mean-token-mean"),
    ("sapo", "sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, {"tau_pos": 1.0, "tau_neg": 1.05}, "seq-mean-token-mean"),
    ("cispo", "cispo", {"ratio_min": 0.8, "ratio_max": 1.28},
     {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, "token-mean"),
    # issue 54: DPPO at veRL's example thresholds, and with a cap C that binds (veRL reads clip_ratio_c as C)
    ("dppo_tv", "dppo_tv", {"clip_ratio_low": 0.15, "clip_ratio_high": 0.15, "clip_ratio_c": 20.0},
     {"clip_ratio_low": 0.15, "clip_ratio_high": 0.15, "clip_ratio_c": 20.0}, "token-mean"),
    ("dppo_tv", "dppo_tv", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.1, "clip_ratio_c": 1.2},
     {"clip_ratio_low": 0.05, "clip_ratio_high": 0.1, "clip_ratio_c": 1.2}, "seq-mean-token-sum-norm"),
    ("dppo_kl", "dppo_kl", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 20.0},
     {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 20.0}, "token-mean"),
    ("dppo_kl", "dppo_kl", {"clip_ratio_low": 0.01, "clip_ratio_high": 0.02, "clip_ratio_c": 1.2},
     {"clip_ratio_low": 0.01, "clip_ratio_high": 0.02, "clip_ratio_c": 1.2}, "seq-mean-token-mean"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "builtin", "hparams", "actor_kw", "mode"), BUILTIN_PAIRS)
@pytest.mark.parametrize("with_is", [False, True])
def test_matches_verl_builtin(method, builtin, hparams, actor_kw, mode, with_is):
    """vespo's grpo/gspo/sapo/cispo/dppo_* equal veRL's vanilla/gspo/sapo/cispo/dppo_*: loss, gradient, clip
    metrics."""
    old, lp, adv, mask = _batch(2, scale=0.4)
    is_w = None
    if with_is:  # veRL's own token-level truncated IS weights
        rollout = old + 0.3 * torch.randn(B, T, generator=torch.Generator().manual_seed(7), dtype=old.dtype)
        is_w, _ = compute_rollout_correction_weights(old - rollout, mask.double(), rollout_is="token")
    ours_cfg = _actor(vverl.VespoPolicyLossConfig(loss_mode=f"vespo_{method}", hparams=hparams))
    ours, m_ours = core_algos.get_policy_loss_fn(f"vespo_{method}")(
        old, lp, adv, mask, loss_agg_mode=mode, config=ours_cfg, rollout_is_weights=is_w
    )
    theirs, m_theirs = core_algos.get_policy_loss_fn(builtin)(
        old,
        lp,
        adv,
        mask,
        loss_agg_mode=mode,
        config=_actor(PolicyLossConfig(loss_mode=builtin), **actor_kw),
        rollout_is_weights=is_w,
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-12)  # veRL 1e-8
    torch.testing.assert_close(_grad(ours, lp), _grad(theirs, lp), rtol=1e-7, atol=1e-12)
    for k in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
        if method == "sapo" and k == "actor/pg_clipfrac":
            continue  # veRL reports 0 for SAPO (no clipping); vespo's sapo has no clip metric either
        assert m_ours[k] == pytest.approx(m_theirs[k], rel=1e-6, abs=1e-9), k  # veRL counts clips in float32
    if method in ("grpo", "gspo", "cispo", "dppo_tv", "dppo_kl"):
        assert m_ours["actor/pg_clipfrac"] > 0  # the random ratios do reach the clip range (DPPO: trust region)
    if hparams.get("clip_ratio_c") == 1.2:
        assert m_ours["actor/pg_clipfrac_lower"] > 0  # DPPO's cap C binds


def test_intentional_difference_sapo_ignores_loss_agg_mode_in_verl():
    """veRL's sapo always aggregates seq-mean-token-mean; vespo_sapo honours actor.loss_agg_mode."""
    old, lp, adv, mask = _batch(3)
    cfg = _actor(vverl.VespoPolicyLossConfig(loss_mode="vespo_sapo"))
    ours, _ = core_algos.get_policy_loss_fn("vespo_sapo")(old, lp, adv, mask, loss_agg_mode="token-mean", config=cfg)
    theirs, _ = core_algos.get_policy_loss_fn("sapo")(
        old, lp, adv, mask, loss_agg_mode="token-mean", config=_actor(PolicyLossConfig(loss_mode="sapo"))
    )
    ref, _ = vespo.compute_policy_loss(
        "sapo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, loss_agg_mode="token-mean"
    )
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-14)
    assert abs(float(ours.detach() - theirs.detach())) > 1e-4


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_vespo_folds_verl_rollout_is_weights_into_w(level):
    """With veRL's rollout_is_weights w = min(mu/pi_rollout, C), vespo's W becomes pi/mu * w."""
    old, lp, adv, mask = _batch(4, scale=0.05)
    g = torch.Generator().manual_seed(11)
    rollout = -(old + 0.05 * torch.randn(B, T, generator=g, dtype=old.dtype)).abs()
    fn = core_algos.get_policy_loss_fn("vespo")
    cfg = _actor(vverl.VespoPolicyLossConfig(rollout_is=level))
    # untruncated (huge threshold): exactly vespo with the rollout log-probs
    w, _ = compute_rollout_correction_weights(old - rollout, mask.double(), rollout_is=level, rollout_is_threshold=1e9)
    loss, _ = fn(old, lp, adv, mask, config=cfg, rollout_is_weights=w)
    ref, _ = vespo.compute_policy_loss(
        "vespo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_log_prob=rollout
    )
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_grad(loss, lp), _grad(ref, lp), rtol=1e-10, atol=1e-12)
    # truncated at C = 1.02: W uses min(ratio, C) at the configured level
    log_c = math.log(1.02)
    w, _ = compute_rollout_correction_weights(old - rollout, mask.double(), rollout_is=level, rollout_is_threshold=1.02)
    loss, _ = fn(old, lp, adv, mask, config=cfg, rollout_is_weights=w)
    log_r = (old - rollout) * mask
    if level == "token":
        eff_rollout = old - log_r.clamp(max=log_c)
    else:  # the sequence's truncated log-ratio, carried by its first token
        eff_rollout = old - torch.zeros_like(old).index_fill(1, torch.tensor([0]), 1.0) * log_r.sum(-1, True).clamp(
            max=log_c
        )
    ref, _ = vespo.compute_policy_loss(
        "vespo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_log_prob=eff_rollout
    )
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    assert bool((w[mask] < 1.02 - 1e-12).any()) and bool((w[mask] == 1.02).any())  # both regimes present


@pytest.mark.parametrize(
    "correction",
    [
        dict(rollout_is="token", rollout_is_threshold=1.05, rollout_rs="token_k2", rollout_rs_threshold=0.002),
        dict(
            rollout_is="sequence", rollout_is_threshold="0.97_1.03", rollout_rs="seq_mean_k1", rollout_rs_threshold=1.02
        ),
        dict(rollout_is="token", rollout_is_threshold="0.98_1.02", rollout_rs="seq_max_k3", rollout_rs_threshold=4e-3),
    ],
)
def test_same_options_through_verl_or_vespo_give_the_same_loss(correction):
    """The same rollout-correction options configured in veRL (algorithm.rollout_correction: its weights and masked
    response_mask reach the plugin) or in vespo (hyperparameters, from rollout log-probs) give the same `vespo` loss
    and gradient."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    old, lp, adv, mask = _batch(12, scale=0.05)
    g = torch.Generator().manual_seed(13)
    rollout = -(old + 0.05 * torch.randn(B, T, generator=g, dtype=old.dtype)).abs()
    proto, verl_mask, _ = compute_rollout_correction_and_rejection_mask(old, rollout, mask.double(), **correction)
    assert 0 < verl_mask.sum() < mask.sum()  # something rejected, something kept
    fn = core_algos.get_policy_loss_fn("vespo")
    cfg = _actor(vverl.VespoPolicyLossConfig(rollout_is=correction["rollout_is"]))
    loss, _ = fn(old, lp, adv, verl_mask.bool(), config=cfg, rollout_is_weights=proto.batch["rollout_is_weights"])
    ref, _ = vespo.compute_policy_loss(
        "vespo", log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, rollout_log_prob=rollout,
        global_num_tokens=verl_mask.sum(), allow_empty_rows=True, **correction,
    )  # fmt: skip
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_grad(loss, lp), _grad(ref, lp), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_log_prob_is_truncated_as_verl_truncates_it(level, monkeypatch):
    """Issue 11.1: from rollout log-probs, every method applies the weight veRL's compute_rollout_correction_weights
    (threshold 2, its default) would hand it: folded into W for vespo, multiplying the loss for the others."""
    old, lp, adv, mask = _batch(9, scale=0.3)
    g = torch.Generator().manual_seed(12)
    rollout = -(old - torch.randn(B, T, generator=g, dtype=old.dtype)).abs()  # 6-50% of tokens have mu/pi_ro > 2
    w, _ = compute_rollout_correction_weights(old - rollout, mask.double(), rollout_is=level)
    frac = float((((old - rollout).exp() > 2.0) & mask).sum() / mask.sum())
    assert 0.06 < frac < 0.5, frac
    methods = ["vespo"] + [m for m in vespo.available_methods() if vespo.losses.rollout_correction(m) == level]
    for method in methods:
        name = vverl.verl_loss_name(method)
        cfg = _actor(vverl.VespoPolicyLossConfig(loss_mode=name, rollout_is=level))
        theirs, _ = core_algos.get_policy_loss_fn(name)(old, lp, adv, mask, config=cfg, rollout_is_weights=w)
        if method == "vespo" and level == "sequence":
            continue  # the official code folds token-level weights; a sequence weight is checked above
        kw = dict(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, loss_agg_mode="token-mean")
        ours, _ = vespo.compute_policy_loss(method, rollout_log_prob=rollout, **kw)
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12, msg=method)
        untruncated, _ = vespo.compute_policy_loss(method, rollout_log_prob=rollout, rollout_is_threshold=None, **kw)
        assert abs((untruncated - ours).item()) > 1e-3 * abs(ours.item()), method  # the truncation matters here


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_agg_loss_matches_installed_verl(mode):
    """vespo's loss_agg_mode meanings are the installed veRL's (0.9.1): a change in veRL fails here.

    seq-mean-token-sum-norm is mean_i sum_t l_it / T (veRL 0.9.1, TRL's dr_grpo); veRL's main branch has since
    redefined it as sum_i sum_t l_it / T (no division by the number of sequences).
    """
    g = torch.Generator().manual_seed(0)
    loss_mat = torch.randn(B, T, generator=g, dtype=torch.float64)
    _, _, _, mask = _batch(0)
    mask = mask.double()
    mask[3] = 0  # an empty row is not counted
    for ours_kw, theirs_kw in (
        ({}, {}),
        ({"global_num_tokens": 100.0, "global_num_seqs": 12.0}, {"batch_num_tokens": 100, "global_batch_size": 12}),
        ({"loss_scale_factor": 4096}, {"loss_scale_factor": 4096}),
    ):
        ours = vespo.agg_loss(loss_mat, mask, mode, **ours_kw)
        theirs = core_algos.agg_loss(loss_mat, mask, mode, **theirs_kw)
        torch.testing.assert_close(ours, theirs, rtol=1e-7 if mode == "seq-mean-token-mean" else 1e-12, atol=0)


def test_rollout_is_level_is_required_and_checked():
    old, lp, adv, mask = _batch(5)
    rollout = old + 0.2 * torch.randn(B, T, generator=torch.Generator().manual_seed(3), dtype=old.dtype)
    w_tok, _ = compute_rollout_correction_weights(old - rollout, mask.double(), rollout_is="token")
    fn = core_algos.get_policy_loss_fn("vespo")
    with pytest.raises(ValueError, match="'token' or per 'sequence'"):
        fn(old, lp, adv, mask, config=_actor(), rollout_is_weights=w_tok)
    with pytest.raises(ValueError, match="rollout_is must be one of"):
        vverl.VespoPolicyLossConfig(rollout_is="seq")


def test_bypass_mode_is_refused():
    with pytest.raises(ValueError, match="bypass_mode"):
        vverl.VespoPolicyLossConfig(bypass_mode=True)
    with pytest.raises(ValueError, match="bypass_mode"):  # what veRL's apply_bypass_mode writes into policy_loss
        vverl.VespoPolicyLossConfig(loss_mode="bypass_mode")
    old, lp, adv, mask = _batch(6)
    cfg = _actor(PolicyLossConfig(loss_mode="vespo", rollout_correction={"bypass_mode": True}))
    with pytest.raises(ValueError, match="bypass_mode"):
        core_algos.get_policy_loss_fn("vespo")(old, lp, adv, mask, config=cfg)


def test_bad_hparams_fail_when_the_config_is_built():
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        vverl.VespoPolicyLossConfig(hparams={"k_pos": 2.0})
    with pytest.raises(ValueError, match=r"c1_pos must be in \(0, inf\)"):
        vverl.VespoPolicyLossConfig(hparams={"c1_pos": -1.0})
    with pytest.raises(ValueError, match="c1_pos must be a finite real number, got 'abc'"):
        vverl.VespoPolicyLossConfig(hparams={"c1_pos": "abc"})
    with pytest.raises(ValueError, match="set algorithm.rollout_correction.rollout_is_threshold"):
        vverl.VespoPolicyLossConfig(hparams={"rollout_is_threshold": 3.0})
    with pytest.raises(ValueError, match="set algorithm.rollout_correction.rollout_rs$"):
        vverl.VespoPolicyLossConfig(hparams={"rollout_rs": "token_k3"})
    with pytest.raises(ValueError, match="not a vespo loss"):
        vverl.VespoPolicyLossConfig(loss_mode="vanilla", hparams={"c1_pos": 1.0})


def _compose(overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        cfg = compose(
            config_name="ppo_trainer", overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", *overrides]
        )
    OmegaConf.resolve(cfg)  # as verl.trainer.main_ppo does
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # as veRL's workers do


WIRING = [
    "actor_rollout_ref.actor.policy_loss._target_=vespo.integrations.verl.VespoPolicyLossConfig",
    "+actor_rollout_ref.actor.policy_loss.rollout_is=${algorithm.rollout_correction.rollout_is}",
    "+actor_rollout_ref.actor.policy_loss.bypass_mode=${algorithm.rollout_correction.bypass_mode}",
]


def test_hydra_overrides_reach_the_loss():
    """The documented override lines, through veRL's real trainer config and its config instantiation."""
    actor = _compose(
        [
            *WIRING,
            "actor_rollout_ref.actor.policy_loss.loss_mode=vespo",
            "+actor_rollout_ref.actor.policy_loss.hparams.c1_pos=1.5",
            "+actor_rollout_ref.actor.policy_loss.hparams.c2_neg=4.0",
            "algorithm.rollout_correction.rollout_is=sequence",
        ]
    )
    assert isinstance(actor.policy_loss, vverl.VespoPolicyLossConfig)
    assert actor.policy_loss.rollout_is == "sequence"
    old, lp, adv, mask = _batch(8, scale=0.5)
    fn = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    loss, _ = fn(old, lp, adv, mask, loss_agg_mode=actor.loss_agg_mode, config=actor)
    kw = dict(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
    ref, _ = vespo.compute_policy_loss("vespo", c1_pos=1.5, c2_neg=4.0, **kw)
    default, _ = vespo.compute_policy_loss("vespo", **kw)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    assert abs(float((ref - default).detach())) > 1e-3  # the overrides changed the loss

    with pytest.raises(Exception, match="bypass_mode"):
        _compose([*WIRING, "algorithm.rollout_correction.bypass_mode=true"])
    with pytest.raises(Exception, match="unknown hyperparameter"):
        _compose(
            [
                *WIRING,
                "actor_rollout_ref.actor.policy_loss.loss_mode=vespo_gspo",
                "+actor_rollout_ref.actor.policy_loss.hparams.c1_pos=1.5",
            ]
        )


EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "verl")
SCRIPTS = [
    ("qwen3_30b_a3b_megatron.sh", {"N": "16"}, "vespo", 4096),
    ("dense_fsdp.sh", {"MODEL": "meta-llama/Llama-3.2-3B-Instruct"}, "vespo", 2048),
    ("code_eurus_megatron.sh", {"LOSS_MODE": "vespo_gspo"}, "vespo_gspo", 2048),
    ("mismatch_megatron.sh", {"VARIANT": "vespo_tis"}, "vespo", 2048),
]


@pytest.mark.parametrize(("script", "env", "loss_mode", "train_batch"), SCRIPTS)
def test_example_launch_scripts_compose_with_verl_config(script, env, loss_mode, train_batch):
    """Every override in examples/verl/*.sh exists in veRL's config and builds a vespo actor config."""
    import subprocess

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    out = subprocess.run(
        ["bash", os.path.join(EXAMPLES, script)],
        env={**os.environ, **env, "VESPO_DRY_RUN": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    config_name, overrides = out[0].removeprefix("--config-name="), out[1:]
    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    OmegaConf.resolve(cfg)
    assert cfg.data.train_batch_size == train_batch and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, vverl.VespoPolicyLossConfig)
    assert actor.policy_loss.loss_mode == loss_mode
    if loss_mode == "vespo":
        assert actor.policy_loss.hparams == {"c1_pos": 2.0, "c2_pos": 3.0, "c1_neg": 3.0, "c2_neg": 2.0}
    if env.get("VARIANT") == "vespo_tis":
        assert actor.policy_loss.rollout_is == "token" and cfg.algorithm.rollout_correction.rollout_is == "token"


def _fully_async_config(overrides: list[str]):
    """veRL's fully-async trainer config (its own YAML, as `fully_async_main` composes and resolves it)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "experimental", "fully_async_policy", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        cfg = compose(config_name="fully_async_ppo_megatron_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def test_fully_async_example_composes_with_verls_fully_async_config():
    """examples/verl/fully_async_megatron.sh against veRL's fully-async schema: the official recipe's async settings,
    what veRL's rollouter asserts, vespo's loss with an untruncated sequence weight, and bypass mode off (the YAML's
    default turns it on, which the plugin refuses: veRL would replace the loss)."""
    import subprocess

    from verl.trainer.ppo.rollout_corr_helper import SAFETY_BOUND
    from verl.utils.config import omega_conf_to_dataclass

    out = subprocess.run(
        ["bash", os.path.join(EXAMPLES, "fully_async_megatron.sh")],
        env={**os.environ, "VESPO_DRY_RUN": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "--config-name=fully_async_ppo_megatron_trainer"
    cfg = _fully_async_config(out[1:])
    sync = cfg.async_training
    assert (sync.staleness_threshold, sync.trigger_parameter_sync_step, sync.require_batches) == (1.0, 4, 1)
    assert sync.partial_rollout is True and cfg.actor_rollout_ref.actor.use_rollout_log_probs is True
    # FullyAsyncRollouter.__init__'s assertions, and fully_async_main's use of the rollout pool
    assert cfg.actor_rollout_ref.hybrid_engine is False and cfg.data.train_batch_size == 0
    assert cfg.data.gen_batch_size == 1 and cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    assert (cfg.trainer.nnodes, cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node) == (2, 6, 8)
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, vverl.VespoPolicyLossConfig) and actor.loss_agg_mode == "token-mean"
    assert actor.policy_loss.loss_mode == "vespo" and actor.policy_loss.rollout_is == "sequence"
    correction = cfg.algorithm.rollout_correction
    assert correction.bypass_mode is False and correction.rollout_is == "sequence"
    assert float(correction.rollout_is_threshold) > math.exp(SAFETY_BOUND)  # never truncates: W = pi / mu exactly
    without = [o for o in out[1:] if o != "algorithm.rollout_correction.bypass_mode=False"]
    with pytest.raises(Exception, match="bypass_mode"):
        omega_conf_to_dataclass(_fully_async_config(without).actor_rollout_ref.actor)


def test_partial_rollout_weight_through_the_plugin_is_the_trajectorys_own():
    """A partial rollout's tokens come from two weight versions: mu(y|x) = prod_t mu_v(t)(y_t | ...). veRL's
    decoupled sequence weight pi_old / mu, untruncated as in the fully-async example, folded into vespo's W gives the
    loss and gradient of the official recipe, which uses the rollout log-probs themselves as the old log-probs."""
    old, lp, adv, mask = _batch(5, scale=0.05)
    g = torch.Generator().manual_seed(12)
    version_a = -(old + 0.05 * torch.randn(B, T, generator=g, dtype=old.dtype)).abs()
    version_b = -(old + 0.05 * torch.randn(B, T, generator=g, dtype=old.dtype)).abs()
    cut = torch.tensor([3, 0, 2, 1, 9, 4])[:, None]  # tokens before the cut were sampled before the weight sync
    mu = torch.where(torch.arange(T)[None, :] < cut, version_a, version_b)
    w, _ = compute_rollout_correction_weights(old - mu, mask.double(), rollout_is="sequence", rollout_is_threshold=1e9)
    fn = core_algos.get_policy_loss_fn("vespo")
    loss, _ = fn(old, lp, adv, mask, config=_actor(vverl.VespoPolicyLossConfig(rollout_is="sequence")),
                 rollout_is_weights=w)  # fmt: skip
    ref, _ = vespo.compute_policy_loss("vespo", log_prob=lp, old_log_prob=mu, advantages=adv, response_mask=mask)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_grad(loss, lp), _grad(ref, lp), rtol=1e-10, atol=1e-12)
    # one version for the whole trajectory would be a different weight: the splice matters
    single, _ = vespo.compute_policy_loss("vespo", log_prob=lp, old_log_prob=version_b, advantages=adv,
                                          response_mask=mask)  # fmt: skip
    assert not torch.allclose(single, ref, rtol=1e-6)


def test_example_reward_function():
    import importlib.util

    spec = importlib.util.spec_from_file_location("vespo_verl_reward_fn", os.path.join(EXAMPLES, "reward_fn.py"))
    reward_fn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward_fn)
    assert reward_fn.compute_score("math_dapo", "so 3+8+5 = \\boxed{16}", "16") == 1.0
    assert reward_fn.compute_score("math_dapo", "\\boxed{15}", "16", extra_info={"index": 0}) == 0.0
    gt = '{"inputs": ["1 2\\n", "3 4\\n"], "outputs": ["3\\n", "7\\n"]}'
    assert reward_fn.eurus_tests(gt) == [{"input": "1 2\n", "output": "3\n"}, {"input": "3 4\n", "output": "7\n"}]
    assert reward_fn.is_code("codecontests") and not reward_fn.is_code("math_dapo")


@pytest.mark.parametrize("method", ["vespo_moment", "vespo_ess", "vespo_selfnorm"])
def test_adaptive_methods_run_only_where_one_call_sees_the_whole_mini_batch(method):
    """veRL hands a PolicyLossFn one micro-batch of one rank and only counts (global_batch_info, as the worker test
    records it): the adaptive methods equal vespo's whole-batch loss when the call is the mini-batch, refuse a partial
    call with the geometry that is exact, and decide per micro-batch only on explicit opt-in."""
    old, lp, adv, mask = _batch(2, scale=0.8)
    hp = {"vespo_moment": {"moment_target_pos": 1.0, "moment_target_neg": 1.0}, "vespo_ess": {"ess_target": 0.9}}
    hp = hp.get(method, {})
    name = vverl.verl_loss_name(method)
    fn = core_algos.get_policy_loss_fn(name)
    info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": B}
    cfg = _actor(vverl.VespoPolicyLossConfig(loss_mode=name, hparams=hp), global_batch_info=info)
    loss, metrics = fn(old, lp, adv, mask, config=cfg)
    ref, ref_metrics = vespo.compute_policy_loss(
        method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, **hp
    )
    torch.testing.assert_close(_grad(loss, lp), _grad(ref, lp), rtol=1e-12, atol=1e-14)
    assert metrics["actor/adaptive/ess"] == pytest.approx(float(ref_metrics["adaptive/ess"]), rel=1e-12)
    control = {"vespo_moment": "c2_neg", "vespo_ess": "tau_pos", "vespo_selfnorm": "Z_pos"}[method]
    assert metrics[f"actor/adaptive/{control}"] != {"c2_neg": 2.0}.get(control, 1.0)  # the control is active
    part = slice(0, 2)
    # a micro-batch; one rank of two; counts without the mini-batch size (cannot be checked, so refused)
    for bad in (info, info | {"dp_size": 2, "global_batch_size": 2 * B}, info | {"global_batch_size": None}):
        rows = part if bad is info else slice(0, B)
        with pytest.raises(ValueError, match=r"ppo_micro_batch_size_per_gpu >= ppo_mini_batch_size \* rollout.n"):
            fn(old[rows], lp[rows], adv[rows], mask[rows], config=_actor(cfg.policy_loss, global_batch_info=bad))
    opt_in = vverl.VespoPolicyLossConfig(loss_mode=name, hparams=hp, adaptive_per_micro_batch=True)
    loss, _ = fn(old[part], lp[part], adv[part], mask[part], config=_actor(opt_in, global_batch_info=info))
    ref, _ = vespo.compute_policy_loss(
        method, log_prob=lp[part], old_log_prob=old[part], advantages=adv[part], response_mask=mask[part],
        global_num_tokens=mask.sum(), **hp,
    )  # fmt: skip
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)  # the micro-batch's own decision


def test_schedule_is_refused_in_verl():
    with pytest.raises(ValueError, match="receives no mini-batch index"):
        vverl.VespoPolicyLossConfig(loss_mode="vespo_vespo_schedule")


@pytest.mark.parametrize(
    ("method", "hparams"),
    [("m2po", {"m2_threshold": 0.02}), ("opsm", {"off_policy_mask_threshold": 0.05}), ("aipo", {"delta": 1.2}),
     ("vcpo", {})],
)  # fmt: skip
@pytest.mark.parametrize("with_is", [False, True])
def test_issue_40_methods_through_the_plugin_equal_vespo(method, hparams, with_is):
    """M2PO, OPSM, AIPO and VCPO's loss as veRL loss modes (`vespo_<method>`, hyperparameters through Hydra's config
    object) give vespo's loss, gradient and their own metrics, with veRL's rollout IS weights too. veRL passes a
    policy loss no sampler log-probs, so OPSM measures its divergence from old_log_prob (as TRL without vLLM); M2PO
    decides on the call, which must be the whole mini-batch (checked, as for the adaptive methods)."""
    old, lp, adv, mask = _batch(4, scale=0.6)
    name = vverl.verl_loss_name(method)
    fn = core_algos.get_policy_loss_fn(name)
    info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": B}
    level = vespo.losses.rollout_correction(method)
    level = "token" if level == "fold" else level
    g = torch.Generator().manual_seed(9)
    weights = None
    if with_is:
        w = torch.exp(0.3 * torch.randn(B, T, generator=g, dtype=old.dtype)).clamp(max=2.0) * mask
        weights = w if level == "token" else w[:, :1]
    cfg = _actor(vverl.VespoPolicyLossConfig(loss_mode=name, hparams=hparams, rollout_is=level),
                 global_batch_info=info)  # fmt: skip
    mode = vespo.losses.default_loss_agg_mode(method)
    loss, metrics = fn(old, lp, adv, mask, loss_agg_mode=mode, config=cfg, rollout_is_weights=weights)
    ref, ref_metrics = vespo.compute_policy_loss(
        method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, loss_agg_mode=mode,
        rollout_is_weights=weights, rollout_is_level=level if with_is else None, **hparams,
    )  # fmt: skip
    tol = dict(rtol=1e-7, atol=1e-12) if mode == "seq-mean-token-mean" else dict(rtol=1e-12, atol=1e-14)  # veRL 1e-8
    torch.testing.assert_close(loss, ref, **tol)
    torch.testing.assert_close(_grad(loss, lp), _grad(ref, lp), **tol)
    own = {"m2po": "m2po/masked_frac", "opsm": "opsm/masked_frac", "aipo": "clip/frac", "vcpo": "weight/ess"}[method]
    got = metrics["actor/pg_clipfrac"] if own == "clip/frac" else metrics[f"actor/{own}"]
    assert got == pytest.approx(float(ref_metrics[own]), rel=1e-12)
    if method != "vcpo":
        assert 0 < got < 1  # the method's mask or cap acted on part of the batch
    if method == "m2po":
        with pytest.raises(ValueError, match=r"ppo_micro_batch_size_per_gpu >= ppo_mini_batch_size \* rollout.n"):
            fn(old[:2], lp[:2], adv[:2], mask[:2], loss_agg_mode=mode, config=cfg)


def test_rollout_correction_presets_are_verls():
    """Issue 54: vespo's preset table (IcePop = `decoupled_token_icepop`) holds veRL's own presets' options, read from
    veRL's `RolloutCorrectionConfig` classmethods."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    for name in vespo.losses.ROLLOUT_CORRECTION_PRESETS:
        theirs = getattr(RolloutCorrectionConfig, name)()
        ours = vespo.losses.rollout_correction_preset(name)
        keys = ["rollout_is", "rollout_rs", "rollout_rs_threshold"] + ["rollout_is_threshold"] * (
            theirs.rollout_is is not None
        )
        assert {k: ours[k] for k in keys} == {k: getattr(theirs, k) for k in keys}, name
