"""ActorConfig / PolicyLossConfig: veRL defaults, OmegaConf construction, one test per validation error."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from verl.base_config import omega_conf_to_dataclass
from verl.trainer.config import RolloutCorrectionConfig
from verl.workers.config import ActorConfig, PolicyLossConfig


def test_defaults_are_veRLs():
    cfg = ActorConfig()
    assert (cfg.clip_ratio, cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c) == (0.2, 0.2, 0.2, 3.0)
    assert (cfg.loss_agg_mode, cfg.loss_scale_factor, cfg.entropy_coeff) == ("token-mean", None, 0.0)
    assert (cfg.use_kl_loss, cfg.kl_loss_coef, cfg.kl_loss_type) == (False, 0.001, "low_var_kl")
    assert (cfg.tau_pos, cfg.tau_neg, cfg.ppo_epochs, cfg.global_batch_info) == (1.0, 1.05, 1, {})
    assert cfg.policy_loss == PolicyLossConfig(
        loss_mode="vanilla",
        clip_cov_ratio=0.0002,
        clip_cov_lb=1.0,
        clip_cov_ub=5.0,
        kl_cov_ratio=0.0002,
        ppo_kl_coef=0.1,
    )


def test_built_from_omegaconf():
    raw = OmegaConf.create({"clip_ratio_high": 0.28, "policy_loss": {"loss_mode": "gspo"}, "kl_loss_type": "k3+"})
    cfg = omega_conf_to_dataclass(raw, ActorConfig)
    assert cfg.clip_ratio_high == 0.28 and cfg.policy_loss.loss_mode == "gspo"
    assert cfg.get("clip_ratio_c") == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"ActorConfig\.clip_ratio is frozen"):
        cfg.clip_ratio = 0.1
    # The actor passes per-micro-batch global counts through a copy, never by mutating the user's config.
    per_micro = dataclasses.replace(cfg, global_batch_info={"dp_size": 2, "batch_num_tokens": 100})
    assert per_micro.global_batch_info["dp_size"] == 2 and cfg.global_batch_info == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clip_ratio": -0.1}, "actor.clip_ratio=-0.1 must be a number >= 0.0"),
        ({"clip_ratio_low": "a"}, "actor.clip_ratio_low='a' must be a number >= 0.0 or null"),
        ({"clip_ratio_c": 1.0}, "actor.clip_ratio_c=1.0 must be a number > 1.0"),
        ({"loss_agg_mode": "sum"}, "actor.loss_agg_mode='sum'; use one of \\['token-mean'"),
        ({"loss_scale_factor": 0}, "actor.loss_scale_factor=0"),
        ({"entropy_coeff": None}, "actor.entropy_coeff=None"),
        ({"kl_loss_coef": -1.0}, "actor.kl_loss_coef=-1.0"),
        ({"kl_loss_type": "kl2"}, "actor.kl_loss_type='kl2' is not a KL estimator"),
        ({"tau_pos": 0}, "actor.tau_pos=0 must be a number > 0.0"),
        ({"tau_neg": -1}, "actor.tau_neg=-1"),
        ({"ppo_epochs": 0}, "actor.ppo_epochs=0 must be an integer >= 1"),
        ({"use_kl_loss": 1}, "actor.use_kl_loss=1 must be true or false"),
        ({"global_batch_info": {"dp": 2}}, "unknown key\\(s\\) \\['dp'\\]; allowed: \\['dp_size'"),
        ({"global_batch_info": [1]}, "global_batch_info must be a dict"),
        ({"policy_loss": {"loss_mode": "gspo"}}, "actor.policy_loss must be a PolicyLossConfig"),
    ],
)
def test_actor_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ActorConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_mode": ""}, "actor.policy_loss.loss_mode=''"),
        ({"clip_cov_ratio": 0.0}, "clip_cov_ratio=0.0 must be a fraction in \\(0, 1\\]"),
        ({"kl_cov_ratio": 1.5}, "kl_cov_ratio=1.5"),
        ({"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, "clip_cov_lb=5.0 must be below"),
        ({"clip_cov_ub": "x"}, "clip_cov_ub='x' must be a number"),
        ({"ppo_kl_coef": -0.1}, "ppo_kl_coef=-0.1"),
        ({"loss_mode": "bypass_mode"}, "needs actor.policy_loss.rollout_correction"),
        ({"rollout_correction": {"bypass_mode": True}}, "rollout_correction must be a RolloutCorrectionConfig"),
    ],
)
def test_policy_loss_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolicyLossConfig(**kwargs)


def test_bypass_policy_loss_config_accepts_a_rollout_correction():
    cfg = PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=RolloutCorrectionConfig.bypass_ppo_clip())
    assert cfg.rollout_correction.bypass_mode
