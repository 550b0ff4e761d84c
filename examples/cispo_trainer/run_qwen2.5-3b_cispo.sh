#!/usr/bin/env bash
# CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585), on GSM8K. Instead of clipping the
# update of a token (PPO/GRPO drop the gradient of tokens whose ratio left the clip range), CISPO clips the
# importance-sampling weight and keeps every token's gradient: L = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi.
#
# What makes it CISPO (the keys below):
#   actor_rollout_ref.actor.policy_loss.loss_mode=cispo  the clipped-IS-weight REINFORCE loss
#   actor_rollout_ref.actor.clip_ratio_low=1.0           weight >= 0: no lower bound in effect (the paper sets eps_low
#                                                        large and tunes only eps_high)
#   actor_rollout_ref.actor.clip_ratio_high=0.28         eps_high: the upper bound of the IS weight, the knob to tune
#   actor_rollout_ref.actor.loss_agg_mode=token-mean     normalised by the number of tokens of the batch
#   algorithm.adv_estimator=grpo                         group-normalised advantages, rollout.n > 1
#   actor_rollout_ref.actor.use_kl_loss=False            no KL term, and algorithm.use_kl_in_reward=False
#   actor_rollout_ref.actor.ppo_mini_batch_size < data.train_batch_size: several (off-policy) updates per batch,
#   where the IS weight matters
#
# Hardware for the defaults: one node with 8 x 80 GB GPUs (A100/H100), Qwen2.5-3B-Instruct, vLLM rollout with TP 2.
# Data:  python3 examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k
# Run:   bash examples/cispo_trainer/run_qwen2.5-3b_cispo.sh [key=value ...]
# Every size, path and engine below is an environment variable (NAME=${NAME:-default}); key=value arguments are
# appended to the command line, and Hydra lets a later value of a key win over the script's.
#
# On CPU, with the built-in arithmetic task and its tiny model (built on first use under ~/.cache/verl):
#   eval "$(python3 -c 'from verl.utils.demo import ensure_demo_assets as e; a = e()
#   print(f"export MODEL_PATH={a.model_path} TRAIN_FILES={a.train_files} VAL_FILES={a.val_files}")')"
#   ROLLOUT_NAME=hf ROLLOUT_TP=1 N_GPUS=1 TRAIN_BATCH_SIZE=16 PPO_MINI_BATCH_SIZE=8 PPO_MICRO_BATCH_SIZE_PER_GPU=16 \
#   LOG_PROB_MICRO_BATCH_SIZE_PER_GPU=16 ROLLOUT_N=4 MAX_PROMPT_LENGTH=32 MAX_RESPONSE_LENGTH=8 ACTOR_LR=3e-3 \
#   TOTAL_TRAINING_STEPS=40 TEST_FREQ=10 bash examples/cispo_trainer/run_qwen2.5-3b_cispo.sh
set -xeuo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}
TRAIN_FILES=${TRAIN_FILES:-$HOME/data/gsm8k/train.parquet}
VAL_FILES=${VAL_FILES:-$HOME/data/gsm8k/test.parquet}

TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-512}            # prompts per step
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-512}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-1024}
ROLLOUT_N=${ROLLOUT_N:-8}                            # responses per prompt (the group)
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-128}      # prompts per actor update (4 updates per step)
PPO_MICRO_BATCH_SIZE_PER_GPU=${PPO_MICRO_BATCH_SIZE_PER_GPU:-16}
LOG_PROB_MICRO_BATCH_SIZE_PER_GPU=${LOG_PROB_MICRO_BATCH_SIZE_PER_GPU:-32}
ACTOR_LR=${ACTOR_LR:-1e-6}
CLIP_RATIO_LOW=${CLIP_RATIO_LOW:-1.0}
CLIP_RATIO_HIGH=${CLIP_RATIO_HIGH:-0.28}

ROLLOUT_NAME=${ROLLOUT_NAME:-vllm}                   # vllm | sglang | hf (CPU)
ROLLOUT_TP=${ROLLOUT_TP:-1}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.6}

N_GPUS=${N_GPUS:-8}                                  # workers per node (CPU: worker processes)
NNODES=${NNODES:-1}
TOTAL_EPOCHS=${TOTAL_EPOCHS:-15}
TOTAL_TRAINING_STEPS=${TOTAL_TRAINING_STEPS:-null}   # null: TOTAL_EPOCHS over the data
SAVE_FREQ=${SAVE_FREQ:-20}
TEST_FREQ=${TEST_FREQ:-5}
VAL_BEFORE_TRAIN=${VAL_BEFORE_TRAIN:-True}
LOGGER=${LOGGER:-'["console","file"]'}               # add "wandb" when the machine can reach it
PROJECT_NAME=${PROJECT_NAME:-verl_cispo_example_gsm8k}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen2.5_3b_cispo}

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="$TRAIN_FILES" \
    data.val_files="$VAL_FILES" \
    data.train_batch_size="$TRAIN_BATCH_SIZE" \
    data.max_prompt_length="$MAX_PROMPT_LENGTH" \
    data.max_response_length="$MAX_RESPONSE_LENGTH" \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr="$ACTOR_LR" \
    actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE" \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$PPO_MICRO_BATCH_SIZE_PER_GPU" \
    actor_rollout_ref.actor.policy_loss.loss_mode=cispo \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.clip_ratio_low="$CLIP_RATIO_LOW" \
    actor_rollout_ref.actor.clip_ratio_high="$CLIP_RATIO_HIGH" \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.name="$ROLLOUT_NAME" \
    actor_rollout_ref.rollout.n="$ROLLOUT_N" \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP" \
    actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEMORY_UTILIZATION" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$LOG_PROB_MICRO_BATCH_SIZE_PER_GPU" \
    trainer.critic_warmup=0 \
    trainer.logger="$LOGGER" \
    trainer.project_name="$PROJECT_NAME" \
    trainer.experiment_name="$EXPERIMENT_NAME" \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.val_before_train="$VAL_BEFORE_TRAIN" \
    trainer.save_freq="$SAVE_FREQ" \
    trainer.test_freq="$TEST_FREQ" \
    trainer.total_epochs="$TOTAL_EPOCHS" \
    trainer.total_training_steps="$TOTAL_TRAINING_STEPS" \
    "$@"
