"""veRL's Megatron role configs build (from dicts, ``_target_`` and the megatron yaml files) as configs only; the
roles the trainer builds still refuse strategy megatron."""

from __future__ import annotations

import os

import pytest
from hydra import compose, initialize_config_dir

from verl.base_config import omega_conf_to_dataclass
from verl.workers.config import (
    ActorConfig,
    CriticConfig,
    McoreActorConfig,
    McoreCriticConfig,
    McoreEngineConfig,
    McoreOptimizerConfig,
)

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "verl", "trainer", "config")


def test_mcore_actor_from_target_dict_is_an_actor_config_with_megatron_fields():
    cfg = omega_conf_to_dataclass(
        {
            "_target_": "verl.workers.config.McoreActorConfig",
            "ppo_mini_batch_size": 8,
            "ppo_micro_batch_size_per_gpu": 2,
            "optim": {"_target_": "verl.workers.config.McoreOptimizerConfig", "lr": 0.1, "lr_decay_style": "cosine"},
            "megatron": {"tensor_model_parallel_size": 2},
        }
    )
    assert isinstance(cfg, McoreActorConfig) and isinstance(cfg, ActorConfig)
    assert cfg.strategy == "megatron" and cfg.load_weight is True
    assert isinstance(cfg.optim, McoreOptimizerConfig) and cfg.optim.lr == 0.1 and cfg.optim.optimizer == "adam"
    assert isinstance(cfg.megatron, McoreEngineConfig) and cfg.megatron.tensor_model_parallel_size == 2


def test_strategies_stay_apart():
    with pytest.raises(ValueError, match="actor.strategy='megatron'; use fsdp or fsdp2"):
        ActorConfig(strategy="megatron", ppo_micro_batch_size_per_gpu=1)
    with pytest.raises(ValueError, match="critic.strategy='megatron'; use fsdp or fsdp2"):
        CriticConfig(strategy="megatron")
    with pytest.raises(ValueError, match="actor.strategy='fsdp'; a Megatron role config .* takes strategy megatron"):
        McoreActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1)
    assert McoreCriticConfig().optim.lr == 1e-5 and McoreCriticConfig().strategy == "megatron"
    with pytest.raises(ValueError, match="optim.lr_decay_style='steps'"):
        McoreOptimizerConfig(lr_decay_style="steps")
    with pytest.raises(ValueError, match="optim.lr_decay_steps=-2"):
        McoreOptimizerConfig(lr_decay_steps=-2)


def test_the_megatron_actor_yaml_builds_its_target_on_its_own():
    # rollout_n reads actor_rollout_ref.rollout.n when composed into the trainer, else 1 (as in veRL).
    with initialize_config_dir(config_dir=os.path.abspath(os.path.join(CONFIG_DIR, "actor")), version_base=None):
        cfg = compose(config_name="megatron_actor", overrides=["ppo_micro_batch_size_per_gpu=2"])
    built = omega_conf_to_dataclass(cfg)
    assert type(built) is McoreActorConfig and built.strategy == "megatron" and built.rollout_n == 1
    assert isinstance(built.optim, McoreOptimizerConfig) and built.optim.min_lr_ratio == 0.0


def test_mcore_optimizer_config_carries_muon_keys_and_is_importable_from_optimizer():
    from verl.workers.config import megatron
    from verl.workers.config.optimizer import McoreOptimizerConfig

    assert McoreOptimizerConfig is megatron.McoreOptimizerConfig
    config = McoreOptimizerConfig(lr=0.1, optimizer="muon", muon_num_ns_steps=6)
    assert (config.optimizer, config.muon_num_ns_steps, config.muon_momentum) == ("muon", 6, 0.95)
