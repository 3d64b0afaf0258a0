#!/usr/bin/env bash
# Paper Sec. 4.2-4.3: Qwen3-30B-A3B-Base on DAPO-Math with Megatron, staleness N = 8 (main) or 16/32/64 (ablation).
#   N=16 bash qwen3_30b_a3b_megatron.sh          # train batch 4096 prompts, 16 mini-batches of 256 per rollout
#   LOSS_MODE=vespo_gspo bash qwen3_30b_a3b_megatron.sh   # a baseline (see docs/guides/verl.md for the names)
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL=${MODEL:-Qwen/Qwen3-30B-A3B-Base}
ARGS=(
  "${PAPER_ARGS[@]}" "${MATH_DATA_ARGS[@]}" "${MOE_ARGS[@]}" "${VESPO_ARGS[@]}"
  "actor_rollout_ref.model.path=${MODEL}"
  "trainer.experiment_name=${LOSS_MODE}_qwen3-30b-a3b_math_N${N}"
)
launch ppo_megatron_trainer "${ARGS[@]}" "$@"
