"""The sequence-level lab: exact log-probs and rewards, and the paper's claims that can be checked there."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from vespo import compute_policy_loss
from vespo.experiments.lab import (
    LabCell,
    LabConfig,
    expected_reward,
    init_logits,
    rewards_of,
    run_cell,
    sample_tokens,
    success_threshold,
    token_log_probs,
)
from vespo.experiments.lab_cli import cli as lab_cli
from vespo.kernels import effective_sample_size, variance_bound_K, vespo_log_phi


def _all_sequences(length: int, vocab: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(vocab), repeat=length)))  # (V^T, T)


def test_log_probs_are_exact_and_normalised():
    logits = init_logits(4, 3, 0.5, seed=1)
    seqs = _all_sequences(4, 3)
    seq_lp = token_log_probs(logits, seqs).sum(-1)
    assert torch.logsumexp(seq_lp, 0).item() == pytest.approx(0.0, abs=1e-12)
    ref = torch.distributions.Categorical(logits=logits).log_prob(seqs).sum(-1)  # (V^T,)
    torch.testing.assert_close(seq_lp, ref, rtol=0, atol=1e-12)


def test_expected_reward_equals_enumeration():
    logits = init_logits(7, 2, 0.4, seed=2)
    seqs = _all_sequences(7, 2)
    probs = token_log_probs(logits, seqs).sum(-1).exp()
    for threshold in (1, 3, 7):
        brute = float((probs * rewards_of(seqs, threshold)).sum())
        assert expected_reward(logits, threshold) == pytest.approx(brute, abs=1e-12)


def test_sampler_matches_the_distribution():
    logits = init_logits(2, 4, 0.5, seed=3)
    tokens = sample_tokens(logits, 40_000, torch.Generator().manual_seed(0))
    freq = torch.stack([(tokens == v).double().mean(0) for v in range(4)], -1)  # (T, V)
    torch.testing.assert_close(freq, torch.softmax(logits, -1), rtol=0, atol=0.01)


def test_initial_success_rate_is_about_a_quarter():
    for length in (16, 256, 4096):
        logits = init_logits(length, 4, 0.5, seed=0)
        assert 0.15 < expected_reward(logits, success_threshold(logits)) < 0.35


def _drifted_log_w(length: int, count: int = 2000, drift: float = 0.05) -> tuple[torch.Tensor, float]:
    """log W = log pi/mu of `count` mu-samples, pi = mu's logits + N(0, drift^2); and the exact Var_mu[log W]."""
    gen = torch.Generator().manual_seed(length)
    mu = init_logits(length, 4, 0.5, seed=0)
    pi = mu + drift * torch.randn(mu.shape, generator=gen, dtype=mu.dtype)
    tokens = sample_tokens(mu, count, gen)
    log_w = (token_log_probs(pi, tokens) - token_log_probs(mu, tokens)).sum(-1)
    q, r = torch.softmax(mu, -1), torch.log_softmax(pi, -1) - torch.log_softmax(mu, -1)  # per-position ratio
    exact_var = float(((q * r**2).sum(-1) - (q * r).sum(-1) ** 2).sum())  # independent positions: variances add
    return log_w, exact_var


def test_token_level_products_blow_up_with_length():
    """The same per-token drift gives Var[log W] growing linearly in T, so the ESS of W = prod_t rho_t collapses."""
    ess = {}
    for length in (16, 256, 4096):
        log_w, exact_var = _drifted_log_w(length)
        assert log_w.var().item() == pytest.approx(exact_var, rel=0.15)
        ess[length] = effective_sample_size(log_w).item()
    assert ess[16] > 0.9 and ess[256] > 0.3 and ess[4096] < 0.05


