#!/usr/bin/env bash
# Paper Sec. 4.6: train-inference mismatch on Qwen3-30B-A3B-Base (vLLM rollouts vs Megatron training), N = 8.
#   VARIANT=vespo        VESPO without fixes (decoupled mode, no rollout IS)
#   VARIANT=vespo_r2     VESPO + Routing Replay (R2)
#   VARIANT=vespo_tis    VESPO with veRL's token TIS weights folded into W (W = pi / pi_rollout, truncated at 2)
#   VARIANT=grpo         vanilla GRPO;  grpo_tis: + token TIS;  grpo_r2: + R2
set -euo pipefail
VARIANT=${VARIANT:-vespo}
case "${VARIANT}" in
  vespo|vespo_r2|vespo_tis) LOSS_MODE=vespo ;;
  grpo|grpo_r2|grpo_tis) LOSS_MODE=vespo_grpo ;;
  *) echo "unknown VARIANT=${VARIANT}" >&2; exit 2 ;;
esac
case "${VARIANT}" in *_r2) ROUTING_REPLAY=R2 ;; esac
source "$(dirname "$0")/common.sh"
MODEL=${MODEL:-Qwen/Qwen3-30B-A3B-Base}
ARGS=(
  "${PAPER_ARGS[@]}" "${MATH_DATA_ARGS[@]}" "${MOE_ARGS[@]}" "${VESPO_ARGS[@]}"
  "actor_rollout_ref.model.path=${MODEL}"
  algorithm.rollout_correction.bypass_mode=False
  "trainer.experiment_name=mismatch_${VARIANT}_qwen3-30b-a3b_math_N${N}"
)
case "${VARIANT}" in
  *_tis) ARGS+=(algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=2.0) ;;
esac
launch ppo_megatron_trainer "${ARGS[@]}" "$@"
