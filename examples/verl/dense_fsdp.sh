#!/usr/bin/env bash
# Paper Table 1: the dense models with FSDP on DAPO-Math at N = 8.
#   MODEL=Qwen/Qwen3-8B-Base bash dense_fsdp.sh
#   MODEL=meta-llama/Llama-3.2-3B-Instruct bash dense_fsdp.sh
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL=${MODEL:-Qwen/Qwen3-8B-Base}
ARGS=(
  "${PAPER_ARGS[@]}" "${MATH_DATA_ARGS[@]}" "${VESPO_ARGS[@]}"
  "actor_rollout_ref.model.path=${MODEL}"
  actor_rollout_ref.actor.strategy=fsdp2
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
  actor_rollout_ref.actor.fsdp_config.param_offload=False
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2
  actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP:-2}
  actor_rollout_ref.rollout.gpu_memory_utilization=0.7
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.model.use_remove_padding=True
  "trainer.experiment_name=${LOSS_MODE}_$(basename "${MODEL}")_math_N${N}"
)
launch ppo_trainer "${ARGS[@]}" "$@"
