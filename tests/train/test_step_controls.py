"""Step-size controls for stale mini-batches (issue 19): mean-phi step scaling, PPO's target-KL stop, and the logged
share of clipped steps; each checked against the plain update it modifies."""

import copy

import pytest
import torch

from vespo.advantages import group_advantages
from vespo.embedded.task import arithmetic_split, build_tiny_model, build_tokenizer
from vespo.rollout import sample
from vespo.train.config import ConfigError, TrainConfig
from vespo.train.learner import Learner, UpdateBatch, UpdateSettings, policy_log_probs, ppo_update
from vespo.train.step_metrics import summarize_update, to_floats


def _setup(seed=0):
    tok = build_tokenizer()
    model = build_tiny_model(tok, num_hidden_layers=1, seed=seed)
    prompts = [p.prompt for p in arithmetic_split(num_operands=2, max_operand=9, eval_size=1)[0][:4]]
    rollout = sample(model, tok, prompts, n=4, max_new_tokens=6, generator=torch.Generator().manual_seed(seed))
    adv = group_advantages(torch.tensor([float(i % 3 == 0) for i in range(16)]), 4)
    with torch.no_grad():
        old, _ = policy_log_probs(model, rollout, torch.arange(16), micro_batch_size=8, temperature=1.0)
    return model, rollout, adv, old


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _update(model, optimizer, rollout, adv, old, settings):
    """The N-mini-batch update's per mini-batch metrics."""
    return ppo_update(Learner(model, optimizer, settings), UpdateBatch(rollout, adv, old))[0]


def test_mean_phi_scales_the_adam_step_by_z():
    """Stale mini-batch (mu moved away on purpose): the scaled step is exactly Z times the plain Adam step."""
    model, rollout, adv, old = _setup()
    stale_old = old + 0.3 * rollout.response_mask  # log W = -0.3 per token: phi < 1
    steps, zs = [], []
    for scale in ("none", "mean_phi"):
        m = copy.deepcopy(model)
        start = _params(m)
        settings = UpdateSettings(method="vespo", seqs_per_mini_batch=16, micro_batch_size=8, step_scale=scale)
        hist = _update(m, torch.optim.AdamW(m.parameters(), lr=1e-2), rollout, adv, stale_old, settings)
        steps.append([p.detach() - s for p, s in zip(m.parameters(), start, strict=True)])
        zs.append(float(hist[0]["vespo/Z"]))
    z = zs[1]
    assert 0.05 < z < 0.95  # the test can fail: Z is far from 1
    assert float(hist[0]["actor/step_scale"]) == pytest.approx(z)
    for plain, scaled in zip(*steps, strict=True):
        torch.testing.assert_close(scaled, z * plain, rtol=1e-4, atol=1e-8)


