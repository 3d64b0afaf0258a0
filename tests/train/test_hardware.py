"""Devices, mixed precision, the learning-rate schedule and LoRA (issue 20), each against the plain fp32 path it
modifies; CUDA cases run where a GPU is present and are skipped (not faked) elsewhere."""

import copy
import math

import pytest
import torch

from vespo.advantages import group_advantages
from vespo.cli import main
from vespo.embedded.task import arithmetic_split, build_tiny_model, build_tokenizer
from vespo.models import resolve_device
from vespo.rollout import sample
from vespo.train.config import ConfigError, TrainConfig
from vespo.train.host import check_host
from vespo.train.learner import Learner, UpdateBatch, UpdateSettings, policy_log_probs, ppo_update
from vespo.train.logs import read_metrics
from vespo.train.setup import build_reference, build_scheduler

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _setup(device="cpu", seed=0, autocast_dtype=None):
    tok = build_tokenizer()
    model = build_tiny_model(tok, num_hidden_layers=1, seed=seed).to(device)
    prompts = [p.prompt for p in arithmetic_split(num_operands=2, max_operand=9, eval_size=1)[0][:4]]
    gen = torch.Generator(device=device).manual_seed(seed)
    rollout = sample(model, tok, prompts, n=4, max_new_tokens=6, generator=gen)
    adv = group_advantages(torch.tensor([float(i % 3 == 0) for i in range(16)], device=device), 4)
    with torch.no_grad():
        old, _ = policy_log_probs(
            model, rollout, torch.arange(16), micro_batch_size=8, temperature=1.0, autocast_dtype=autocast_dtype
        )
    return model, tok, rollout, adv, old


