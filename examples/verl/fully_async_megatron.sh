#!/usr/bin/env bash
# The official VESPO headline setting: Qwen3-30B-A3B-Base on DAPO-Math with veRL's fully-async trainer
# (verl.experimental.fully_async_policy), the rollouter and the trainer on separate GPUs, through vespo's plugin.
# Deprecated path: veRL's maintainers are retiring fully_async_policy for the V1 trainer's separate_async mode
# (v1_separate_async_megatron.sh, the same setting); this script stays while veRL 0.9.1 still ships and composes it.
#   bash fully_async_megatron.sh                      # staleness_threshold 1.0, weights synced every 4 mini-batches
#   STALENESS=0.5 SYNC_STEPS=2 bash fully_async_megatron.sh
#   NNODES=2 ROLLOUT_NNODES=6 bash fully_async_megatron.sh   # the official split: 2 training + 6 rollout nodes of 8
# Each trainer step takes one mini-batch of 256 prompts x 8 responses; every SYNC_STEPS steps the rollouter gets
# new weights, and one weight version feeds at most (1 + STALENESS) x SYNC_STEPS mini-batches. Partial rollouts
# resume a generation interrupted by a weight sync, so one trajectory's tokens may come from two versions.
# How that meets VESPO's sequence weight, and why bypass mode is off: docs/guides/verl.md, "Fully-async training".
set -euo pipefail
NNODES=${NNODES:-2}                                  # training nodes (common.sh: trainer.nnodes)
source "$(dirname "$0")/common.sh"
VERL_MAIN=verl.experimental.fully_async_policy.fully_async_main
MODEL=${MODEL:-Qwen/Qwen3-30B-A3B-Base}
STALENESS=${STALENESS:-1.0}
SYNC_STEPS=${SYNC_STEPS:-4}
ARGS=(
  # veRL's megatron fully-async YAML finds its parent config by a path relative to a veRL source checkout; this
  # finds it in the installed package instead, wherever the command runs
  "hydra.searchpath=[pkg://verl.trainer.config]"
  "${PAPER_ARGS[@]}" "${MATH_DATA_ARGS[@]}" "${MOE_ARGS[@]}" "${VESPO_ARGS[@]}"
  "actor_rollout_ref.model.path=${MODEL}"
  data.train_batch_size=0                            # the rollouter draws one prompt at a time (data.gen_batch_size=1)
  actor_rollout_ref.hybrid_engine=False              # rollout and training on separate GPUs
  "rollout.nnodes=${ROLLOUT_NNODES:-6}"
  "rollout.n_gpus_per_node=${NGPUS_PER_NODE:-8}"
  "rollout.total_rollout_steps=${TOTAL_ROLLOUT_PROMPTS:-null}"   # prompts to generate; null: trainer.total_epochs
  "async_training.staleness_threshold=${STALENESS}"
  "async_training.trigger_parameter_sync_step=${SYNC_STEPS}"
  async_training.require_batches=1
  async_training.partial_rollout=True
  actor_rollout_ref.actor.use_rollout_log_probs=True  # the YAML's default, read by no veRL 0.9.1 code: see below
  # decoupled mode (the fully-async YAML turns bypass mode on, which would replace vespo's loss by veRL's): veRL
  # recomputes pi_old and hands vespo w = pi_old / mu per sequence, mu being every token's rollout log-prob from the
  # weight version that sampled it; 1e9 > exp(20), veRL's clamp of log w, so w is not truncated and W = pi / mu
  algorithm.rollout_correction.bypass_mode=False
  algorithm.rollout_correction.rollout_is=sequence
  algorithm.rollout_correction.rollout_is_threshold=1e9
  "trainer.experiment_name=${LOSS_MODE}_qwen3-30b-a3b_math_fully_async_S${STALENESS}_sync${SYNC_STEPS}"
)
launch fully_async_ppo_megatron_trainer "${ARGS[@]}" "$@"
