"""TRL integration: VespoGRPOTrainer trains off-policy with every method, and its `vespo` equals TRL's own."""

import math

import pytest
import torch
from _optional import require

require("trl")
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import vespo  # noqa: E402
from vespo.embedded.task import arithmetic_problems, build_tiny_model, build_tokenizer  # noqa: E402
from vespo.integrations.trl import VespoGRPOConfig, VespoGRPOTrainer  # noqa: E402
from vespo.losses.adaptive import BatchContext  # noqa: E402


def _digit_reward(completions, **kwargs):
    """A dense toy reward (share of digit characters) so that groups have non-zero advantages."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def _config(cls, tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        max_steps=3,
        per_device_train_batch_size=4,
        num_generations=4,
        steps_per_generation=2,  # each generation batch feeds two optimizer steps: the second is off-policy
        max_completion_length=6,
        learning_rate=5e-3,
        seed=0,
        bf16=False,
    )
    base.update(kw)
    return cls(**base)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """A ~0.2M-parameter model is ~15x faster single-threaded on a shared CPU (no thread oversubscription)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def dataset():
    return Dataset.from_dict({"prompt": [p.prompt for p in arithmetic_problems(16, seed=0)]})


@pytest.mark.parametrize("method", vespo.available_methods())
def test_three_off_policy_steps(method, tokenizer, dataset, tmp_path):
    model = build_tiny_model(tokenizer, seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = _config(VespoGRPOConfig, tmp_path, vespo_method=method)
    trainer = VespoGRPOTrainer(
        model=model, reward_funcs=_digit_reward, args=cfg, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "is/log_w_max" in h]
    assert len(logs) == 3
    assert all(math.isfinite(h["loss/pg"]) and math.isfinite(h["entropy"]) for h in logs)
    # step 1 is on-policy (W = 1 exactly); step 2 reuses step 1's samples after an update, so W != 1
    assert logs[0]["is/log_w_max"] == 0.0 and logs[0]["is/log_w_min"] == 0.0
    assert max(abs(logs[1]["is/log_w_max"]), abs(logs[1]["is/log_w_min"])) > 1e-4
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    if method == "vespo_schedule":  # two optimizer steps per generation batch: k = 0, 1, then a new batch
        assert [h["adaptive/mini_batch_index"] for h in logs] == [0.0, 1.0, 0.0]


def test_schedule_rejects_steps_that_straddle_generation_batches(tokenizer, dataset, tmp_path):
    cfg = _config(
        VespoGRPOConfig, tmp_path, vespo_method="vespo_schedule", steps_per_generation=3, gradient_accumulation_steps=2
    )
    with pytest.raises(ValueError, match="multiple of gradient_accumulation_steps"):
        VespoGRPOTrainer(
            model=build_tiny_model(tokenizer, seed=1),
            reward_funcs=_digit_reward,
            args=cfg,
            train_dataset=dataset,
            processing_class=tokenizer,
        )


def _inputs(tokenizer, seed: int):
    """A hand-built TRL micro-batch: left-padded prompts, right-padded completions, stale old log-probs."""
    g = torch.Generator().manual_seed(seed)
    B, P, T = 6, 5, 7
    prompt_ids = torch.randint(5, len(tokenizer), (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :2] = 0
    completion_ids = torch.randint(5, len(tokenizer), (B, T), generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 7])
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(B, generator=g),
        "num_items_in_batch": completion_mask.sum() * 2,  # the generation batch holds two such micro-batches
    }
    return inputs


