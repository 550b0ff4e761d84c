#!/usr/bin/env bash
# DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv:2503.14476) on
# DAPO-Math-17k, validated on AIME 2024: GRPO's group advantages with the paper's four changes, all of them settings
# of the trainer (recipe/dapo/config/dapo_trainer.yaml holds them; the script restates them with its sizes).
#
# What makes it DAPO (the keys below):
#   actor_rollout_ref.actor.clip_ratio_low=0.2 / clip_ratio_high=0.28   Clip-Higher: decoupled clip range
#   algorithm.filter_groups.enable=True (metric=acc)                      dynamic sampling: drop groups that all
#   data.gen_batch_size = 3 x data.train_batch_size                       agree, generate until a batch is full
#   actor_rollout_ref.actor.loss_agg_mode=token-mean                      token-level policy-gradient loss
#   reward_model.reward_manager=dapo, reward_model.overlong_buffer.*      soft overlong punishment
#   algorithm.use_kl_in_reward=False, actor_rollout_ref.actor.use_kl_loss=False     no KL term
#
# The reward is verl.utils.reward_score.math_dapo (data_source math_dapo / aime*: the response's last
# "Answer: ..." line against the ground truth, +1 or -1), chosen by default_compute_score: no reward file is needed.
#
# Hardware for the defaults: one node with 8 x 80 GB GPUs (A100/H100), Qwen2.5-0.5B-Instruct, vLLM rollout.
# Data (the parquet files the DAPO authors publish on the Hugging Face hub):
#   huggingface-cli download --repo-type dataset BytedTsinghua-SIA/DAPO-Math-17k data/dapo-math-17k.parquet \
#       --local-dir ~/data/dapo-math-17k
#   huggingface-cli download --repo-type dataset BytedTsinghua-SIA/AIME-2024 data/aime-2024.parquet \
#       --local-dir ~/data/aime-2024
# Run, from the repository root (recipe/ is part of the checkout, not of the installed package):
#   bash recipe/dapo/run_dapo_qwen2.5_0.5b.sh [key=value ...]
# Every size, path and engine below is an environment variable (NAME=${NAME:-default}); key=value arguments are
# appended to the command line, and Hydra lets a later value of a key win over the script's.
#
# On CPU, with the built-in arithmetic task and its tiny model (built on first use under ~/.cache/verl); its reward
# (data_source verl/arithmetic) is graded, so dynamic sampling filters on score rather than on acc:
#   eval "$(python3 -c 'from verl.utils.demo import ensure_demo_assets as e; a = e()
#   print(f"export MODEL_PATH={a.model_path} TRAIN_FILES={a.train_files} VAL_FILES={a.val_files}")')"
#   ROLLOUT_NAME=hf ROLLOUT_TP=1 N_GPUS=1 TRAIN_BATCH_SIZE=16 GEN_BATCH_SIZE=32 PPO_MINI_BATCH_SIZE=16 \
#   PPO_MICRO_BATCH_SIZE_PER_GPU=16 LOG_PROB_MICRO_BATCH_SIZE_PER_GPU=16 ROLLOUT_N=4 MAX_PROMPT_LENGTH=32 \
#   MAX_RESPONSE_LENGTH=8 OVERLONG_BUFFER_LEN=4 FILTER_GROUPS_METRIC=score ACTOR_LR=3e-3 VAL_N=1 \
#   TOTAL_TRAINING_STEPS=40 TEST_FREQ=10 bash recipe/dapo/run_dapo_qwen2.5_0.5b.sh
set -xeuo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}
TRAIN_FILES=${TRAIN_FILES:-$HOME/data/dapo-math-17k/data/dapo-math-17k.parquet}
VAL_FILES=${VAL_FILES:-$HOME/data/aime-2024/data/aime-2024.parquet}

TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-128}                # prompts per step (after dynamic sampling)
GEN_BATCH_SIZE=${GEN_BATCH_SIZE:-$((TRAIN_BATCH_SIZE * 3))} # prompts per generation batch
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1024}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-4096}
OVERLONG_BUFFER_LEN=${OVERLONG_BUFFER_LEN:-1024}         # the last tokens of the response budget lose reward
OVERLONG_PENALTY_FACTOR=${OVERLONG_PENALTY_FACTOR:-1.0}  # reward lost at the budget's end
ROLLOUT_N=${ROLLOUT_N:-8}                                # responses per prompt (the group)
FILTER_GROUPS_METRIC=${FILTER_GROUPS_METRIC:-acc}        # acc | score | seq_reward | seq_final_reward
MAX_NUM_GEN_BATCHES=${MAX_NUM_GEN_BATCHES:-10}           # generation batches per step before giving up (0: no limit)
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-32}           # prompts per actor update (4 updates per step)
PPO_MICRO_BATCH_SIZE_PER_GPU=${PPO_MICRO_BATCH_SIZE_PER_GPU:-8}
LOG_PROB_MICRO_BATCH_SIZE_PER_GPU=${LOG_PROB_MICRO_BATCH_SIZE_PER_GPU:-16}
ACTOR_LR=${ACTOR_LR:-1e-6}
CLIP_RATIO_LOW=${CLIP_RATIO_LOW:-0.2}
CLIP_RATIO_HIGH=${CLIP_RATIO_HIGH:-0.28}
VAL_N=${VAL_N:-8}                                        # sampled answers per AIME problem in validation

ROLLOUT_NAME=${ROLLOUT_NAME:-vllm}                       # vllm | sglang | hf (CPU)
ROLLOUT_TP=${ROLLOUT_TP:-1}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.6}

N_GPUS=${N_GPUS:-8}                                      # workers per node (CPU: worker processes)
NNODES=${NNODES:-1}
TOTAL_EPOCHS=${TOTAL_EPOCHS:-10}
TOTAL_TRAINING_STEPS=${TOTAL_TRAINING_STEPS:-null}       # null: TOTAL_EPOCHS over the data
SAVE_FREQ=${SAVE_FREQ:-20}
TEST_FREQ=${TEST_FREQ:-10}
VAL_BEFORE_TRAIN=${VAL_BEFORE_TRAIN:-True}
LOGGER=${LOGGER:-'["console","file"]'}                   # add "wandb" when the machine can reach it
PROJECT_NAME=${PROJECT_NAME:-verl_dapo_example}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen2.5_0.5b_dapo}

python3 -m recipe.dapo.main_dapo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.metric="$FILTER_GROUPS_METRIC" \
    algorithm.filter_groups.max_num_gen_batches="$MAX_NUM_GEN_BATCHES" \
    data.train_files="$TRAIN_FILES" \
    data.val_files="$VAL_FILES" \
    data.prompt_key=prompt \
    data.train_batch_size="$TRAIN_BATCH_SIZE" \
    data.gen_batch_size="$GEN_BATCH_SIZE" \
    data.max_prompt_length="$MAX_PROMPT_LENGTH" \
    data.max_response_length="$MAX_RESPONSE_LENGTH" \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    reward_model.reward_manager=dapo \
    reward_model.overlong_buffer.enable=True \
    reward_model.overlong_buffer.len="$OVERLONG_BUFFER_LEN" \
    reward_model.overlong_buffer.penalty_factor="$OVERLONG_PENALTY_FACTOR" \
    reward_model.overlong_buffer.log=True \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr="$ACTOR_LR" \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE" \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$PPO_MICRO_BATCH_SIZE_PER_GPU" \
    actor_rollout_ref.actor.clip_ratio_low="$CLIP_RATIO_LOW" \
    actor_rollout_ref.actor.clip_ratio_high="$CLIP_RATIO_HIGH" \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.kl_loss_coef=0.0 \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name="$ROLLOUT_NAME" \
    actor_rollout_ref.rollout.n="$ROLLOUT_N" \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP" \
    actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEMORY_UTILIZATION" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$LOG_PROB_MICRO_BATCH_SIZE_PER_GPU" \
    actor_rollout_ref.rollout.val_kwargs.n="$VAL_N" \
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7 \
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
