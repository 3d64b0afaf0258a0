"""Single-machine GRPO-style off-policy RL trainer; `vespo train`.

One rollout step reads top to bottom in `train`:
  sample prompts -> generate n responses (sampler log-probs recorded) -> rewards -> group advantages
  -> old log-probs under the current weights -> N = train_batch_size / ppo_mini_batch_size sequential optimizer
  steps (later mini-batches are increasingly stale, paper Sec. 4.3) -> logging, evaluation, checkpoint.
The policy loss is any registered method (`vespo.compute_policy_loss`); see docs/training.md.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from vespo.advantages import group_advantages
from vespo.aggregation import agg_loss
from vespo.config import (
    EMBEDDED,
    ConfigError,
    TrainConfig,
    check_reward_columns,
    load_reward_fn,
    parse_args,
    resolve,
)
from vespo.data import load_records
from vespo.evaluation import evaluate_records, format_prompts
from vespo.losses import (
    ROLLOUT_IS_THRESHOLD,
    BatchContext,
    batch_context,
    check_policy_inputs,
    compute_policy_loss,
    default_loss_agg_mode,
    uses_batch_context,
)
from vespo.rollout import Rollout, decode_responses, response_log_probs, sample
from vespo.runs import (
    Logger,
    check_run,
    embedded_policy_path,
    plot_run,
    progress_bar,
    read_metrics,
    restore,
    save_checkpoint,
    seed_everything,
    start_run,
)
from vespo.task import embedded_split

Tensor = torch.Tensor
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ADDITIVE = ("loss/pg", "actor/kl_loss")  # metrics that are micro-batch shares of a mini-batch total
# per-mini-batch metrics also logged for the first and last mini-batch of each step (docs/results.md, mechanism)
_PER_INDEX = (
    "is/log_w_mean",
    "is/log_w_max",
    "is/log_w_min",
    "weight/ess",
    "is/top1pct_w_share",
    "actor/grad_norm",
    "actor/update_norm",
)


# ----------------------------------------------------------------------------------------------------------------
# Setup: policy, data, reward


def load_policy(path: str | Path) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer in fp32 through `from_pretrained` (Hub id or local dir)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, tokenizer


def load_data(cfg: TrainConfig) -> tuple[list[dict], list[dict] | None]:
    """(training records, held-out records or None) through `vespo.data`, checked against the reward function's
    signature; any problem is a ConfigError naming the file (and line) before the model loads."""
    keys = {"prompt_key": cfg.prompt_key, "answer_key": cfg.answer_key, "skip_bad": cfg.skip_bad_records}
    train_set = eval_set = None
    try:
        if cfg.dataset == EMBEDDED or cfg.eval_dataset is None:
            task = {"num_operands": cfg.num_operands, "max_operand": cfg.max_operand, "eval_size": cfg.eval_size}
            split = embedded_split(cfg.task, **task)
            emb_train, emb_eval = ([dataclasses.asdict(p) for p in part] for part in split)
            if cfg.dataset == EMBEDDED:
                train_set, eval_set = emb_train, emb_eval
        if cfg.dataset != EMBEDDED:
            train_set = load_records(cfg.dataset, split=cfg.dataset_split, **keys)
        if cfg.eval_dataset is not None:
            eval_set = load_records(cfg.eval_dataset, split="test", **keys)[: cfg.eval_size]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if len(train_set) < cfg.train_batch_size:
        raise ConfigError(f"dataset has {len(train_set)} prompts, fewer than train_batch_size={cfg.train_batch_size}")
    check_reward_columns(cfg.reward_fn, reward_columns(train_set))
    return train_set, eval_set


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The actor's optimizer: AdamW (`adamw_torch`, betas/eps/decay from cfg) or plain SGD without momentum (`sgd`),
    whose steps shrink with the gradient where Adam's per-parameter normaliser rescales them (docs/results.md)."""
    if cfg.optim == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_epsilon, weight_decay=cfg.weight_decay
    )