def test_target_kl_stops_before_the_first_mini_batch_past_the_bound():
    """N = 4 at a large lr: k = 0 is on-policy (KL 0) and trains; k = 1 is past a tiny target, so the update stops
    with exactly one optimizer step taken, the same weights as an update of one mini-batch."""
    model, rollout, adv, old = _setup()
    base = dict(method="grpo", num_mini_batches=4, seqs_per_mini_batch=4, micro_batch_size=4)
    stopped, one = copy.deepcopy(model), copy.deepcopy(model)
    hist = _update(
        stopped, torch.optim.AdamW(stopped.parameters(), lr=5e-2), rollout, adv, old,
        UpdateSettings(**base, target_kl=1e-6),
    )  # fmt: skip
    assert len(hist) == 2 and float(hist[0]["actor/kl_stopped"]) == 0 and float(hist[1]["actor/kl_stopped"]) == 1
    assert float(hist[0]["actor/target_kl_k3"]) == 0.0 and float(hist[1]["actor/target_kl_k3"]) > 1e-6
    _update(
        one,
        torch.optim.AdamW(one.parameters(), lr=5e-2),
        rollout,
        adv,
        old,
        UpdateSettings(**base | {"num_mini_batches": 1}),
    )
    for a, b in zip(stopped.parameters(), one.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    summary = to_floats(summarize_update(hist))
    assert summary["actor/num_mini_batches"] == 1 and summary["actor/kl_stopped"] == 1
    # a loose target never stops
    loose = _update(
        copy.deepcopy(model), torch.optim.AdamW(model.parameters(), lr=5e-2), rollout, adv, old,
        UpdateSettings(**base, target_kl=1e3),
    )  # fmt: skip
    assert len(loose) == 4 and not any(float(h["actor/kl_stopped"]) for h in loose)


@pytest.mark.parametrize(("clip", "expected"), [(1e-8, 1.0), (1e8, 0.0)])
def test_share_of_clipped_steps_is_logged(clip, expected):
    model, rollout, adv, old = _setup()
    settings = UpdateSettings(method="topr", num_mini_batches=2, seqs_per_mini_batch=8, grad_clip=clip)
    hist = _update(model, torch.optim.SGD(model.parameters(), lr=1e-3), rollout, adv, old, settings)
    assert to_floats(summarize_update(hist))["actor/grad_clipped"] == expected


def test_controls_are_validated_before_compute():
    with pytest.raises(ConfigError, match="step_scale=mean_phi needs a VESPO-family method"):
        TrainConfig(method="grpo", step_scale="mean_phi")
    with pytest.raises(ConfigError, match="target_kl"):
        TrainConfig(target_kl=0.0)
    assert TrainConfig(method="vespo_selfnorm", step_scale="mean_phi", target_kl=0.05).optimizer.target_kl == 0.05


def test_one_clip_and_one_step_for_the_trainer_and_the_lab():
    """Issue 41: the lab clips and steps with the learner's functions. A gradient (3, 4) has norm 5: grad_clip 1
    scales it to (0.6, 0.8), grad_clip 0 (the lab's "off") leaves it; both return 5. SGD at lr 1 then moves the weights
    by that gradient, and step_scale "mean_phi" with mean phi 0.25 by a quarter of it: (-0.75, -1), norm 1.25."""
    from vespo.train.learner import clip_gradient, optimizer_step

    for max_norm, after in ((1.0, [0.6, 0.8]), (0.0, [3.0, 4.0])):
        theta = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        theta.grad = torch.tensor([3.0, 4.0], dtype=torch.float64)
        assert float(clip_gradient([theta], max_norm)) == pytest.approx(5.0)
        assert theta.grad.tolist() == pytest.approx(after)
    opt = torch.optim.SGD([theta], lr=1.0)
    mask = torch.ones(1, 1, dtype=torch.float64)
    inputs = ({"vespo/Z": torch.tensor(0.25, dtype=torch.float64)}, mask, mask, None, mask)
    out = optimizer_step(opt, [theta], True, step_scale="mean_phi", log_update_norm=True, scaler=None,
                         scheduler=None, step_inputs=inputs)  # fmt: skip
    assert theta.tolist() == pytest.approx([-0.75, -1.0]) and float(out["actor/step_scale"]) == 0.25
    assert float(out["actor/update_norm"]) == pytest.approx(1.25)


def test_old_log_prob_is_input_only_and_mu_comes_back():
    """`ppo_update` never writes into the caller's old log-probs: it returns mu. Given, mu is that tensor unchanged;
    None, mu is scored under the weights before the first step (mini-batch 1 by a no-grad forward, mini-batch 0 by
    its own forward), so it equals the log-probs taken before the update although the weights moved."""
    model, rollout, adv, old = _setup()
    settings = UpdateSettings(method="vespo", num_mini_batches=2, seqs_per_mini_batch=8, micro_batch_size=4)
    given = old + 0.1 * rollout.response_mask
    before = given.clone()
    m = copy.deepcopy(model)
    _, mu = ppo_update(Learner(m, torch.optim.SGD(m.parameters(), lr=1e-2), settings), UpdateBatch(rollout, adv, given))
    assert mu is given and torch.equal(given, before)
    m = copy.deepcopy(model)
    _, mu = ppo_update(Learner(m, torch.optim.SGD(m.parameters(), lr=1e-2), settings), UpdateBatch(rollout, adv))
    torch.testing.assert_close(mu, old, rtol=0, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(m.parameters(), model.parameters(), strict=True))
