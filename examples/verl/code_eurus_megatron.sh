#!/usr/bin/env bash
# Paper Sec. 4.5 / App. H: Qwen3-30B-A3B-Base on PRIME-RL/Eurus-2-RL-Data (code, execution reward), N = 8, same
# (c1, c2) as math. The parquet files come from the official recipe's tools/preprocess_datasets.py; reward_fn.py
# routes rows whose data_source is a code source to vespo.rewards.code_reward.
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL=${MODEL:-Qwen/Qwen3-30B-A3B-Base}
ARGS=(
  "${PAPER_ARGS[@]}" "${MOE_ARGS[@]}" "${VESPO_ARGS[@]}"
  "data.train_files=${DATA_ROOT}/eurus2_code/train.parquet"
  "data.val_files=${DATA_ROOT}/eurus2_code/validation.parquet"
  "actor_rollout_ref.model.path=${MODEL}"
  "trainer.experiment_name=${LOSS_MODE}_qwen3-30b-a3b_code_N${N}"
)
launch ppo_megatron_trainer "${ARGS[@]}" "$@"
