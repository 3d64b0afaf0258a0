"""The synchronous loop of `vespo train`: generate, then train, one rollout step after another.

One rollout step reads top to bottom in `train_sync`:
  sample prompts -> generate n responses (sampler log-probs recorded) -> rewards -> group advantages
  -> old log-probs under the current weights (the sampler's in bypass mode) -> N = train_batch_size /
  ppo_mini_batch_size sequential optimizer steps (later mini-batches are increasingly stale, paper Sec. 4.3)
  -> logging, evaluation, checkpoint.
The update is the learner's (`vespo.train.learner`); setup and resume are `vespo.train.setup`'s; see
docs/guides/trainer.md.
"""

from __future__ import annotations

import torch

from vespo.outputs import OwnedDir
from vespo.rollout import build_engine
from vespo.train.config import TrainConfig
from vespo.train.produce import make_batch
from vespo.train.setup import completion_rows, setup_run, update_settings
from vespo.train.step_metrics import rollout_metrics, to_floats
from vespo.train.system import clock, release_free_memory


def train_sync(cfg: TrainConfig, out: OwnedDir) -> dict[str, float]:
    """Run synchronous RL training per `cfg` in the claimed run dir `out`; returns the last step's metrics."""
    batch = cfg.batch
    settings = update_settings(cfg, num_mini_batches=batch.num_mini_batches, shuffle=batch.shuffle)
    state = setup_run(cfg, out, settings)
    run, learner, tokenizer, gen = state.run, state.learner, state.tokenizer, state.gen
    model = learner.model
    device = next(model.parameters()).device
    # the inference engine: the policy itself, a low-precision copy, or vLLM; its weights synced every step
    engine = build_engine(cfg.async_.sampler_engine, cfg.sampling, policy_path=state.policy_path, seed=cfg.run.seed,
                          model=model, tokenizer=tokenizer)  # fmt: skip
    rollout_cfg, run_cfg = cfg.rollout, cfg.run
    produce = {"group": batch.rollout_n, "chat": cfg.data.apply_chat_template,
               "norm_by_std": cfg.algorithm.norm_adv_by_std, "clock": lambda: clock(device)}  # fmt: skip
    probe_every, bypass = cfg.optimizer.probe_every, rollout_cfg.bypass_mode
    correct = rollout_cfg.use_rollout_log_prob and not bypass  # the sampler's log-probs correct the mismatch
    run.begin()
    metrics = run.logger.last  # the checkpoint's step, should no step be left to run
    for step in range(state.start + 1, batch.total_training_steps + 1):
        t0 = clock(device)
        # 1. a rollout batch of prompts (order drawn from the global RNG, which is checkpointed)
        idx = torch.randperm(len(state.train_set))[: batch.train_batch_size].tolist()
        # 2. the engine's weight sync (a no-op when it is the policy itself), then n responses per prompt with its
        # log-probs recorded, 3. rewards and group advantages
        engine.load(list(model.named_parameters()))
        scored = make_batch(engine, [state.train_set[i] for i in idx], state.reward_fn, gen, **produce)
        rollout, rewards, advantages = scored.rollout, scored.rewards, scored.advantages
        if run_cfg.log_completions:
            rows = completion_rows(tokenizer, rollout, rewards, advantages, run_cfg.num_completions_to_print)
            run.logger.log_completions(rows, step)
        # 4. the reference policy's log-probs, for the KL penalty (None without one)
        t_score = clock(device)
        ref_log_prob = learner.reference_log_probs(rollout)  # (B, T)
        t_ref = clock(device)
        # 5. N sequential optimizer steps over the mini-batches; the old log-probs mu are scored inside, under the
        # current weights (mini-batch 0's from its own forward), and the sampler's log-probs correct the mismatch;
        # in bypass mode the sampler's log-probs are mu themselves
        sampler_log_prob = rollout.rollout_log_prob
        update = learner.update(rollout, advantages, old_log_prob=sampler_log_prob if bypass else None,
                                ref_log_prob=ref_log_prob, rollout_log_prob=sampler_log_prob if correct else None,
                                rewards=rewards, probe=probe_every > 0 and step % probe_every == 0)  # fmt: skip
        release_free_memory()
        t_update = clock(device)
        # 6. log: the step's tensors become floats here, once; evaluate, watch the ESS, checkpoint
        step_metrics = rollout_metrics(rewards, rollout, rollout_cfg.max_response_length)
        metrics = to_floats(step_metrics | update) | scored.grading
        # the step's phases (veRL's timing_s/{gen,reward,ref,update_actor}); the rest of time/step_s is bookkeeping:
        # prompts, advantages, logged completions, metrics (evaluation and checkpoints come after it)
        metrics |= {"time/step_s": clock(device) - t0, "time/gen_s": scored.gen_s, "time/reward_s": scored.reward_s,
                    "time/ref_log_prob_s": t_ref - t_score, "time/update_s": t_update - t_ref}  # fmt: skip
        if run.end_step(step, metrics, learner, gen, show="response/length_mean"):
            break
    run.finish(model, tokenizer)
    return metrics