def reward_columns(records: list[dict]) -> list[str]:
    """The fields every record has besides the prompt: what the reward function receives as keyword lists."""
    return sorted(set.intersection(*(set(r) for r in records)) - {"prompt"})


def grade(reward_fn, completions: list[str], records: list[dict], n: int) -> Tensor:
    """Rewards (B,) of `n` completions per record, with TRL's call fn(completions, **columns)."""
    columns = {k: [r[k] for r in records for _ in range(n)] for k in reward_columns(records)}
    rewards = reward_fn(completions, **columns)
    if len(rewards) != len(completions):
        raise RuntimeError(f"reward function returned {len(rewards)} rewards for {len(completions)} completions")
    return torch.tensor([float(r) for r in rewards], dtype=torch.float32)  # (B,)


@torch.no_grad()
def evaluate(model, tokenizer, records: list[dict], cfg: TrainConfig) -> dict[str, float]:
    """Held-out accuracy through the shared evaluator (`vespo.evaluation.evaluate_records`): one response per prompt
    at the training temperature and prompt format, seeded apart from training, graded by the records' verifier."""
    scores = evaluate_records(
        model,
        tokenizer,
        records,
        n=1,
        chat=cfg.apply_chat_template,
        chunk=cfg.micro_batch_size,
        seed=cfg.seed + 12345,
        max_new_tokens=cfg.max_response_length,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        use_vllm=False,  # the policy is in memory; spinning up an engine per evaluation costs more than it saves
        progress=False,
    )
    return {"eval/accuracy": scores["eval/heldout/avg@1"]}


# ----------------------------------------------------------------------------------------------------------------
# The update: N sequential mini-batch steps with gradient accumulation over micro-batches


def _micro_batches(rows: Tensor, size: int) -> list[Tensor]:
    return list(rows.split(size))


def policy_log_probs(model, rollout: Rollout, rows: Tensor, cfg: TrainConfig, *, with_entropy: bool):
    """log pi (and entropy) of `rows` computed micro-batch by micro-batch, exactly as the update will see them."""
    outs = [
        response_log_probs(model, rollout.select(mb), temperature=cfg.temperature, with_entropy=with_entropy)
        for mb in _micro_batches(rows, cfg.micro_batch_size)
    ]
    logp = torch.cat([o[0] for o in outs])  # (len(rows), T)
    ent = torch.cat([o[1] for o in outs]) if with_entropy else None
    return logp, ent


def _top_share(log_w: Tensor, frac: float = 0.01) -> Tensor:
    """Share of the mini-batch's total IS weight sum_i W_i held by its top `frac` of sequences (log space)."""
    top = max(1, math.ceil(frac * log_w.numel()))
    return torch.exp(torch.logsumexp(log_w.topk(top).values, 0) - torch.logsumexp(log_w, 0))