def test_gspo_conflates_lengths_vespo_does_not():
    """Prop. E.1: equal per-token log-ratio, different lengths -> GSPO gives equal weights, VESPO different ones."""
    r_bar, lengths = 0.05, (16, 256)
    t_max = max(lengths)
    mask = torch.zeros(2, t_max, dtype=torch.float64)
    for i, t in enumerate(lengths):
        mask[i, :t] = 1
    old = torch.full((2, t_max), -1.0, dtype=torch.float64)
    adv = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    coef = {}
    for method in ("gspo", "vespo"):
        lp = (old + r_bar * mask).requires_grad_(True)
        loss, _ = compute_policy_loss(method, log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask)
        (grad,) = torch.autograd.grad(loss, lp)
        coef[method] = grad.sum(-1)  # (2,) total score coefficient of each sequence
    # GSPO: both sequences get s = exp(mean log ratio) = exp(r_bar), whatever their length
    torch.testing.assert_close(coef["gspo"][0], coef["gspo"][1], rtol=1e-12, atol=0)
    assert coef["gspo"][0].item() == pytest.approx(math.exp(r_bar) / 2, rel=1e-12)  # -A * s / B
    # VESPO: W = exp(T r_bar) differs (e^0.8 vs e^12.8), and phi (3, 2) for A < 0 tells them apart
    phi = vespo_log_phi(torch.tensor([t * r_bar for t in lengths], dtype=torch.float64), 3.0, 2.0).exp()
    assert phi[0] > 0.5 and phi[1] < 1e-6
    assert coef["vespo"][0] / coef["vespo"][1] > 1e5


@pytest.mark.parametrize("length", [64, 2048])
def test_variance_bound_holds_on_stale_lab_batches(length):
    """Prop. 3.1 on batches: mean(phi^2) <= mean(phi) K C_hat, C_hat = sum phi W / sum phi (self-normalised E_Q[W])."""
    for drift in (0.01, 0.05, 0.2):
        log_w, _ = _drifted_log_w(length, count=512, drift=drift)
        for c1, c2 in ((2.0, 3.0), (3.0, 2.0), (1.5, 0.5)):
            log_phi = vespo_log_phi(log_w, c1, c2)
            lhs = torch.logsumexp(2 * log_phi, 0)  # log sum phi^2
            log_c_hat = torch.logsumexp(log_phi + log_w, 0) - torch.logsumexp(log_phi, 0)
            rhs = torch.logsumexp(log_phi, 0) + math.log(variance_bound_K(c1, c2)) + log_c_hat
            assert lhs.item() <= rhs.item() + 1e-9


def test_cell_learns_and_reports_per_mini_batch_metrics():
    cfg = LabConfig(optimizer_steps=32, mini_batch_seqs=32, lr=0.02)
    out = run_cell(cfg, LabCell("vespo", 32, 4, 1.0, 0))
    s = out["summary"]
    assert s["final_reward"] > s["initial_reward"] + 0.2 and s["finite"] == 1
    assert len(out["curve"]) == 1 + 32 // 4
    per_k = out["per_k"]
    assert all(len(v) == 4 for v in per_k.values())
    assert per_k["log_w_mean"][0] == 0.0 and per_k["ess"][0] == pytest.approx(1.0)  # first mini-batch is on-policy
    assert per_k["log_w_mean"][3] < 0  # later ones are stale: the sampled sequences lost probability on average


def test_adam_gives_back_the_step_size_vespo_takes_away():
    """The mechanism of docs/results/index.md: phi shrinks stale gradients, but Adam's update barely shrinks with
    them."""
    cell = dict(length=1024, num_mini_batches=16, lr_scale=3.0, seed=0)
    out = {}
    for opt, lr in (("adamw_torch", 0.005), ("sgd", 3.0)):
        cfg = LabConfig(optim=opt, lr=lr, optimizer_steps=32, mini_batch_seqs=32)
        out[opt] = {m: run_cell(cfg, LabCell(m, **cell))["per_k"] for m in ("vespo", "reinforce")}
    for per_k in out["sgd"].values():  # SGD: the step is lr * gradient, exactly
        for g, u in zip(per_k["grad_norm"], per_k["update_norm"], strict=True):
            assert u == pytest.approx(9.0 * g, rel=1e-9)
    late = slice(8, 16)
    adam = out["adamw_torch"]
    grad_ratio = sum(adam["vespo"]["grad_norm"][late]) / sum(adam["reinforce"]["grad_norm"][late])
    step_ratio = sum(adam["vespo"]["update_norm"][late]) / sum(adam["reinforce"]["update_norm"][late])
    assert grad_ratio < 0.85  # phi < 1 on stale mini-batches: VESPO's gradient is smaller than REINFORCE's
    assert 1 - step_ratio < 0.5 * (1 - grad_ratio)  # Adam hands back at least half of that shrinkage