def _trainer(cls, cfg_cls, tokenizer, dataset, tmp_path, ga=2, **kw):
    cfg = _config(cfg_cls, tmp_path, gradient_accumulation_steps=ga, **kw)
    trainer = cls(
        model=build_tiny_model(tokenizer, seed=3),
        reward_funcs=_digit_reward,
        args=cfg,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = ga
    return trainer


def _same_loss_and_gradient(ours, theirs, inputs):
    """Both trainers' loss and gradient on one micro-batch agree (and the gradient is not zero)."""
    losses, grads = [], []
    for trainer in (ours, theirs):
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    assert grads[0].abs().max() > 1e-4


@pytest.mark.parametrize("with_is", [False, True])
def test_vespo_equals_trl_loss_type_vespo(with_is, tokenizer, dataset, tmp_path):
    """Same model, same micro-batch: our `vespo` loss and gradient equal TRL's `loss_type="vespo"`."""
    ours = _trainer(
        VespoGRPOTrainer,
        VespoGRPOConfig,
        tokenizer,
        dataset,
        tmp_path / "a",
        vllm_importance_sampling_mode="token_truncate",
    )
    theirs = _trainer(GRPOTrainer, GRPOConfig, tokenizer, dataset, tmp_path / "b", loss_type="vespo")
    inputs = _inputs(tokenizer, 0)
    with torch.no_grad():  # behaviour policy: the current model with perturbed log-probs, so W spans ~[0.3, 3]
        lp, _, _ = ours._get_per_token_logps_and_entropies(
            ours.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            inputs["completion_ids"].size(1),
        )
    g = torch.Generator().manual_seed(5)
    inputs["old_per_token_logps"] = lp + 0.3 * torch.randn(lp.shape, generator=g)
    if with_is:  # TRL's token_truncate ratio min(mu / pi_vllm, 3), 1 on padding
        ratio = torch.exp(0.2 * torch.randn(lp.shape, generator=g)).clamp(max=3.0)
        inputs["importance_sampling_ratio"] = torch.where(
            inputs["completion_mask"].bool(), ratio, torch.ones_like(ratio)
        )
    _same_loss_and_gradient(ours, theirs, inputs)
    # the weights are far from 1, so the check is not the on-policy limit in disguise
    ours._flush_vespo_metrics()  # metrics stay tensors until TRL logs
    assert ours._metrics["train"]["weight/min_pos"][-1] < 0.9 or ours._metrics["train"]["weight/min_neg"][-1] < 0.9
    assert ours._metrics["train"]["vespo/Z"][-1] == pytest.approx(
        theirs._metrics["train"]["vespo/phi_seq_mean"][-1], rel=1e-5
    )


def test_normaliser_matches_trl_for_grpo_style_seq_mean(tokenizer, dataset, tmp_path):
    """With vespo's grpo at TRL's epsilons and seq-mean-token-mean, the loss equals TRL's `loss_type="grpo"`."""
    ours = _trainer(
        VespoGRPOTrainer,
        VespoGRPOConfig,
        tokenizer,
        dataset,
        tmp_path / "a",
        vespo_method="grpo",
        vespo_hparams={"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 1e9},
        vespo_loss_agg_mode="seq-mean-token-mean",
    )
    theirs = _trainer(GRPOTrainer, GRPOConfig, tokenizer, dataset, tmp_path / "b", loss_type="grpo", epsilon_high=0.28)
    inputs = _inputs(tokenizer, 1)
    with torch.no_grad():
        lp, _, _ = ours._get_per_token_logps_and_entropies(
            ours.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            inputs["completion_ids"].size(1),
        )
    inputs["old_per_token_logps"] = lp + 0.3 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(2))
    a = ours._compute_loss(ours.model, inputs)
    b = theirs._compute_loss(theirs.model, inputs)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    ours._flush_vespo_metrics()
    assert ours._metrics["train"]["clip/frac"][-1] > 0


def test_config_refuses_unsupported_options(tmp_path):
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        _config(VespoGRPOConfig, tmp_path, top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        _config(VespoGRPOConfig, tmp_path, vespo_hparams={"k_pos": 2.0})
    with pytest.raises(ValueError, match="which TRL has only from vLLM: set use_vllm=True"):
        _config(VespoGRPOConfig, tmp_path, vespo_hparams={"rollout_is_threshold": 3.0})
    with pytest.raises(ValueError, match="c1_pos must be a finite real number, got 'abc'"):
        _config(VespoGRPOConfig, tmp_path, vespo_hparams={"c1_pos": "abc"})
    with pytest.raises(ValueError, match="unknown policy-loss method"):
        _config(VespoGRPOConfig, tmp_path, vespo_method="ppo")


def test_luspo_equals_trl_loss_type_luspo(tokenizer, dataset, tmp_path):
    """Issue 54: vespo's luspo (GSPO summed over each sequence, mean over sequences) equals TRL's
    `loss_type="luspo"` at sequence-level importance sampling and TRL's epsilon: loss and gradient."""
    ours = _trainer(
        VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path / "a", vespo_method="luspo",
        vespo_hparams={"clip_ratio_low": 0.2, "clip_ratio_high": 0.2},
    )  # fmt: skip
    theirs = _trainer(
        GRPOTrainer, GRPOConfig, tokenizer, dataset, tmp_path / "b", loss_type="luspo",
        importance_sampling_level="sequence",
    )  # fmt: skip
    inputs = _inputs(tokenizer, 1)
    with torch.no_grad():
        lp, _ = ours._log_probs(ours.model, inputs, compute_entropy=False)
    inputs["old_per_token_logps"] = lp + 0.8 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(4))
    _same_loss_and_gradient(ours, theirs, inputs)
    ours._flush_vespo_metrics()
    assert 0 < ours._metrics["train"]["clip/frac"][-1] < 1  # some sequences clipped, some not


def test_vespo_hparams_settable_from_trls_cli_as_json(tmp_path):
    """Issue 50: HfArgumentParser rejected the dict field; a JSON string or None raised TypeError. Now TRL's CLI takes a
    JSON object, None means the defaults, and anything else is one line naming vespo_hparams."""
    from transformers import HfArgumentParser

    argv = ["--output_dir", str(tmp_path), "--use_cpu", "true", "--report_to", "none", "--vespo_method", "sapo",
            "--vespo_hparams", '{"tau_pos": 2, "tau_neg": 1.5}']  # fmt: skip
    (cfg,) = HfArgumentParser(VespoGRPOConfig).parse_args_into_dataclasses(argv)
    assert cfg.vespo_method == "sapo" and cfg.vespo_hparams == {"tau_pos": 2, "tau_neg": 1.5}
    assert _config(VespoGRPOConfig, tmp_path, vespo_hparams=None).vespo_hparams == {}
    assert _config(VespoGRPOConfig, tmp_path, vespo_hparams='{"c1_pos": 2.5}').vespo_hparams == {"c1_pos": 2.5}
    for value, message in [
        ("{c1_pos: 2}", r"^vespo_hparams must be a JSON object, e.g. '\{\"c1_pos\": 2.0\}': "),
        ("[1, 2]", r"^vespo_hparams must be a mapping .* got list$"),
        (3, r"^vespo_hparams must be a mapping .* got int$"),
        ('{"c1_pos": 1e39}', r"^vespo_hparams: vespo hyperparameter c1_pos must be 0 or a float32 number"),
    ]:
        with pytest.raises(ValueError, match=message) as err:
            _config(VespoGRPOConfig, tmp_path, vespo_hparams=value)
        assert "\n" not in str(err.value)


def _accumulated_grad(trainer, micro_batches):
    """The gradient TRL's loop accumulates over `micro_batches` (one optimizer step's), as one flat vector."""
    trainer.model.zero_grad()
    trainer._buffered_inputs, trainer._vespo_context = micro_batches, None
    for step, mb in enumerate(micro_batches):
        trainer._step = step
        trainer._compute_loss(trainer.model, mb).backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters()])