def ppo_update(
    model: transformers.PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    advantages: Tensor,
    old_log_prob: Tensor,
    ref_log_prob: Tensor | None,
    cfg: TrainConfig,
) -> list[dict[str, float]]:
    """One optimizer step per mini-batch, in order (rows shuffled first with `cfg.shuffle`); returns their metrics.

    Mini-batch k (0-based) is trained after k updates of the weights old_log_prob was computed with, so its
    importance weights W = pi/mu are exactly 1 for k = 0 and drift from 1 afterwards (the staleness of Sec. 4.3).
    Micro-batch losses are normalised by the whole mini-batch's token/sequence count, so accumulating them equals
    one big batch. The rollout batch is validated once here; the micro-batch calls skip validation (no host sync).
    A mini-batch whose gradient norm is not finite is skipped, as veRL does, and counted in `actor/nonfinite_grad`.
    """
    seqs_per_mini = cfg.ppo_mini_batch_size * cfg.rollout_n
    mode = cfg.loss_agg_mode or default_loss_agg_mode(cfg.method)
    rollout_lp = rollout.rollout_log_prob if cfg.use_rollout_log_prob else None
    check_policy_inputs(
        log_prob=None,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=rollout.response_mask,
        rollout_log_prob=rollout_lp,
    )
    n_rows = advantages.shape[0]
    order = torch.randperm(n_rows) if cfg.shuffle else torch.arange(n_rows)  # global RNG: checkpointed
    history = []
    for k in range(cfg.num_mini_batches):
        rows = order[k * seqs_per_mini : (k + 1) * seqs_per_mini]
        mini_mask = rollout.response_mask[rows]
        n_tokens, n_seqs = mini_mask.sum().float(), (mini_mask.sum(-1) > 0).sum().float()
        optimizer.zero_grad(set_to_none=True)
        sums: dict[str, Tensor | float] = {}
        seq_log_w = []  # per-sequence log W of this mini-batch, for the weight-concentration diagnostic
        micro = _micro_batches(rows, cfg.micro_batch_size)
        ctx = _batch_context(model, rollout, rows, advantages, old_log_prob, rollout_lp, cfg, k, len(micro))
        for mb in micro:
            mask = rollout.response_mask[mb]  # (b, T)
            log_prob, entropy = response_log_probs(
                model, rollout.select(mb), temperature=cfg.temperature, with_entropy=cfg.entropy_coeff > 0
            )
            loss, metrics = compute_policy_loss(
                cfg.method,
                log_prob=log_prob,
                old_log_prob=old_log_prob[mb],
                advantages=advantages[mb],
                response_mask=mask,
                rollout_log_prob=None if rollout_lp is None else rollout_lp[mb],
                loss_agg_mode=mode,
                global_num_tokens=n_tokens,
                global_num_seqs=n_seqs,
                validate=False,  # validated once per rollout batch above; log-probs of the model are <= 0
                **({} if ctx is None else {"batch_context": ctx}),
                **cfg.hparams,
            )
            if ref_log_prob is not None:  # k3 estimator of KL(pi || ref), clamped like veRL's low_var_kl
                delta = ref_log_prob[mb] - log_prob
                kl = (delta.exp() - delta - 1).clamp(-10, 10)  # (b, T)
                kl_loss = agg_loss(kl, mask, mode, global_num_tokens=n_tokens, global_num_seqs=n_seqs)
                loss = loss + cfg.kl_coef * kl_loss
                metrics["actor/kl_loss"] = kl_loss.detach()
            if entropy is not None:
                ent_loss = agg_loss(entropy, mask, mode, global_num_tokens=n_tokens, global_num_seqs=n_seqs)
                loss = loss - cfg.entropy_coeff * ent_loss
            loss.backward()
            seq_log_w.append(((log_prob.detach() - old_log_prob[mb]) * mask).sum(-1))  # (b,)
            for key, value in metrics.items():  # losses normalised by the mini-batch add up; diagnostics average
                sums[key] = sums.get(key, 0.0) + (value if key in _ADDITIVE else value / len(micro))
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)  # before clipping
        sums["actor/grad_norm"] = grad_norm
        sums["is/top1pct_w_share"] = _top_share(torch.cat(seq_log_w))
        finite = bool(torch.isfinite(grad_norm))  # one sync per optimizer step: a NaN step would poison the weights
        sums["actor/nonfinite_grad"] = float(not finite)
        before = [p.detach().clone() for p in model.parameters()] if cfg.log_update_norm else None
        if finite:
            optimizer.step()
        if before is not None:  # how far the optimizer actually moved: Adam can undo a gradient that phi shrank
            sums["actor/update_norm"] = torch.stack(
                [(p.detach() - b).norm() for p, b in zip(model.parameters(), before, strict=True)]
            ).norm()
        history.append({k: float(v) for k, v in sums.items()})  # metrics stay tensors until here: one sync per step
    return history


