"""Run setup shared by every loop: data and reward, the learner (policy, reference, optimizer, scheduler, scaler),
RNG streams and resume, turned into one `RunState`; and the held-out evaluation the run does at its evaluation
steps."""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from vespo.data import load_records
from vespo.data.reasoning_gym import is_reasoning_gym
from vespo.embedded.task import embedded_split
from vespo.embedded.warm_start import WarmStartSpec, embedded_policy_path
from vespo.evaluation import evaluate_records
from vespo.models import add_lora, load_policy, model_path, resolve_device
from vespo.outputs import OwnedDir
from vespo.rewards.batch import check_reward_columns, load_reward_fn, reward_columns
from vespo.rollout import Rollout, decode_responses
from vespo.rollout.hf import compile_log_probs
from vespo.rollout.types import SamplingSettings
from vespo.train.alarms import EssAlarm
from vespo.train.config import EMBEDDED, ConfigError, TrainConfig
from vespo.train.fields import DataSettings, EmbeddedSettings, HardwareSettings, OptimizerSettings, RunSettings
from vespo.train.host import default_num_threads
from vespo.train.learner import Learner, UpdateSettings, policy_log_probs
from vespo.train.resume import check_run, restore
from vespo.train.runs import Run, start_run
from vespo.train.system import seed_everything


@dataclasses.dataclass
class RunState:
    """What a loop starts from: the run's bookkeeping (`Run`), the learner, and the data; `start` is the rollout step
    to continue after, `loop` the loop's own checkpoint entries (empty for a fresh run)."""

    run: Run
    learner: Learner
    tokenizer: transformers.PreTrainedTokenizerBase
    policy_path: str | Path
    gen: torch.Generator
    start: int
    loop: dict
    train_set: list[dict]
    reward_fn: Callable[..., list[float]]
    threads: int
    """torch threads per process of this run: `num_threads`, or the count `default_num_threads` chose."""


def setup_run(cfg: TrainConfig, out: OwnedDir, settings: UpdateSettings) -> RunState:
    """Check the claimed run dir `out` and the inputs (all before any compute), then set the thread count (chosen and
    said once on stderr when `num_threads` is None: `default_num_threads`), load the policy and build the learner with
    the loop's update `settings`, seed every RNG stream and restore a checkpoint on resume. config.yaml is written
    once the inputs have loaded, so a bad input leaves no run behind; it records the thread count used. Each step
    gets the sections it reads."""
    ckpt = check_run(cfg)  # run dir usable; on resume, a safe checkpoint and the saved config (None: fresh run)
    try:
        reward_fn = load_reward_fn(cfg.data.reward_fn)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    train_set, eval_set = load_data(cfg.data, cfg.embedded, eval_size=cfg.run.eval_size,
                                    batch_size=cfg.batch.train_batch_size)  # fmt: skip
    threads = cfg.run.num_threads
    if threads is None:  # chosen once, for every process of the run, after every input check
        threads, why = default_num_threads(cfg)
        print(f"vespo train: {why}; --num-threads N to change", file=sys.stderr, flush=True)
    torch.set_num_threads(threads)
    start_run(cfg, out, threads)
    if cfg.data.model == EMBEDDED:
        policy_path = embedded_policy_path(WarmStartSpec.of(cfg), progress=cfg.run.progress)
    else:
        policy_path = model_source(cfg.data.model, cfg.run)
    model, tokenizer = load_model(policy_path)
    model, device = prepare_policy(model, cfg.hardware, disable=cfg.rollout.disable_dropout)
    learner = build_learner(model, cfg, settings, device)
    gen = seed_everything(cfg.run.seed, device)  # global streams + the sampling-noise generator, all checkpointed
    start, loop = restore(ckpt, learner, gen) if ckpt is not None else (0, {})
    held_out = None
    if eval_set:
        chat, chunk = cfg.data.apply_chat_template, cfg.batch.micro_batch_size

        def held_out() -> dict[str, float]:
            return evaluate(model, tokenizer, eval_set, cfg.run, cfg.sampling, chat=chat, chunk=chunk)

    opt = cfg.optimizer
    alarm = EssAlarm(opt.ess_alarm, opt.ess_alarm_patience, opt.stop_on_low_ess)
    run = Run(cfg.run, out, start, held_out, total=cfg.batch.total_training_steps, alarm=alarm,
              label=cfg.algorithm.method)  # fmt: skip
    return RunState(run, learner, tokenizer, policy_path, gen, start, loop, train_set, reward_fn, threads)