@pytest.mark.parametrize("method", ["vespo_moment", "vespo_ess", "vespo_selfnorm"])
def test_adaptive_accumulation_equals_one_pass(method, tokenizer, dataset, tmp_path):
    """Gradient accumulation over two micro-batches gives the gradient of one pass over both: the controller decides
    on the optimizer step's statistics (one no-grad forward over TRL's buffered window), not per micro-batch."""
    hp = {"vespo_moment": {"moment_target_pos": 1.0, "moment_target_neg": 1.0}}.get(method, {})
    hp |= {"vespo_ess": {"ess_target": 0.9}}.get(method, {})
    split = _trainer(
        VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path / "a", vespo_method=method, vespo_hparams=hp
    )  # GA = 2, steps_per_generation = 2
    whole = _trainer(
        VespoGRPOTrainer,
        VespoGRPOConfig,
        tokenizer,
        dataset,
        tmp_path / "b",
        vespo_method=method,
        vespo_hparams=hp,
        ga=1,
        steps_per_generation=1,
    )  # GA = 1: one pass over both micro-batches
    mbs = [_inputs(tokenizer, 10), _inputs(tokenizer, 11)]
    g = torch.Generator().manual_seed(7)
    for i, mb in enumerate(mbs):  # stale behaviour log-probs, shifted per micro-batch so their W differ
        with torch.no_grad():
            lp, _ = split._log_probs(split.model, mb, compute_entropy=False)
        mb["old_per_token_logps"] = lp + (0.4 * i - 0.2) + 0.5 * torch.randn(lp.shape, generator=g)
        mb["num_items_in_batch"] = mbs[0]["completion_mask"].sum() + mbs[1]["completion_mask"].sum()
    one = {k: torch.cat([mbs[0][k], mbs[1][k]]) for k in mbs[0] if k != "num_items_in_batch"}
    one["num_items_in_batch"] = mbs[0]["num_items_in_batch"]

    accumulated, single = _accumulated_grad(split, mbs), _accumulated_grad(whole, [one])
    torch.testing.assert_close(accumulated, single, rtol=1e-5, atol=1e-8)
    split._flush_vespo_metrics()
    metrics = split._metrics["train"]
    control = {"vespo_moment": "adaptive/c2_neg", "vespo_ess": "adaptive/tau_pos", "vespo_selfnorm": "adaptive/Z_pos"}
    chosen = metrics[control[method]][-2:]  # both micro-batches chose the same kernel, and not the paper's
    assert chosen[0] == chosen[1] and chosen[0] != {"vespo_moment": 2.0}.get(method, 1.0)
    # deciding per micro-batch (the call's own statistics, k and N only) gives a different gradient
    split._step_context = lambda model: BatchContext(mini_batch_index=0, num_mini_batches=1)
    per_micro = _accumulated_grad(split, mbs)
    assert (per_micro - single).norm() > 1e-3 * single.norm()