def _batch_context(
    model,
    rollout: Rollout,
    rows: Tensor,
    advantages: Tensor,
    old_log_prob: Tensor,
    rollout_lp: Tensor | None,
    cfg: TrainConfig,
    k: int,
    n_micro: int,
) -> BatchContext | None:
    """Mini-batch statistics for the batch-adaptive methods (None for the others): the staleness index k, and with
    more than one micro-batch the whole mini-batch's log W from one extra no-grad forward, so that every
    micro-batch's controller decides exactly as one pass over the mini-batch would."""
    if not uses_batch_context(cfg.method):
        return None
    if n_micro == 1:  # the call sees the whole mini-batch itself
        return BatchContext(mini_batch_index=k, num_mini_batches=cfg.num_mini_batches)
    with torch.no_grad():
        log_prob, _ = policy_log_probs(model, rollout, rows, cfg, with_entropy=False)
    return batch_context(
        log_prob=log_prob,
        old_log_prob=old_log_prob[rows],
        advantages=advantages[rows],
        response_mask=rollout.response_mask[rows],
        rollout_log_prob=None if rollout_lp is None else rollout_lp[rows],
        rollout_is_threshold=cfg.hparams.get("rollout_is_threshold", ROLLOUT_IS_THRESHOLD),
        mini_batch_index=k,
        num_mini_batches=cfg.num_mini_batches,
    )


# ----------------------------------------------------------------------------------------------------------------
# The loop


def train(cfg: TrainConfig) -> dict[str, float]:
    """Run RL training per `cfg`; returns the last step's metrics. Everything is validated before any compute."""
    cfg = resolve(cfg)
    if cfg.mode == "async":
        from vespo.async_trainer import train_async

        return train_async(cfg)
    ckpt = check_run(cfg)  # run dir usable; on resume, a safe checkpoint and the saved config (None: fresh run)
    reward_fn = load_reward_fn(cfg.reward_fn)
    train_set, eval_set = load_data(cfg)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    run_dir = start_run(cfg)  # config.yaml is written only now, once the checkpoint and the inputs have loaded

    # policy (+ optional reference and low-precision sampler copies), optimizer
    policy_path = embedded_policy_path(cfg) if cfg.model == EMBEDDED else cfg.model
    model, tokenizer = load_policy(policy_path)
    model.train()
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    sampler = model
    if cfg.sampler_dtype != "float32":
        sampler = copy.deepcopy(model).to(_DTYPES[cfg.sampler_dtype]).eval().requires_grad_(False)
    optimizer = build_optimizer(model, cfg)

    gen = seed_everything(cfg.seed)  # global streams + the sampling-noise generator, all checkpointed
    start = restore(ckpt, model, optimizer, gen) if ckpt is not None else 0
    logger = Logger(cfg, run_dir, start)
    do_eval = bool(eval_set) and cfg.eval_every > 0
    if do_eval and start == 0:
        logger.log(evaluate(model, tokenizer, eval_set, cfg), 0)

    bar = progress_bar(cfg, start)
    metrics = {k: v for k, v in read_metrics(run_dir)[-1].items() if k != "step"} if start else {}
    for step in range(start + 1, cfg.total_training_steps + 1):
        t0 = time.perf_counter()
        # 1. a rollout batch of prompts (order drawn from the global RNG, which is checkpointed)
        idx = torch.randperm(len(train_set))[: cfg.train_batch_size].tolist()
        batch = [train_set[i] for i in idx]
        prompts = format_prompts(tokenizer, [r["prompt"] for r in batch], chat=cfg.apply_chat_template)
        # 2. generate n responses per prompt with the sampler, recording its log-probs
        model.eval()
        if sampler is not model:
            sampler.load_state_dict(model.state_dict())  # weight sync to the "inference engine" (casts dtype)
        rollout = sample(
            sampler,
            tokenizer,
            prompts,
            n=cfg.rollout_n,
            max_new_tokens=cfg.max_response_length,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            generator=gen,
            logit_noise_std=cfg.rollout_logit_noise,
        )
        t_gen = time.perf_counter()
        # 3. rewards and group advantages
        completions = decode_responses(tokenizer, rollout)
        rewards = grade(reward_fn, completions, batch, cfg.rollout_n)  # (B,)
        advantages = group_advantages(rewards, cfg.rollout_n, norm_by_std=cfg.norm_adv_by_std)  # (B,)
        # 4. old log-probs mu under the current weights (and the reference policy's, for the KL penalty)
        rows = torch.arange(rewards.numel())
        with torch.no_grad():
            old_log_prob, _ = policy_log_probs(model, rollout, rows, cfg, with_entropy=False)  # (B, T)
            ref_log_prob = None
            if ref_model is not None:
                ref_log_prob, _ = policy_log_probs(ref_model, rollout, rows, cfg, with_entropy=False)
        # 5. N sequential optimizer steps over the mini-batches
        model.train()
        history = ppo_update(model, optimizer, rollout, advantages, old_log_prob, ref_log_prob, cfg)
        model.eval()
        # 6. log
        metrics = _step_metrics(rewards, rollout, old_log_prob, history)
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics["time/gen_s"] = t_gen - t0
        if do_eval and (step % cfg.eval_every == 0 or step == cfg.total_training_steps):
            metrics |= evaluate(model, tokenizer, eval_set, cfg)
        logger.log(metrics, step)
        warn_skipped_updates(step, metrics)
        if step % cfg.save_every == 0 or step == cfg.total_training_steps:
            save_checkpoint(run_dir, step, model, optimizer, gen)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", len=f"{metrics['response/length_mean']:.1f}")
    if bar is not None:
        bar.close()
    logger.close()
    plot_run(run_dir)
    model.save_pretrained(run_dir / "final")
    tokenizer.save_pretrained(run_dir / "final")
    return metrics


