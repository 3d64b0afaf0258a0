# Shared settings of the paper's veRL runs (sourced by the launch scripts in this directory).
# Paper Sec. 4.1 / App. F: GRPO advantages, n = 8 responses, mini-batch 256 prompts, lr 1e-6, max length 16k,
# no KL, vLLM rollouts with their log-probs (needed for rollout correction), token-mean aggregation.
# Usage from a script: build ARGS, then `launch ppo_trainer|ppo_megatron_trainer "${ARGS[@]}"` (VERL_MAIN names
# another veRL entry module, e.g. the fully-async trainer's).
# VESPO_DRY_RUN=1 prints the overrides (one per line) instead of launching; tests use it to check every key.

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

LOSS_MODE=${LOSS_MODE:-vespo}          # vespo, or a baseline: vespo_grpo, vespo_gspo, vespo_sapo, vespo_cispo, ...
DATA_ROOT=${DATA_ROOT:-$HOME/data}     # parquet files made with veRL's / the official recipe's preprocessing
MINI_BATCH=256                         # prompts per gradient step
N=${N:-8}                              # staleness ratio N = train batch / mini-batch
TRAIN_BATCH=$((N * MINI_BATCH))        # N = 8, 16, 32, 64 -> 2048, 4096, 8192, 16384 prompts

# vespo's plugin: the config class that carries hyperparameters, the loss name, and the two mirrors of the
# rollout-correction settings (IS level for folding rollout_is_weights into W; bypass mode is refused).
VESPO_ARGS=(
  actor_rollout_ref.actor.policy_loss._target_=vespo.integrations.verl.VespoPolicyLossConfig
  "actor_rollout_ref.actor.policy_loss.loss_mode=${LOSS_MODE}"
  '+actor_rollout_ref.actor.policy_loss.rollout_is=${algorithm.rollout_correction.rollout_is}'
  '+actor_rollout_ref.actor.policy_loss.bypass_mode=${algorithm.rollout_correction.bypass_mode}'
)
if [ "${LOSS_MODE}" = vespo ]; then  # the paper's (c1, c2): (2, 3) for A > 0, (3, 2) for A < 0 (vespo's defaults)
  VESPO_ARGS+=(
    +actor_rollout_ref.actor.policy_loss.hparams.c1_pos=${C1_POS:-2.0}
    +actor_rollout_ref.actor.policy_loss.hparams.c2_pos=${C2_POS:-3.0}
    +actor_rollout_ref.actor.policy_loss.hparams.c1_neg=${C1_NEG:-3.0}
    +actor_rollout_ref.actor.policy_loss.hparams.c2_neg=${C2_NEG:-2.0}
  )
fi

PAPER_ARGS=(
  algorithm.adv_estimator=grpo
  algorithm.use_kl_in_reward=False
  data.train_batch_size=${TRAIN_BATCH}
  data.max_prompt_length=1024
  data.max_response_length=15360
  data.filter_overlong_prompts=True
  data.truncation=error
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=${MINI_BATCH}
  actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.use_kl_loss=False
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.loss_agg_mode=token-mean
  actor_rollout_ref.actor.use_dynamic_bsz=True
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=8
  actor_rollout_ref.rollout.calculate_log_probs=True
  actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16384
  actor_rollout_ref.rollout.val_kwargs.n=4
  actor_rollout_ref.rollout.val_kwargs.do_sample=True
  actor_rollout_ref.rollout.val_kwargs.temperature=1.0
  actor_rollout_ref.rollout.val_kwargs.top_p=0.7
  actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=16384
  "reward.custom_reward_function.path=${HERE}/reward_fn.py"
  reward.custom_reward_function.name=compute_score
  trainer.total_epochs=1
  trainer.val_before_train=False
  trainer.test_freq=4
  trainer.save_freq=50
  trainer.nnodes=${NNODES:-4}
  trainer.n_gpus_per_node=${NGPUS_PER_NODE:-8}
  trainer.project_name=vespo
  "trainer.logger=[console,wandb]"
)

MATH_DATA_ARGS=(
  "data.train_files=${DATA_ROOT}/dapo_math/train.parquet"
  "data.val_files=[${DATA_ROOT}/aime_2024/test.parquet,${DATA_ROOT}/aime25/test.parquet,${DATA_ROOT}/amc23/test.parquet]"
)

# Megatron settings of the paper's MoE runs (official recipe/vespo/run/sync/*.sh): TP 2, EP 8, vLLM TP 2, offload.
MOE_ARGS=(
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
  actor_rollout_ref.actor.megatron.expert_model_parallel_size=8
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1
  actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1
  actor_rollout_ref.actor.megatron.param_offload=True
  actor_rollout_ref.actor.megatron.optimizer_offload=True
  actor_rollout_ref.actor.megatron.use_mbridge=True
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2
  actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2
  actor_rollout_ref.ref.megatron.expert_model_parallel_size=8
  actor_rollout_ref.ref.megatron.param_offload=True
  actor_rollout_ref.rollout.tensor_model_parallel_size=2
  actor_rollout_ref.rollout.gpu_memory_utilization=0.75
  actor_rollout_ref.actor.megatron.router_replay.mode=${ROUTING_REPLAY:-disabled}
)

launch() {
  local config_name=$1; shift
  if [ -n "${VESPO_DRY_RUN:-}" ]; then
    printf '%s\n' "--config-name=${config_name}" "$@"
    return 0
  fi
  python3 -m "${VERL_MAIN:-verl.trainer.main_ppo}" --config-name="${config_name}" "$@"
}