@pytest.mark.slow
def test_adaptive_decision_is_gathered_across_two_processes(tmp_path):
    """Two CPU processes (accelerate on gloo), two micro-batches each: both decide on all four micro-batches, and
    their mean gradient equals one pass over all four (tests/integrations/_trl_multiprocess_job.py)."""
    import json
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    here = os.path.dirname(os.path.abspath(__file__))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.path.join(here, "..", "..", "src"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "WORLD_SIZE": "2",
        "TOKENIZERS_PARALLELISM": "false",
    }
    out = tmp_path / "out.json"
    cmd = [sys.executable, os.path.join(here, "_trl_multiprocess_job.py"), str(out)]
    procs = [
        subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]  # fmt: skip
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    results = json.loads(out.read_text())
    assert set(results) == {"vespo_selfnorm", "vespo_moment", "vespo_ess"}
    for method, r in results.items():
        assert r["context_rows"] == 24 and r["same_context"], method  # 2 processes x 2 micro-batches x 6 rows
        assert r["rel_err"] < 1e-5 and r["ref_norm"] > 1e-3, (method, r)
        paper = {"vespo_moment": {"adaptive/c2_pos": 3.0, "adaptive/c2_neg": 2.0}}.get(method, {})
        for key, values in r["chosen"].items():
            assert values == pytest.approx([r["ref_chosen"][key]] * 2, rel=1e-5), (method, key, r)
        assert any(r["ref_chosen"][k] != paper.get(k, 1.0) for k in r["chosen"]), (method, r)  # control active


# ---------------------------------------------------------------------------------------------------------------------
# TRL's known pitfalls (issue 23.3)


def _grad(trainer, micro_batches):
    """Sum of the micro-batches' gradients (no optimizer step in between) and their losses."""
    trainer.model.zero_grad()
    losses = []
    for mb in micro_batches:
        loss = trainer._compute_loss(trainer.model, mb)
        loss.backward()
        losses.append(loss.detach())
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters()]), losses


def _stale(trainer, mb, seed):
    """Behaviour log-probs a perturbation away from the model's, so W != 1."""
    with torch.no_grad():
        lp, _ = trainer._log_probs(trainer.model, mb, compute_entropy=False)
    mb["old_per_token_logps"] = lp + 0.3 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(seed))
    return mb


