"""Lab v2 (the shared-parameter chain policy with EOS): exact log-probs, its sampler, reward and mask, and a cell."""

from __future__ import annotations

import pytest
import torch

from vespo.experiments.lab import LabCell, LabConfig
from vespo.experiments.lab_cli import cli as lab_cli
from vespo.experiments.lab_model import EOS, ChainPolicy, ChainSpec, run_chain_cell

SMALL = ChainSpec(vocab=16, rank=4, knots=3, eval_samples=256)


def _perturbed(spec: ChainSpec, length: int, seed: int = 0) -> ChainPolicy:
    """A policy whose parameters all moved off their structured initial values (EOS embedding and g(t) included)."""
    policy = ChainPolicy(spec, length, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in policy.params.values():
            p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return policy


def _direct_log_prob(policy: ChainPolicy, tokens: torch.Tensor) -> torch.Tensor:
    """log pi(y_t | y_{t-1}, t) one token at a time, from the full softmax over all V tokens (EOS included)."""
    p = policy.params
    g = policy.basis @ p["eos_pos"]
    out = torch.empty(tokens.shape, dtype=torch.float64)
    for i in range(tokens.shape[0]):
        prev = policy.spec.vocab  # BOS
        for t in range(tokens.shape[1]):
            logits = p["bias"] + p["out"] @ p["emb"][prev]  # (V,)
            logits = logits + g[t] * (torch.arange(policy.spec.vocab) == EOS)
            out[i, t] = torch.log_softmax(logits, -1)[tokens[i, t]]
            prev = int(tokens[i, t])
    return out


def test_log_probs_exact_against_a_direct_per_token_softmax():
    policy = _perturbed(SMALL, 7)
    tokens, _ = policy.sample(5, torch.Generator().manual_seed(0))
    tokens[0, 2] = EOS  # an EOS inside a row, then more tokens: the formula must hold at every position
    fast = policy.log_probs(tokens)
    with torch.no_grad():
        direct = _direct_log_prob(policy, tokens)
    torch.testing.assert_close(fast.detach(), direct, rtol=0, atol=1e-12)
    # gradients flow to every parameter
    fast.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.params.values())


def test_log_probs_normalise_in_every_context():
    policy = _perturbed(SMALL, 5)
    v = SMALL.vocab
    with torch.no_grad():
        assert torch.logsumexp(policy.log_probs(torch.arange(v)[:, None])[:, 0], 0).item() == pytest.approx(
            0, abs=1e-12
        )
        for t in range(1, 5):
            for prev in (0, 3):  # after EOS, after a token
                seqs = torch.full((v, t + 1), prev)
                seqs[:, t] = torch.arange(v)
                lp = policy.log_probs(seqs)[:, t]
                assert torch.logsumexp(lp, 0).item() == pytest.approx(0.0, abs=1e-12)


def test_sampler_matches_the_exact_distribution():
    """Frequencies of (first token) and (second token | first token) against exp(log_probs)."""
    policy = _perturbed(SMALL, 2)
    tokens, _ = policy.sample(60_000, torch.Generator().manual_seed(1))
    v = SMALL.vocab
    firsts = torch.arange(v)[:, None]
    exact_first = policy.log_probs(firsts).detach().exp()[:, 0]
    freq_first = torch.bincount(tokens[:, 0], minlength=v).double() / len(tokens)
    torch.testing.assert_close(freq_first, exact_first, rtol=0, atol=0.01)
    top = int(freq_first[1:].argmax()) + 1
    pairs = torch.stack([torch.full((v,), top), torch.arange(v)], 1)
    exact_next = policy.log_probs(pairs).detach().exp()[:, 1]
    after = tokens[tokens[:, 0] == top, 1]
    torch.testing.assert_close(torch.bincount(after, minlength=v).double() / len(after), exact_next, rtol=0, atol=0.02)


def test_mask_reward_and_length_rules():
    spec = ChainSpec(vocab=16, rank=4, knots=3, min_length=0.5, reward="threshold")
    policy = ChainPolicy(spec, 6, seed=0)
    a = policy.answer
    good = [int(a[16])]
    for _ in range(3):
        good.append(int(a[good[-1]]))
    tokens = torch.tensor(
        [
            good + [EOS, 5],  # 4 correct tokens then EOS: accuracy 1, length 5 >= 3
            good[:1] + [EOS, 5, 5, 5, 5],  # too short (2 < 0.5 * 6): not gradable
            good + good[:2],  # no EOS: truncated
        ]
    )
    mask = policy.response_mask(tokens)
    torch.testing.assert_close(mask.sum(-1), torch.tensor([5.0, 2.0, 6.0], dtype=torch.float64))
    torch.testing.assert_close(policy.accuracy(tokens, mask)[0], torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(policy.rewards(tokens, mask, 0.9), torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))


