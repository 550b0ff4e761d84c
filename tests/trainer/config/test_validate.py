"""The trainer config: the YAML is generated from the dataclasses, and bad configs are reported all at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verl.trainer.config.validate import ConfigError, base_config, merged, need_critic, validate_config

ROOT = Path(__file__).resolve().parents[3]
# A small valid config: the demo's sizes. Validation checks only that a local model path is a folder: any will do.
VALID = [
    f"actor_rollout_ref.model.path={ROOT}",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "trainer.n_gpus_per_node=2",
]


def test_yaml_is_generated_from_the_dataclasses():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_trainer_config.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_yaml_has_verl_defaults():
    cfg = base_config()
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert cfg.actor_rollout_ref.actor.clip_ratio_c == 3.0 and cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert cfg.actor_rollout_ref.rollout.val_kwargs.temperature == 0 and cfg.critic.cliprange_value == 0.5
    assert cfg.algorithm.adv_estimator == "gae" and cfg.algorithm.kl_ctrl.kl_coef == 0.001
    assert cfg.trainer.total_epochs == 30 and cfg.trainer.mode == "sync" and cfg.trainer.device == "auto"
    assert cfg.reward_manager.name == "naive" and cfg.reward_model.overlong_buffer.enable is False
    assert cfg.data.max_prompt_length == 512 and cfg.actor_rollout_ref.rollout.prompt_length == 512  # interpolated


def test_a_valid_config_passes():
    validate_config(merged(VALID))
    validate_config(merged([*VALID, "actor_rollout_ref.actor.ppo_mini_batch_size=3"]))  # 8 = 3 + 3 + 2, as veRL
    assert need_critic(merged(VALID)) and not need_critic(merged([*VALID, "algorithm.adv_estimator=grpo"]))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.bogus=1", "unknown key 'data.bogus'"),
        ("trainer.total_epochs=many", "trainer.total_epochs='many' has the wrong type: expected int"),
        (
            "actor_rollout_ref.rollout.checkpoint_engine.backend=shm",
            "backend=shm pushes weights into a rollout engine in another process of the node",
        ),
        (
            "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
            "backend=gloo broadcasts weights to rollout replicas on a pool of their own",
        ),
        ("trainer.n_gpus_per_node=3", "8 × 2 = 16 is not divisible by 3 workers"),
        (
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "ppo_mini_batch_size=16 is larger than data.train_batch_size=8",
        ),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null", "ppo_micro_batch_size_per_gpu is required"),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "ppo_micro_batch_size_per_gpu (8) is larger than"),
        (
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null",
            "log_prob_micro_batch_size_per_gpu is required",
        ),
        ("critic.ppo_micro_batch_size_per_gpu=null", "critic.ppo_micro_batch_size_per_gpu is required"),
        (
            "actor_rollout_ref.hybrid_engine=false",
            "hybrid_engine=false with trainer.v1.trainer_mode=sync: rollout engines apart",
        ),
        ("trainer.v1.trainer_mode=fast", "trainer.v1.trainer_mode='fast'; use one of"),
        ("trainer.device=tpu", "trainer.device='tpu'; use auto, cpu or cuda"),
        ("actor_rollout_ref.actor.loss_agg_mode=mean", "loss_agg_mode='mean'"),
        ("actor_rollout_ref.rollout.name=trtllm", "rollout.name"),
        ("actor_rollout_ref.actor.strategy=megatron", "megatron: the megatron_actor config, McoreActorConfig"),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "sequence parallelism is not implemented"),
        (
            "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2",
            "multi-turn rollouts are repeated by actor_rollout_ref.rollout.n",
        ),
        ("algorithm.kl_ctrl.type=pid", "kl_ctrl"),
        ("data.gen_batch_size=16", "only dynamic sampling (algorithm.filter_groups.enable=true) generates more"),
        (
            "algorithm={use_kl_in_reward: true, filter_groups: {enable: true, metric: seq_final_reward}}",
            "the groups are filtered before the KL penalty exists",
        ),
        ("algorithm.rollout_correction.rollout_is=both", "rollout_is='both'; use null, 'token' or 'sequence'"),
        ("algorithm.adv_estimator=optimal_token_baseline", "set actor_rollout_ref.actor.calculate_sum_pi_squared=true"),
        ("critic.model.lora_rank=-8", "critic.model.lora_rank=-8 must be an integer >= 0"),
        ("actor_rollout_ref.model.lora_adapter_path=/tmp/a", "lora_adapter_path='/tmp/a' needs actor_rollout"),
        ("actor_rollout_ref.ref.ulysses_sequence_parallel_size=2", "sequence parallelism is not implemented"),
        ("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.name='sglang': it needs the 'sglang'"),
        ("critic.forward_micro_batch_size=4", "critic.forward_micro_batch_size (global) is deprecated"),
        ("trainer.resume_mode=sometimes", "trainer.resume_mode='sometimes'; use auto, disable or resume_path"),
        ("trainer.resume_mode=resume_path", "needs trainer.resume_from_path to be a global_step_<N> folder"),
        ("trainer.max_actor_ckpt_to_keep=0", "max_actor_ckpt_to_keep=0 must be null (keep all) or a positive"),
        ("trainer.default_hdfs_dir=/hdfs/x", "copying checkpoints to HDFS is not supported"),
    ],
)
def test_bad_configs_name_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        validate_config(merged([*VALID, override]))
    assert message in str(info.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        validate_config(
            merged([*VALID, "trainer.mode=fast", "trainer.n_gpus_per_node=3", "actor_rollout_ref.actor.clip_ratio=-1"])
        )
    assert len(info.value.problems) >= 3 and str(info.value).startswith(f"{len(info.value.problems)} problem(s)")


def test_keys_without_effect_only_warn(caplog):
    with caplog.at_level("WARNING"):
        validate_config(merged([*VALID, "actor_rollout_ref.actor.use_torch_compile=false"]))
    assert "use_torch_compile=False has no effect here" in caplog.text