def test_resolve_device_names():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("tpu", "cuda:x", "gpu0"):
        with pytest.raises(ValueError, match="auto | cpu | cuda"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda:0")


@pytest.mark.parametrize("flags", [["--device", "tpu"], ["--bf16", "--fp16"], ["--warmup-ratio", "1.5"]])
def test_bad_hardware_flags_are_one_line_errors(flags, capsys):
    assert main(["train", *flags, "--no-progress"]) == 2
    err = capsys.readouterr()
    line = (err.err + err.out).strip().splitlines()
    assert len(line) == 1 and "Traceback" not in line[0], line


@pytest.mark.parametrize("device", DEVICES)
def test_update_runs_on_the_device_and_is_on_policy_at_k0(device):
    """Every tensor of the update lives on `device`; mini-batch 0 is on-policy (log W == 0 exactly)."""
    model, _, rollout, adv, old = _setup(device)
    assert rollout.input_ids.device.type == device and old.device.type == device
    settings = UpdateSettings(method="vespo", num_mini_batches=2, seqs_per_mini_batch=8, micro_batch_size=4)
    hist, _ = ppo_update(Learner(model, torch.optim.AdamW(model.parameters(), lr=1e-2), settings),
                         UpdateBatch(rollout, adv, old))  # fmt: skip
    assert all(p.device.type == device for p in model.parameters())
    assert float(hist[0]["is/log_w_mean"]) == 0.0 and float(hist[1]["is/log_w_mean"]) != 0.0


@pytest.mark.parametrize("method", ["vespo", "vespo_schedule"])  # the second reads the mini-batch's own log W first
def test_scoring_mu_inside_the_update_equals_scoring_it_first(method):
    """`Learner.update` without old log-probs (TRL's on-policy shortcut: mini-batch 0's mu from its own forward, the
    stale rows scored before the first step) takes the same steps as scoring every row first, logs the same metrics,
    and measures the same train-inference gap; with dropout active it scores separately and still agrees."""
    from vespo.train.learner import Learner
    from vespo.train.step_metrics import mismatch_metrics

    model, _, rollout, adv, old = _setup()
    settings = UpdateSettings(method=method, num_mini_batches=2, seqs_per_mini_batch=8, micro_batch_size=4,
                              log_update_norm=True)  # fmt: skip
    runs = {}
    for name in ("first", "inside"):
        m = copy.deepcopy(model)
        learner = Learner(m, torch.optim.AdamW(m.parameters(), lr=1e-2), settings)
        metrics = learner.update(rollout, adv, old if name == "first" else None)
        runs[name] = (m, metrics)
    (m1, first), (m2, inside) = runs["first"], runs["inside"]
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert float(inside["is/log_w_mean/first_mini_batch"]) == 0.0  # W == 1 exactly where mu is the forward itself
    for key in first:
        torch.testing.assert_close(first[key], inside[key], atol=1e-5, rtol=1e-4, msg=key)
    gap = mismatch_metrics(old, rollout)
    assert set(inside) - set(first) == set(gap)
    for key, value in gap.items():
        torch.testing.assert_close(inside[key], value, atol=1e-6, rtol=1e-5)
    dropout = copy.deepcopy(model)
    dropout.model.norm = torch.nn.Sequential(dropout.model.norm, torch.nn.Dropout(0.5))  # active in train mode
    scored = []
    learner = Learner(dropout, torch.optim.SGD(dropout.parameters(), lr=0.0), settings)
    real = learner.log_probs
    learner.log_probs = lambda r: scored.append(1) or real(r)  # the separate eval-mode scoring is used
    assert float(learner.update(rollout, adv)["is/log_w_mean/first_mini_batch"]) != 0.0 and scored == [1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_autocast_is_finite_close_to_fp32_and_on_policy(dtype):
    """Autocast of the forward passes: log-probs stay fp32 and within bf16/fp16 rounding of the fp32 ones, the loss
    is finite and close, and old log-probs taken under the same autocast keep W == 1 at k = 0."""
    model, _, rollout, adv, old32 = _setup()
    rows = torch.arange(16)
    with torch.no_grad():
        old_lp, _ = policy_log_probs(model, rollout, rows, micro_batch_size=8, temperature=1.0, autocast_dtype=dtype)
    assert old_lp.dtype == torch.float32
    torch.testing.assert_close(old_lp, old32, atol=0.05, rtol=0.05)
    assert (old_lp - old32).abs().max() > 0  # autocast really ran in low precision
    losses = {}
    for name, (lp, cast) in {"fp32": (old32, None), "low": (old_lp, dtype)}.items():
        m = copy.deepcopy(model)
        settings = UpdateSettings(method="vespo", seqs_per_mini_batch=16, micro_batch_size=8, autocast_dtype=cast)
        scaler = torch.amp.GradScaler("cpu") if dtype == torch.float16 and cast else None
        learner = Learner(m, torch.optim.AdamW(m.parameters(), lr=1e-3), settings, scaler=scaler)
        hist, _ = ppo_update(learner, UpdateBatch(rollout, adv, lp))
        losses[name] = float(hist[0]["loss/pg"])
        assert float(hist[0]["is/log_w_mean"]) == 0.0  # same precision on both sides: on-policy exactly
        assert float(hist[0]["actor/nonfinite_grad"]) == 0.0
        assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in m.parameters())  # fp32 masters
    assert math.isfinite(losses["low"]) and losses["low"] == pytest.approx(losses["fp32"], rel=0.1, abs=1e-3)


def test_fp16_overflow_skips_the_step_and_lowers_the_scale():
    """A scale that overflows fp16 gradients: the step is skipped (weights unchanged) and the scale backs off."""
    model, _, rollout, adv, old = _setup(autocast_dtype=torch.float16)
    before = [p.detach().clone() for p in model.parameters()]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60)
    settings = UpdateSettings(method="grpo", seqs_per_mini_batch=16, micro_batch_size=8, autocast_dtype=torch.float16)
    learner = Learner(model, torch.optim.AdamW(model.parameters(), lr=1e-2), settings, scaler=scaler)
    hist, _ = ppo_update(learner, UpdateBatch(rollout, adv, old))
    assert float(hist[0]["actor/nonfinite_grad"]) == 1.0
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert scaler.get_scale() < 2.0**60