def test_cli_rejects_bad_input_in_one_line(capsys):
    assert lab_cli(["--methods", "nope"]) == 2
    out = capsys.readouterr().err.strip().splitlines()
    assert len(out) == 1 and "methods" in out[0] and "vespo" in out[0]
    assert lab_cli(["--num-mini-batches", "3", "--optimizer-steps", "128"]) == 2
    assert "num_mini_batches" in capsys.readouterr().err


def test_changed_settings_never_reuse_a_lab_cell(tmp_path):
    import dataclasses

    from vespo.experiments.lab import LabConfig, lab

    cfg = LabConfig(
        out_dir=str(tmp_path), methods=("vespo",), length=(8,), num_mini_batches=(1,), lr_scale=(1.0,), seeds=(0,),
        optimizer_steps=4, eval_points=1, jobs=1,
    )  # fmt: skip
    first = lab(cfg)[0]["summary"]["final_reward"]
    assert lab(cfg)[0]["summary"]["final_reward"] == first and len(list((tmp_path / "cells").iterdir())) == 1
    other = lab(dataclasses.replace(cfg, lr=0.5))[0]["summary"]["final_reward"]
    assert other != first and len(list((tmp_path / "cells").iterdir())) == 2


def test_lab_tables_carry_cis_and_significance_marks(tmp_path):
    """Hand-made results: a method clearly above vespo over 5 seeds is bold with its adjusted p, one equal to it in
    distribution is not, and every cell shows mean ± 95% CI."""
    from vespo.experiments.lab import write_tables

    results = []
    for seed in range(5):
        for method, value in (
            ("vespo", 0.50 + 0.01 * seed),
            ("better", 0.80 + 0.01 * seed),
            ("same", 0.52 - 0.01 * seed),
        ):
            summary = {"method": method, "length": 64, "staleness": 4, "lr_scale": 1.0, "seed": seed,
                       "initial_reward": 0.3, "final_reward": value, "collapsed": 0,
                       "grad_clipped_frac": 0.25, "momentum_share_stalest": 0.5}  # fmt: skip
            results.append({"summary": summary, "per_k": {"log_w_mean": [0.0] * 4}})
    write_tables(tmp_path, results)
    text = (tmp_path / "results.md").read_text()
    row = {}
    for line in text.splitlines():  # the comparison table's rows (the diagnostics table repeats the names below)
        if line.startswith("| "):
            row.setdefault(line.split("|")[1].strip(), line)
    assert "±" in row["vespo"] and "**+0.300" in row["better"] and "**" not in row["same"]
    assert "Holm-corrected over 2 comparisons" in text
    # seeds share the initial policy and random streams: paired t, stated with its reason
    assert "runs sharing seeds are paired" in text and "[t]" in row["better"]
    assert "regime diagnostics" in text and "clip 0.25 · g-share 0.5" in text
    # a collapsed seed makes the outcome bimodal: Fisher's exact test on collapse counts instead
    results[0]["summary"]["collapsed"] = 1
    write_tables(tmp_path, results)
    text = (tmp_path / "results.md").read_text()
    assert "Fisher's exact test on collapsed seeds [F]" in text and "✗ 0/5 vs 1/5" in text