def warn_skipped_updates(step: int, metrics: dict[str, float]) -> None:
    """One stderr line when a step skipped updates with a non-finite gradient (veRL skips them too, silently)."""
    if metrics["actor/nonfinite_grad"] > 0:
        skipped = round(metrics["actor/nonfinite_grad"] * metrics["actor/num_mini_batches"])
        print(f"vespo train: step {step}: skipped {skipped} update(s) with a non-finite gradient", file=sys.stderr)


def _step_metrics(rewards: Tensor, rollout: Rollout, old_log_prob: Tensor, history: list[dict]) -> dict[str, float]:
    """Per-step scalars: reward, length, train-inference gap, and the mini-batch metrics (mean, first, last)."""
    mask = rollout.response_mask.bool()
    lengths = rollout.response_mask.sum(-1).float()
    gap = (old_log_prob - rollout.rollout_log_prob)[mask]  # log pi_train - log pi_rollout on sampled tokens
    out = {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
        "response/length_mean": lengths.mean().item(),
        "response/clip_frac": (lengths == rollout.response_mask.shape[1]).float().mean().item(),
        "mismatch/log_ratio_abs_mean": gap.abs().mean().item(),
        "mismatch/k3_kl": (gap.exp() - gap - 1).mean().item(),
        "actor/entropy": -rollout.rollout_log_prob[mask].mean().item(),  # MC estimate: mean -log pi of samples
        "actor/num_mini_batches": float(len(history)),
    }
    for key in history[0]:
        out[key] = float(np.mean([h[key] for h in history]))
    for key in _PER_INDEX:  # the first mini-batch is on-policy, the last the stalest: their gap is the staleness
        if key in history[0]:
            out[f"{key}/first_mini_batch"] = history[0][key]
            out[f"{key}/last_mini_batch"] = history[-1][key]
    return out


def cli(argv: list[str]) -> int:
    """`vespo train [--config file.yaml] [flags]`."""
    try:
        cfg = parse_args(argv)
        last = train(cfg)
    except ConfigError as exc:  # bad input, found before any compute
        print(f"vespo train: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vespo train: interrupted; the last checkpoint in {cfg.run_dir} is kept (--resume continues)")
        return 130
    print(json.dumps({k: round(v, 4) for k, v in last.items() if k.startswith(("reward/", "eval/"))}))
    print(f"run dir: {cfg.run_dir}")
    return 0
