#!/usr/bin/env bash
# The official VESPO headline setting on veRL's V1 trainer (veRL >= 0.9.1's default trainer, `trainer.use_v1`):
# Qwen3-30B-A3B-Base on DAPO-Math, trainer.v1.trainer_mode=separate_async, the trainer and the rollout on separate
# GPUs, through vespo's plugin. veRL's maintainers point fully-async users here (fully_async_megatron.sh runs the
# older verl.experimental.fully_async_policy trainer, which veRL is deprecating).
#   bash v1_separate_async_megatron.sh                # weights synced every 4 mini-batches, one version of lag
#   SYNC_STEPS=2 MAX_OFF_POLICY=1 bash v1_separate_async_megatron.sh
#   NNODES=2 ROLLOUT_NNODES=6 bash v1_separate_async_megatron.sh   # the official split: 2 training + 6 rollout nodes
# One global step trains SYNC_STEPS mini-batches of 256 prompts x 8 responses (V1 requires data.train_batch_size =
# parameter_sync_step x ppo_mini_batch_size), then syncs the weights to the rollout GPUs. Partial rollouts are V1's
# separate_async client itself (FullyAsyncLLMServerClient): a generation cut by a weight sync keeps its tokens and
# resumes under the new weights, so one trajectory's tokens may come from two versions.
# Staleness: veRL V1 has no fractional staleness_threshold; it bounds, per prompt group, the number of weight
# versions from dispatch to training (trainer.v1.sampler.max_off_policy_threshold, default 8). 2 lets a sample be
# trained one version after the one that generated it, as the official staleness_threshold 1.0 does; "wait" blocks
# for such groups instead of dropping them (the official rollouter never drops a sample either).
# Decoupled mode (bypass_mode=False): separate_async snapshots pi_old at the first mini-batch of each sync cycle and
# recomputes every later mini-batch's old log-probs under it; veRL hands vespo w = pi_old / mu per sequence,
# untruncated (1e9 > exp(20), veRL's clamp of log w), so W = pi / mu (docs/guides/verl.md, "Fully-async training and
# partial rollouts"). Composed against veRL 0.9.1's config (tests/integrations/test_verl_v1.py), never launched here (no GPU).
set -euo pipefail
NNODES=${NNODES:-2}                                  # training nodes (common.sh: trainer.nnodes)
source "$(dirname "$0")/common.sh"
MODEL=${MODEL:-Qwen/Qwen3-30B-A3B-Base}
SYNC_STEPS=${SYNC_STEPS:-4}
ARGS=(
  model_engine=megatron                              # ppo_trainer + Megatron (veRL calls ppo_megatron_trainer legacy)
  "${PAPER_ARGS[@]}" "${MATH_DATA_ARGS[@]}" "${MOE_ARGS[@]}" "${VESPO_ARGS[@]}"
  "actor_rollout_ref.model.path=${MODEL}"
  trainer.use_v1=True
  trainer.v1.trainer_mode=separate_async
  "trainer.v1.separate_async.parameter_sync_step=${SYNC_STEPS}"
  "data.train_batch_size=$((SYNC_STEPS * MINI_BATCH))"   # V1's invariant; replaces common.sh's N x 256
  "trainer.v1.sampler.max_off_policy_threshold=${MAX_OFF_POLICY:-2}"
  trainer.v1.sampler.max_off_policy_strategy=wait
  actor_rollout_ref.hybrid_engine=False              # the training GPUs only train (no colocated rollout replicas)
  "actor_rollout_ref.rollout.nnodes=${ROLLOUT_NNODES:-6}"
  "actor_rollout_ref.rollout.n_gpus_per_node=${NGPUS_PER_NODE:-8}"
  actor_rollout_ref.rollout.checkpoint_engine.backend=nccl   # separate_async refuses the naive (colocated) backend
  algorithm.rollout_correction.bypass_mode=False
  algorithm.rollout_correction.rollout_is=sequence
  algorithm.rollout_correction.rollout_is_threshold=1e9
  "trainer.experiment_name=${LOSS_MODE}_qwen3-30b-a3b_math_v1_separate_async_sync${SYNC_STEPS}"
)
launch ppo_trainer "${ARGS[@]}" "$@"
