"""The synchronous loop of `vespo train`: generate, then train, one rollout step after another.

One rollout step reads top to bottom in `train_sync`:
  sample prompts -> generate n responses (sampler log-probs recorded) -> rewards -> group advantages
  -> old log-probs under the current weights -> N = train_batch_size / ppo_mini_batch_size sequential optimizer
  steps (later mini-batches are increasingly stale, paper Sec. 4.3) -> logging, evaluation, checkpoint.
The update is the learner's (`vespo.train.learner`); setup and resume are `vespo.train.setup`'s; see docs/training.md.
"""

from __future__ import annotations

import copy
import time

import torch

from vespo.advantages import group_advantages
from vespo.data import format_prompts
from vespo.outputs import OwnedDir
from vespo.rewards.batch import grade_batch
from vespo.rollout import decode_responses, sample
from vespo.train.config import TrainConfig
from vespo.train.learner import policy_log_probs, ppo_update, rollout_metrics, summarize_update, to_floats
from vespo.train.runs import finish_run, progress_bar
from vespo.train.setup import close_step, completion_rows, evaluate, sampling_kwargs, setup_run, update_settings


def train_sync(cfg: TrainConfig, out: OwnedDir) -> dict[str, float]:
    """Run synchronous RL training per a resolved `cfg` in the claimed run dir `out`; returns the last step's
    metrics."""
    run = setup_run(cfg, out, num_threads=cfg.num_threads)
    model, tokenizer, gen = run.model, run.tokenizer, run.gen
    sampler = model  # the "inference engine": the policy itself, or a low-precision copy synced every step
    if cfg.sampler_dtype != "float32":
        sampler = copy.deepcopy(model).to(getattr(torch, cfg.sampler_dtype)).eval().requires_grad_(False)
    settings = update_settings(cfg, num_mini_batches=cfg.num_mini_batches, shuffle=cfg.shuffle)
    lp_args = settings.log_prob_args
    do_eval = bool(run.eval_set) and cfg.eval_every > 0
    if do_eval and run.start == 0:
        run.logger.log(evaluate(model, tokenizer, run.eval_set, cfg), 0)

    bar = progress_bar(cfg, run.start)
    metrics = run.logger.last  # the checkpoint's step, should no step be left to run
    for step in range(run.start + 1, cfg.total_training_steps + 1):
        t0 = time.perf_counter()
        # 1. a rollout batch of prompts (order drawn from the global RNG, which is checkpointed)
        idx = torch.randperm(len(run.train_set))[: cfg.train_batch_size].tolist()
        batch = [run.train_set[i] for i in idx]
        prompts = format_prompts(tokenizer, [r["prompt"] for r in batch], chat=cfg.apply_chat_template)
        # 2. generate n responses per prompt with the sampler, recording its log-probs
        model.eval()
        if sampler is not model:
            sampler.load_state_dict(model.state_dict())  # weight sync to the "inference engine" (casts dtype)
        gen_args = {"generator": gen, "logit_noise_std": cfg.rollout_logit_noise} | sampling_kwargs(cfg)
        rollout = sample(sampler, tokenizer, prompts, n=cfg.rollout_n, **gen_args)
        t_gen = time.perf_counter()
        # 3. rewards and group advantages
        rewards = grade_batch(run.reward_fn, decode_responses(tokenizer, rollout), batch, cfg.rollout_n)  # (B,)
        rewards = rewards.to(rollout.response_mask.device)
        advantages = group_advantages(rewards, cfg.rollout_n, norm_by_std=cfg.norm_adv_by_std)  # (B,)
        if cfg.log_completions:
            rows = completion_rows(tokenizer, rollout, rewards, advantages, cfg.num_completions_to_print)
            run.logger.log_completions(rows, step)
        # 4. old log-probs mu under the current weights (and the reference policy's, for the KL penalty)
        rows = torch.arange(rewards.numel())
        with torch.no_grad():
            old_log_prob, _ = policy_log_probs(model, rollout, rows, **lp_args)  # (B, T)
            ref_log_prob = None if run.reference is None else run.reference(rollout, rows, **lp_args)
        # 5. N sequential optimizer steps over the mini-batches; the sampler's log-probs correct the mismatch
        model.train()
        history = ppo_update(
            model,
            run.optimizer,
            rollout,
            advantages,
            old_log_prob,
            settings,
            ref_log_prob=ref_log_prob,
            rollout_log_prob=rollout.rollout_log_prob if cfg.use_rollout_log_prob else None,
            scheduler=run.scheduler,
            scaler=run.scaler,
        )
        model.eval()
        # 6. log: the step's tensors become floats here, once
        step_metrics = rollout_metrics(rewards, rollout, cfg.max_response_length, train_log_prob=old_log_prob)
        metrics = to_floats(step_metrics | summarize_update(history))
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics["time/gen_s"] = t_gen - t0
        # evaluate, log, watch the ESS, checkpoint
        if close_step(run, cfg, step, metrics, bar=bar, show="response/length_mean"):
            break
    if bar is not None:
        bar.close()
    finish_run(run.run_dir, run.logger, model, tokenizer)
    return metrics