def model_source(model: str, run: RunSettings) -> str | Path:
    """Where the Hub id or local path `model` loads from (a GGUF: its converted cache in `run.cache_dir`); one that
    cannot be had is a ConfigError."""
    try:
        return model_path(model, cache_dir=run.cache_dir, progress=run.progress)
    except ValueError as exc:  # a Hub id neither reachable nor cached; a cache entry vespo did not write
        raise ConfigError(str(exc)) from None


def load_model(path: str | Path):
    """(policy, tokenizer) from a model folder; one that does not load is a ConfigError."""
    try:
        return load_policy(path)
    except ValueError as exc:  # a cache entry vespo did not write
        raise ConfigError(str(exc)) from None


def prepare_policy(
    model: torch.nn.Module, hardware: HardwareSettings, *, disable: bool
) -> tuple[torch.nn.Module, torch.device]:
    """(the policy as the run trains it, its device): with LoRA adapters, dropout off (`disable`), gradient
    checkpointing, on its device in train mode, its log-prob passes compiled."""
    if hardware.use_peft:
        model = add_lora(model, hardware)
    if disable:
        disable_dropout(model)
    if hardware.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    device = resolve_device(hardware.device)
    model.to(device).train()
    if hardware.torch_compile and not compile_log_probs(model, hardware.torch_compile_backend):
        print("vespo train: torch_compile: this model takes the full-logits path; it runs uncompiled", file=sys.stderr)
    return model, device


def build_learner(model: torch.nn.Module, cfg: TrainConfig, settings: UpdateSettings, device: torch.device) -> Learner:
    """The learner: `model` with its optimizer, schedule over the run's optimizer steps, loss scale (fp16, on
    `device`) and KL reference, updating with the loop's `settings`."""
    optimizer = build_optimizer(model, cfg.optimizer)
    total = cfg.batch.total_training_steps * cfg.batch.num_mini_batches
    scheduler = build_scheduler(optimizer, cfg.optimizer, total=total)
    scaler = torch.amp.GradScaler(device.type) if cfg.hardware.fp16 else None
    reference = build_reference(model, kl_coef=cfg.algorithm.kl_coef, lora=cfg.hardware.use_peft)
    return Learner(model, optimizer, settings, scheduler=scheduler, scaler=scaler, reference=reference)


def build_reference(model, *, kl_coef: float, lora: bool) -> Callable[..., torch.Tensor] | None:
    """log-probs of the KL reference (the initial policy), or None without a KL penalty (`kl_coef` 0): a frozen copy,
    or with LoRA the same model with its adapters disabled (TRL's way: no second copy of the weights)."""
    if kl_coef == 0:
        return None
    if lora:

        def adapters_off(rollout: Rollout, rows: torch.Tensor, **lp_args) -> torch.Tensor:
            with torch.no_grad(), model.disable_adapter():
                return policy_log_probs(model, rollout, rows, **lp_args)[0]

        return adapters_off
    frozen = copy.deepcopy(model).eval().requires_grad_(False)

    def copy_of_initial(rollout: Rollout, rows: torch.Tensor, **lp_args) -> torch.Tensor:
        with torch.no_grad():
            return policy_log_probs(frozen, rollout, rows, **lp_args)[0]

    return copy_of_initial