def test_initial_policy_matches_its_spec():
    """About a quarter succeed, lengths vary around mean_length x T, and the most likely token is usually wrong."""
    policy = ChainPolicy(ChainSpec(eval_samples=512, reward="threshold"), 256, seed=0)
    q = policy.success_threshold(7)
    ev = policy.evaluate(q, 7)
    assert 0.15 < ev["reward"] < 0.35
    assert 0.3 * 256 < ev["length_mean"] < 0.7 * 256 and ev["truncated"] < 0.3
    logits = policy._tables()[0].detach()
    assert (logits[:, 1:].argmax(-1) + 1 != policy.answer).double().mean() > 0.5


@pytest.mark.parametrize("method", ["reinforce", "vespo", "topr"])
def test_on_policy_cell_learns(method):
    """N = 1 (every method reduces to REINFORCE up to aggregation) raises E[R] on a small, fast chain."""
    cfg = LabConfig(optimizer_steps=16, mini_batch_seqs=32, lr=0.02, eval_points=1)
    spec = ChainSpec(vocab=64, rank=8, eval_samples=256, reward="threshold")
    out = run_chain_cell(cfg, LabCell(method, 64, 1, 1.0, 0), spec)
    s = out["summary"]
    assert s["final_reward"] > s["initial_reward"] + 0.1 and s["finite"] == 1
    assert out["per_k"]["log_w_mean"] == [0.0] and out["per_k"]["ess"][0] == pytest.approx(1.0)
    if method == "vespo":
        assert out["per_k"]["bound_holds"] == [1.0]


def test_stale_cell_reports_drift():
    cfg = LabConfig(optimizer_steps=8, mini_batch_seqs=16, lr=0.02, eval_points=1)
    out = run_chain_cell(cfg, LabCell("vespo", 32, 4, 1.0, 0), ChainSpec(vocab=64, rank=8, eval_samples=64))
    per_k = out["per_k"]
    assert per_k["log_w_mean"][0] == 0.0 and per_k["log_w_mean"][3] < 0
    assert per_k["bound_holds"] == [1.0] * 4


def test_cli_rejects_bad_v2_settings_in_one_line(capsys):
    assert lab_cli(["--chain.vocab", "8"]) == 2
    out = capsys.readouterr().err.strip().splitlines()  # errors go to stderr
    assert len(out) == 1 and "chain.vocab" in out[0] and ">= 16" in out[0]
    assert lab_cli(["--mismatch-std", "0.1"]) == 2  # the old name of rollout_logit_noise
    assert "rollout_logit_noise" in capsys.readouterr().err


COLLAPSE = {"length": (256,), "lr": 0.03, "lr_scale": (1.0,), "optimizer_steps": 512, "eval_points": 1}
"""The lab's collapse setting (docs/guides/lab.md, benchmarks/bench_lab_v2.py): lab v2's chain (threshold reward),
T = 256, 512 Adam steps."""


@pytest.mark.slow
def test_stale_reinforce_collapses_where_on_policy_reinforce_learns(tmp_path):
    """`vespo lab` on a small grid: REINFORCE (weight 1, no trust region) learns on-policy (N = 1) and collapses at
    N = 16: the negative samples' unbounded push drains mass into EOS until responses are too short to grade. (GRPO,
    GSPO and TOPR do not collapse there: benchmarks/results/lab_v2, 5 seeds.)"""
    from vespo.experiments.lab import lab

    cfg = LabConfig(out_dir=str(tmp_path), methods=("reinforce",), num_mini_batches=(1, 16), seeds=(0,),
                    chain=ChainSpec(reward="threshold"), **COLLAPSE)  # fmt: skip
    rows = {(r["summary"]["method"], r["summary"]["staleness"]): r["summary"] for r in lab(cfg)}
    on_policy, stale = rows["reinforce", 1], rows["reinforce", 16]
    assert on_policy["final_reward"] > 2 * on_policy["initial_reward"] and not on_policy["collapsed"]
    assert stale["collapsed"] and stale["final_reward"] < 0.1 * stale["initial_reward"]
    assert stale["final_length_mean"] < cfg.chain.min_length * 256  # collapsed into responses too short to grade
    assert (tmp_path / "results.md").is_file()