@pytest.mark.parametrize(("spg", "ga"), [(4, 2), (2, 4), (2, 2)])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_steps_per_generation_not_accumulation_gives_one_pass_gradient(spg, ga, agg, tokenizer, dataset, tmp_path):
    """TRL issue 5619 (fixed in TRL PR 6024): the token normaliser must follow the accumulation window, not the
    generation batch. Over 4 micro-batches (4 / GA optimizer steps), the mean step gradient equals one pass over all
    4 micro-batches, whatever steps_per_generation is."""
    split = _trainer(VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path / "a", ga=ga,
                     steps_per_generation=spg, vespo_loss_agg_mode=agg)  # fmt: skip
    whole = _trainer(VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path / "b", ga=1,
                     steps_per_generation=1, vespo_loss_agg_mode=agg)  # fmt: skip
    mbs = [_stale(split, _inputs(tokenizer, 20 + i), i) for i in range(4)]
    per_generation = sum(int(mb["completion_mask"].sum()) for mb in mbs[:spg])  # TRL: tokens of the generation batch
    for mb in mbs:
        mb["num_items_in_batch"] = torch.tensor(float(per_generation))
    one = {k: torch.cat([mb[k] for mb in mbs]) for k in mbs[0] if k != "num_items_in_batch"}
    one["num_items_in_batch"] = torch.tensor(float(sum(int(mb["completion_mask"].sum()) for mb in mbs)))
    accumulated, _ = _grad(split, mbs)
    single, _ = _grad(whole, [one])
    torch.testing.assert_close(accumulated * ga / 4, single, rtol=1e-5, atol=1e-8)
    assert single.abs().max() > 1e-4


def _trl_ratio(old, sampled, mask, mode, clip_max=3.0):
    """TRL's vLLM importance-sampling ratio (GRPOTrainer._generate_and_score_completions, clip_min None)."""
    diff = (old - sampled) * mask
    diff = diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff
    ratio = torch.exp(diff)
    return ratio.clamp(max=clip_max) if mode.endswith("truncate") else ratio.masked_fill(ratio > clip_max, 0.0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("method", ["vespo", "grpo"])
def test_every_vllm_importance_sampling_mode_works(mode, method, tokenizer, dataset, tmp_path):
    """Each mode TRL accepts (TRL's own vespo refuses the sequence ones, including its default sequence_mask) gives the
    loss of vespo's core with the same correction from the sampler's log-probs (truncation at C = 3, or IcePop
    masking above 3); an unknown mode is refused with one line."""
    trainer = _trainer(VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path, vespo_method=method,
                       vllm_importance_sampling_mode=mode)  # fmt: skip
    mb = _stale(trainer, _inputs(tokenizer, 30), 3)
    mask = mb["completion_mask"].float()
    g = torch.Generator().manual_seed(4)
    sampled = (mb["old_per_token_logps"] + (0.8 if mode.startswith("token") else 0.3) * torch.randn(
        mask.shape, generator=g)).clamp(max=-1e-4)  # fmt: skip
    mb["importance_sampling_ratio"] = _trl_ratio(mb["old_per_token_logps"], sampled, mask, mode)
    level = "sequence" if mode.startswith("sequence") else "token"
    threshold = 3.0 if mode.endswith("truncate") else "1e-30_3"
    loss = trainer._compute_loss(trainer.model, mb)
    lp, _ = trainer._log_probs(trainer.model, mb, compute_entropy=False)
    ref, metrics = vespo.compute_policy_loss(
        method, log_prob=lp, old_log_prob=mb["old_per_token_logps"], advantages=mb["advantages"],
        response_mask=mask, rollout_log_prob=sampled, rollout_is=level, rollout_is_threshold=threshold,
        global_num_tokens=mb["num_items_in_batch"],  # TRL's window normaliser, tokens * GA / spg (GA = spg)
    )  # fmt: skip
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-7)
    affected = metrics.get("rollout_is/frac_truncated", metrics.get("rollout_is/masked_frac"))
    assert 0 < affected < 1  # the mode changed some weights and left others
    with pytest.raises(ValueError, match=r"^vllm_importance_sampling_mode='token_clip' is not one VespoGRPOTrainer"):
        _config(VespoGRPOConfig, tmp_path, vllm_importance_sampling_mode="token_clip")