@pytest.mark.parametrize(
    ("kind", "warmup", "expected"),
    [
        ("linear", 2, [0.0, 0.5, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6]),
        ("cosine", 0, [0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(8)]),
        ("constant_with_warmup", 4, [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_lr_schedule_per_optimizer_step(kind, warmup, expected):
    """The learning rate each optimizer step uses (logged as actor/lr), over 4 rollout steps x N = 2 mini-batches."""
    cfg = TrainConfig(lr_scheduler_type=kind, warmup_steps=warmup, total_training_steps=4,
                      train_batch_size=4, ppo_mini_batch_size=2)  # fmt: skip
    model, _, rollout, adv, old = _setup()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = build_scheduler(opt, cfg.optimizer, total=4 * 2)
    settings = UpdateSettings(method="grpo", num_mini_batches=2, seqs_per_mini_batch=8, micro_batch_size=8)
    seen = []
    for _ in range(4):
        hist, _ = ppo_update(Learner(model, opt, settings, scheduler=sched), UpdateBatch(rollout, adv, old))
        seen += [float(h["actor/lr"]) for h in hist]
    assert seen == pytest.approx([0.1 * e for e in expected], rel=1e-6, abs=1e-9)  # logged as float32


def test_warmup_ratio_and_constant():
    cfg = TrainConfig(lr_scheduler_type="linear", warmup_ratio=0.25, total_training_steps=4,
                      train_batch_size=4, ppo_mini_batch_size=2)  # fmt: skip
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, cfg.optimizer, total=4 * 2)
    lrs = []
    for _ in range(8):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.0, 0.5, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])  # ceil(0.25 * 8) = 2 warmup
    assert build_scheduler(opt, TrainConfig().optimizer, total=100) is None


peft = pytest.importorskip("peft")


def test_lora_trains_only_the_adapters_and_the_reference_is_the_base():
    """use_peft: the optimizer holds only LoRA weights, an update moves them and nothing else, and the reference
    (adapters disabled) equals the untouched base model's log-probs while the policy has moved away."""
    from vespo.models import add_lora
    from vespo.train.setup import build_optimizer

    model, _, rollout, adv, old = _setup()
    base = copy.deepcopy(model)
    cfg = TrainConfig(use_peft=True, lora_r=4, lora_alpha=8, kl_coef=0.1, lr=5e-2)
    policy = add_lora(model, cfg.hardware)
    opt = build_optimizer(policy, cfg.optimizer)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(
        p.numel() for p in policy.parameters() if p.requires_grad
    )
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    reference = build_reference(policy, kl_coef=cfg.algorithm.kl_coef, lora=cfg.hardware.use_peft)
    rows = torch.arange(16)
    lp_args = {"micro_batch_size": 8, "temperature": 1.0}
    settings = UpdateSettings(method="vespo", seqs_per_mini_batch=16, micro_batch_size=8, kl_coef=0.1)
    for _ in range(3):
        ref = reference(rollout, rows, **lp_args)
        ppo_update(Learner(policy, opt, settings), UpdateBatch(rollout, adv, old, ref_log_prob=ref))
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    with torch.no_grad():
        base_lp, _ = policy_log_probs(base, rollout, rows, **lp_args)
        now_lp, _ = policy_log_probs(policy, rollout, rows, **lp_args)
    torch.testing.assert_close(reference(rollout, rows, **lp_args), base_lp, atol=1e-5, rtol=1e-5)
    assert (now_lp - base_lp).abs().max() > 1e-3  # the adapters did move the policy


def test_train_cli_with_lora_bf16_schedule_and_device(tmp_path):
    """The flags end to end through `vespo train` on the tiny model: it runs, logs the schedule, resumes."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, num_hidden_layers=1)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    args = ["train", "--model", str(tmp_path / "m"), "--num-operands", "2", "--eval-size", "8", "--train-batch-size",
            "4", "--ppo-mini-batch-size", "2", "--rollout-n", "2", "--max-response-length", "4", "--device", "cpu",
            "--bf16", "--use-peft", "--lora-r", "2", "--kl-coef", "0.1", "--lr-scheduler-type", "linear",
            "--warmup-steps", "1", "--save-every", "1", "--eval-every", "0", "--no-progress", "--no-tensorboard",
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert main([*args, "--total-training-steps", "2"]) == 0
    assert main([*args, "--total-training-steps", "3", "--resume", "--allow-change", "total_training_steps"]) == 0
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["actor/lr"] == pytest.approx(0.5 * 3e-4)  # mean of optimizer steps 0 (warmup: lr 0) and 1 (peak)
    assert all(math.isfinite(r["loss/pg"]) for r in rows)


def test_cuda_request_without_cuda_is_refused():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="device: cuda"):
        check_host(TrainConfig(device="cuda"))


def test_gradient_checkpointing_gives_the_same_update():
    """Recomputing activations in the backward pass changes memory, not the result: one update with and without
    gradient checkpointing lands on the same weights."""
    model, _, rollout, adv, old = _setup()
    plain, ckpt = copy.deepcopy(model), copy.deepcopy(model)
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert ckpt.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    settings = UpdateSettings(method="vespo", num_mini_batches=2, seqs_per_mini_batch=8, micro_batch_size=4)
    for m in (plain, ckpt):
        m.train()
        ppo_update(Learner(m, torch.optim.AdamW(m.parameters(), lr=1e-2), settings), UpdateBatch(rollout, adv, old))
    for a, b in zip(plain.parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(plain.parameters(), model.parameters(), strict=True))