def completion_rows(tokenizer, rollout: Rollout, rewards: torch.Tensor, advantages: torch.Tensor, limit: int) -> list:
    """The first `limit` rows of a rollout as logged completions: the prompt as the model read it (every token but
    the left padding, special ones included: BOS, the chat template's markers), the completion text, reward and
    advantage."""
    rows = slice(0, limit)
    ids, mask = rollout.input_ids[rows, : rollout.prompt_len].tolist(), rollout.attention_mask[rows].tolist()
    fed = [[t for t, m in zip(row, keep, strict=False) if m] for row, keep in zip(ids, mask, strict=True)]
    prompts = tokenizer.batch_decode(fed, skip_special_tokens=False)
    texts = decode_responses(tokenizer, rollout.select(rows))
    values = torch.stack([rewards[rows], advantages[rows]]).tolist()
    return [
        {"prompt": p, "completion": c, "reward": r, "advantage": a}
        for p, c, r, a in zip(prompts, texts, *values, strict=True)
    ]


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability to 0 (TRL's `disable_dropout`): the update's train mode and the old log-probs'
    eval mode then compute the same policy, so W == 1 exactly on the first mini-batch."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


def update_settings(cfg: TrainConfig, *, num_mini_batches: int, shuffle: bool) -> UpdateSettings:
    """The learner's settings from a run config; the loop says how many mini-batches one update takes."""
    algo, batch, rollout, opt, hw = cfg.algorithm, cfg.batch, cfg.rollout, cfg.optimizer, cfg.hardware
    return UpdateSettings(
        autocast_dtype=torch.bfloat16 if hw.bf16 else torch.float16 if hw.fp16 else None,
        method=algo.method,
        loss_agg_mode=algo.loss_agg_mode,
        micro_batch_size=batch.micro_batch_size,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        kl_coef=algo.kl_coef,
        entropy_coeff=algo.entropy_coeff,
        grad_clip=opt.grad_clip,
        log_update_norm=opt.log_update_norm,
        step_scale=opt.step_scale,
        target_kl=opt.target_kl,
        adv_estimator=algo.adv_estimator,
        group_size=batch.rollout_n,
        norm_adv_by_std=algo.norm_adv_by_std,
        hparams=dict(algo.hparams),
        num_mini_batches=num_mini_batches,
        seqs_per_mini_batch=batch.ppo_mini_batch_size * batch.rollout_n,
        shuffle=shuffle,
    )


def load_data(
    cfg: DataSettings, embedded: EmbeddedSettings, *, eval_size: int, batch_size: int
) -> tuple[list[dict], list[dict] | None]:
    """(training records, held-out records or None: the first `eval_size`) through `vespo.data` (the `embedded`
    task's split for the embedded dataset), at least `batch_size` (train_batch_size) training records, checked
    against the reward function's signature; any problem is a ConfigError naming the file (and line) before the
    model loads."""
    keys = {"prompt_key": cfg.prompt_key, "answer_key": cfg.answer_key, "skip_bad": cfg.skip_bad_records}
    train_set = eval_set = None
    try:
        if cfg.dataset == EMBEDDED:
            task = {"num_operands": embedded.num_operands, "max_operand": embedded.max_operand, "eval_size": eval_size}
            split = embedded_split(embedded.task, **task)
            train_set, eval_set = ([dataclasses.asdict(p) for p in part] for part in split)
        else:
            train_set = load_records(cfg.dataset, split=cfg.dataset_split, **keys)
        held_out = cfg.eval_dataset or (cfg.dataset if is_reasoning_gym(cfg.dataset) else None)
        if held_out is not None:  # a reasoning-gym run is evaluated on its tasks' held-out split by default
            eval_set = load_records(held_out, split="test", **keys)[:eval_size]
        if len(train_set) < batch_size:
            raise ValueError(f"dataset has {len(train_set)} prompts, fewer than train_batch_size={batch_size}")
        check_reward_columns(cfg.reward_fn, reward_columns(train_set))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return train_set, eval_set


def build_optimizer(model: torch.nn.Module, cfg: OptimizerSettings) -> torch.optim.Optimizer:
    """The actor's optimizer: AdamW (`adamw_torch`, betas/eps/decay from cfg) or plain SGD without momentum (`sgd`),
    whose steps shrink with the gradient where Adam's per-parameter normaliser rescales them (docs/results/index.md)."""
    params = [p for p in model.parameters() if p.requires_grad]  # all weights, or the LoRA adapters
    if cfg.optim == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_epsilon, weight_decay=cfg.weight_decay)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimizerSettings, *, total: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """`transformers.get_scheduler` over the run's `total` optimizer steps (total_training_steps x N), stepped once
    per optimizer step; None for a constant learning rate."""
    if cfg.lr_scheduler_type == "constant":
        return None
    warmup = cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total)
    return transformers.get_scheduler(
        cfg.lr_scheduler_type, optimizer, num_warmup_steps=warmup, num_training_steps=total
    )


@torch.no_grad()
def evaluate(
    model, tokenizer, records: list[dict], cfg: RunSettings, sampling: SamplingSettings, *, chat: bool, chunk: int
) -> dict[str, float]:
    """Held-out accuracy (avg@eval_n) through the shared evaluator (`vespo.evaluation.evaluate_records`): `eval_n`
    responses per prompt at the training `sampling`'s temperature, top-k and length, in the training prompt format
    (`chat`) and at `eval_top_p` (the training top_p when None), `chunk` (micro_batch_size) sequences per pass,
    seeded apart from training, graded by the records' verifier; with `progress`, a bar with the time left (a real
    model's evaluation can take minutes)."""
    scores = evaluate_records(
        model,
        tokenizer,
        records,
        n=cfg.eval_n,
        chat=chat,
        chunk=chunk,
        seed=cfg.seed + 12345,
        progress=cfg.progress,
        **{k: getattr(sampling, k) for k in ("max_new_tokens", "temperature", "top_k")},
        top_p=sampling.top_p if cfg.eval_top_p is None else cfg.eval_top_p,
    )
    return {"eval/accuracy": scores[f"eval/heldout/avg@{cfg.eval_n}"]}