@pytest.mark.parametrize("method", ["vespo", "grpo", "gspo", "vespo_selfnorm"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_fully_masked_micro_batch_gives_zero_loss_not_nan(method, agg, tokenizer, dataset, tmp_path):
    """A micro-batch whose completions are all masked (TRL pads the last one; tool masks) contributes 0: loss, gradient
    and metrics are finite, with the KL term on."""
    trainer = _trainer(VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path, vespo_method=method,
                       vespo_loss_agg_mode=agg)  # fmt: skip
    trainer.beta = 0.1  # the KL term, its reference log-probs given below (no reference model to load)
    mb = _stale(trainer, _inputs(tokenizer, 40), 5)
    mb["completion_mask"] = torch.zeros_like(mb["completion_mask"])
    mb["num_items_in_batch"] = torch.tensor(0.0)
    mb["ref_per_token_logps"] = mb["old_per_token_logps"] - 0.1
    trainer._buffered_inputs, trainer._step, trainer._vespo_context = [mb, mb], 0, None
    grad, (loss,) = _grad(trainer, [mb])
    assert loss.item() == 0.0 and bool(torch.isfinite(grad).all()) and grad.abs().max().item() == 0.0
    trainer._flush_vespo_metrics()
    bad = {k: v[-1] for k, v in trainer._metrics["train"].items() if not math.isfinite(v[-1])}
    assert not bad, bad


def test_w_phi_and_ess_metrics_reach_trls_logs(tokenizer, dataset, tmp_path):
    """TRL's native vespo logs no weight diagnostics; VespoGRPOTrainer's log W, phi(W) and ESS reach TRL's log
    history every logged step (an off-policy step, so they are not trivially 1)."""
    cfg = _config(VespoGRPOConfig, tmp_path, max_steps=2)
    trainer = VespoGRPOTrainer(model=build_tiny_model(tokenizer, seed=1), reward_funcs=_digit_reward, args=cfg,
                               train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss/pg" in h]
    assert len(logs) == 2
    for key in ("is/log_w_mean", "is/ess", "weight/mean_pos", "weight/mean_neg", "weight/ess", "vespo/Z"):
        assert all(key in h and math.isfinite(h[key]) for h in logs), key
    assert logs[1]["is/ess"] < 1.0 and logs[1]["vespo/Z"] != 1.0  # off-policy: W and phi(W) differ from 1


def test_vespo_side_rollout_correction_from_trl_sampling_log_probs(tokenizer, dataset, tmp_path):
    """With vLLM and TRL's correction off, veRL-named options in vespo_hparams correct from TRL's
    `sampling_per_token_logps` (NaN entries count as ratio 1), as the core does from rollout log-probs."""
    trainer = _trainer(VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path)
    options = {
        "rollout_is": "token",
        "rollout_is_threshold": 1.5,
        "rollout_rs": "seq_max_k3",
        "rollout_rs_threshold": 0.3,
    }
    trainer.args.vespo_hparams = options  # as a use_vllm=True, vllm_importance_sampling_correction=False config has
    mb = _stale(trainer, _inputs(tokenizer, 50), 6)
    g = torch.Generator().manual_seed(8)
    sampled = (mb["old_per_token_logps"] + 0.5 * torch.randn(mb["completion_mask"].shape, generator=g)).clamp(max=0)
    mb["sampling_per_token_logps"] = sampled.clone()
    mb["sampling_per_token_logps"][0, 0] = math.nan
    loss = trainer._compute_loss(trainer.model, mb)
    lp, _ = trainer._log_probs(trainer.model, mb, compute_entropy=False)
    sampled[0, 0] = mb["old_per_token_logps"][0, 0]
    ref, metrics = vespo.compute_policy_loss(
        "vespo", log_prob=lp, old_log_prob=mb["old_per_token_logps"], advantages=mb["advantages"],
        response_mask=mb["completion_mask"], rollout_log_prob=sampled, global_num_tokens=mb["num_items_in_batch"],
        **options,
    )  # fmt: skip
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-7)
    assert 0 < metrics["rollout_rs/masked_frac"] < 1 and metrics["rollout_is/frac_truncated"] > 0
    trainer._flush_vespo_metrics()
    assert "rollout_rs/masked_frac" in trainer._metrics["train"]
    for kw, message in [
        (dict(vespo_hparams={"rollout_rs": "token_k2", "rollout_rs_threshold": 0.1}), "set use_vllm=True"),
        (
            dict(use_vllm=True, vespo_hparams={"rollout_is": "sequence"}),
            "set vllm_importance_sampling_correction=False",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            _config(VespoGRPOConfig, tmp_path, **kw)


def test_trl_example_builds_its_config_without_trls_sequence_mask_default(tmp_path):
    """examples/trl/vespo_grpo.py: VESPO with vLLM, N = steps_per_generation, and TRL's correction at the token level
    truncated at 2 (the official code's), not TRL's default `sequence_mask`, which zeroes whole sequences."""
    import dataclasses
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / "trl" / "vespo_grpo.py"
    spec = importlib.util.spec_from_file_location("vespo_trl_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.build_config(str(tmp_path), num_mini_batches=4, use_cpu=True, bf16=False, report_to=[])
    assert isinstance(args, VespoGRPOConfig) and args.vespo_method == "vespo" and args.steps_per_generation == 4
    assert args.use_vllm and args.vllm_importance_sampling_correction and args.beta == 0.0
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max) == ("token_truncate", 2.0)
    trl_default = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}["vllm_importance_sampling_mode"]
    assert trl_default == "sequence_mask" != args.vllm_importance_sampling_mode  # the trap the example avoids
    mask = torch.ones(2, 40)
    gaps = torch.full((2, 40), 0.05)  # pi_old / pi_vLLM = e^0.05 per token: e^2 over 40 tokens
    assert _trl_ratio(gaps, torch.zeros_like(gaps), mask, trl_default).eq(0).all()  # default: every sequence dropped
    kept = _trl_ratio(gaps, torch.zeros_like(gaps), mask, args.vllm_importance_sampling_mode, clip_max=2.0)
    torch.testing.assert_close(kept, torch.full_like(gaps, math.exp(0.05)))  # the example's: every token kept, < 2


# ---------------------------------------------------------------------------------------------------------------------
# Issue 40: the off-policy corrections of 2025-26 in TRL, and TRL's token_mask trap


def test_token_mask_trap_is_measured_and_refused(tmp_path):
    """TRL's own vespo folds a token_mask ratio of 0 as log 1e-8 = -18.4 into the sequence's log W, so one masked token
    drives phi of its whole sequence to ~0 (measured on TRL's `get_gamma_weights`; vespo's fold does the same): the
    adapter refuses the combination with a real vLLM ratio, and keeps the token methods, which drop only the token."""
    ratio = torch.ones(2, 6)
    ratio[1, 3] = 0.0  # TRL's token_mask: one token's ratio above C_max set to 0
    phi = GRPOTrainer.get_gamma_weights(
        advantages=torch.tensor([[1.0], [1.0]]), log_ratio_per_token=torch.zeros(2, 6), mask=torch.ones(2, 6),
        importance_sampling_ratio=ratio,
    )  # fmt: skip
    assert phi[0].item() == pytest.approx(1.0) and phi[1].item() < 1e-12  # five good tokens, weight ~0
    lp = torch.full((2, 6), -1.0)
    _, metrics = vespo.compute_policy_loss(
        "vespo", log_prob=lp, old_log_prob=lp, advantages=torch.tensor([1.0, 1.0]), response_mask=torch.ones(2, 6),
        rollout_is_weights=ratio, rollout_is_level="token",
    )  # fmt: skip
    assert metrics["weight/min_pos"].item() < 1e-12  # the same in vespo's fold: hence the refusal
    for method in ("vespo", "vespo_selfnorm"):
        with pytest.raises(ValueError, match="one masked token sets phi"):
            _config(VespoGRPOConfig, tmp_path, vespo_method=method, use_vllm=True,
                    vllm_importance_sampling_mode="token_mask")  # fmt: skip
    for ok in (dict(vespo_method="grpo", vllm_importance_sampling_mode="token_mask"),
               dict(vespo_method="vespo", vllm_importance_sampling_mode="token_truncate"),
               dict(vespo_method="vespo", vllm_importance_sampling_mode="sequence_mask")):  # fmt: skip
        _config(VespoGRPOConfig, tmp_path, use_vllm=True, **ok)
    with pytest.raises(ValueError, match="off-policy sequence masking is vespo_method='opsm'"):
        _config(VespoGRPOConfig, tmp_path, off_policy_mask_threshold=0.5)


def test_opsm_reads_trls_sampling_log_probs(tokenizer, dataset, tmp_path):
    """`opsm` measures its divergence from TRL's `sampling_per_token_logps` (vLLM with TRL's ratio off), with no
    importance weight from them unless vespo's options ask for one: the loss of the core's `opsm` with the sampler's
    log-probs and rollout_is=None; with TRL's ratio on it is refused (vespo would see the ratio only)."""
    trainer = _trainer(VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path, vespo_method="opsm")
    mb = _stale(trainer, _inputs(tokenizer, 60), 9)
    mb["advantages"] = -mb["advantages"].abs()  # every sequence negative: each may be dropped
    g = torch.Generator().manual_seed(3)
    mb["sampling_per_token_logps"] = mb["old_per_token_logps"] + 1.5 * torch.rand(mb["completion_mask"].shape,
                                                                                  generator=g)  # fmt: skip
    loss = trainer._compute_loss(trainer.model, mb)
    lp, _ = trainer._log_probs(trainer.model, mb, compute_entropy=False)
    ref, metrics = vespo.compute_policy_loss(
        "opsm", log_prob=lp, old_log_prob=mb["old_per_token_logps"], advantages=mb["advantages"],
        response_mask=mb["completion_mask"], rollout_log_prob=mb["sampling_per_token_logps"], rollout_is=None,
        global_num_seqs=2 * mb["completion_mask"].shape[0],  # TRL's sequence normaliser: rows x GA
    )  # fmt: skip
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-7)
    assert 0 < metrics["opsm/masked_frac"] < 1
    with pytest.raises(ValueError, match="set vllm_importance_sampling_correction=False"):
        _config(VespoGRPOConfig, tmp_path, vespo_method="opsm", use_vllm=True)


def test_m2po_accumulation_equals_one_pass(tokenizer, dataset, tmp_path):
    """M2PO's mask is decided over the optimizer step (TRL's accumulation window, gathered like the adaptive
    methods' statistics): two micro-batches accumulate the gradient of one pass; deciding per micro-batch differs."""
    hp = {"m2_threshold": 0.05}
    split = _trainer(VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path / "a", vespo_method="m2po",
                     vespo_hparams=hp)  # fmt: skip
    whole = _trainer(VespoGRPOTrainer, VespoGRPOConfig, tokenizer, dataset, tmp_path / "b", vespo_method="m2po",
                     vespo_hparams=hp, ga=1, steps_per_generation=1)  # fmt: skip
    mbs = [_inputs(tokenizer, 70 + i) for i in range(2)]
    for i, (mb, scale) in enumerate(zip(mbs, (0.05, 0.6), strict=True)):  # a fresh and a stale micro-batch
        with torch.no_grad():
            lp, _ = split._log_probs(split.model, mb, compute_entropy=False)
        mb["old_per_token_logps"] = lp + scale * torch.randn(lp.shape, generator=torch.Generator().manual_seed(i))
    for mb in mbs:
        mb["num_items_in_batch"] = mbs[0]["completion_mask"].sum() + mbs[1]["completion_mask"].sum()
    one = {k: torch.cat([mbs[0][k], mbs[1][k]]) for k in mbs[0] if k != "num_items_in_batch"}
    one["num_items_in_batch"] = mbs[0]["num_items_in_batch"]

    accumulated, single = _accumulated_grad(split, mbs), _accumulated_grad(whole, [one])
    torch.testing.assert_close(accumulated, single, rtol=1e-5, atol=1e-8)
    split._flush_vespo_metrics()
    assert max(split._metrics["train"]["m2po/masked_frac"][-2:]) > 0  # the mask acted
    split._step_context = lambda model: BatchContext(mini_batch_index=0, num_mini_batches=1)
    per_micro = _accumulated_grad(split, mbs)
    assert (per_micro - single).norm() > 1e-3 * single.norm()
