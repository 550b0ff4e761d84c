"""AlgoConfig and its nested configs: veRL defaults, construction from OmegaConf, and one test per validation error."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from verl.base_config import omega_conf_to_dataclass
from verl.trainer.config import AlgoConfig, FilterGroupsConfig, KLControlConfig, PFPPOConfig, RolloutCorrectionConfig
from verl.trainer.config.algorithm import parse_rollout_is_threshold, parse_rollout_rs_thresholds


def test_defaults_are_veRLs():
    cfg = AlgoConfig()
    assert (cfg.adv_estimator, cfg.gamma, cfg.lam, cfg.norm_adv_by_std_in_grpo) == ("gae", 1.0, 1.0, True)
    assert (cfg.use_kl_in_reward, cfg.kl_penalty, cfg.use_pf_ppo) == (False, "kl", False)
    assert cfg.filter_groups == FilterGroupsConfig(enable=False, metric=None, max_num_gen_batches=0)  # veRL 0.10
    assert cfg.kl_ctrl == KLControlConfig(type="fixed", kl_coef=0.001, horizon=10000, target_kl=0.1)
    assert cfg.pf_ppo == PFPPOConfig(reweight_method="pow", weight_pow=2.0)
    rc = cfg.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_is_batch_normalize) == (None, 2.0, False)
    assert (rc.rollout_rs, rc.rollout_rs_threshold, rc.bypass_mode, rc.loss_type) == (None, None, False, "ppo_clip")
    assert FilterGroupsConfig() == FilterGroupsConfig(enable=False, metric=None, max_num_gen_batches=0)


def test_built_from_omegaconf_with_nested_groups():
    raw = OmegaConf.create(
        {
            "adv_estimator": "grpo",
            "norm_adv_by_std_in_grpo": False,
            "kl_ctrl": {"type": "adaptive", "kl_coef": 0.01},
            "filter_groups": {"enable": True, "metric": "acc", "max_num_gen_batches": 10},
            "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
        }
    )
    cfg = omega_conf_to_dataclass(raw, AlgoConfig)
    assert cfg.kl_ctrl.type == "adaptive" and cfg.filter_groups.metric == "acc"
    assert cfg.rollout_correction.rollout_is_threshold == "0.5_5.0"
    assert cfg.get("gamma") == 1.0 and cfg["adv_estimator"] == "grpo"  # Mapping access, as for a DictConfig
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"AlgoConfig\.gamma is frozen"):
        cfg.gamma = 0.5
    with pytest.raises(ValueError, match="unknown config key"):
        omega_conf_to_dataclass({"gama": 0.9}, AlgoConfig)


def test_nested_sections_given_as_dicts_are_built_as_veRL_passes_them():
    cfg = AlgoConfig(
        pf_ppo={"reweight_method": "max_min", "weight_pow": 3.0},
        kl_ctrl=OmegaConf.create({"type": "adaptive", "kl_coef": 0.002, "horizon": 5000, "target_kl": 0.05}),
        filter_groups={"enable": True, "metric": "acc"},
        rollout_correction={},
    )
    assert cfg.pf_ppo == PFPPOConfig(reweight_method="max_min", weight_pow=3.0)
    assert isinstance(cfg.kl_ctrl, KLControlConfig) and cfg.kl_ctrl.type == "adaptive" and cfg.kl_ctrl.horizon == 5000
    assert isinstance(cfg.filter_groups, FilterGroupsConfig) and cfg.filter_groups.metric == "acc"
    assert cfg.rollout_correction == RolloutCorrectionConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.pf_ppo = PFPPOConfig()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": 1.5}, "algorithm.gamma=1.5 must be a number in \\[0, 1\\]"),
        ({"lam": "x"}, "algorithm.lam='x'"),
        ({"adv_estimator": ""}, "algorithm.adv_estimator=''"),
        ({"norm_adv_by_std_in_grpo": "yes"}, "norm_adv_by_std_in_grpo='yes' must be true or false"),
        ({"kl_penalty": "k5"}, "algorithm.kl_penalty='k5' is not a KL estimator.*'low_var_kl'"),
        ({"kl_ctrl": 3}, "algorithm.kl_ctrl must be a KLControlConfig"),
        ({"filter_groups": "on"}, "algorithm.filter_groups must be a FilterGroupsConfig or None"),
        ({"pf_ppo": {"weight": 1}}, r"algorithm.pf_ppo: unknown config key\(s\) \['weight'\]"),
        ({"pf_ppo": {"reweight_method": "best"}}, "algorithm.pf_ppo.reweight_method='best'"),
    ],
)
def test_algo_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AlgoConfig(**kwargs)


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (KLControlConfig, {"type": "pid"}, "kl_ctrl.type='pid'; use 'fixed' or 'adaptive'"),
        (KLControlConfig, {"kl_coef": -1}, "kl_ctrl.kl_coef=-1"),
        (KLControlConfig, {"horizon": 0}, "kl_ctrl.horizon=0"),
        (KLControlConfig, {"target_kl": 0}, "kl_ctrl.target_kl=0"),
        (FilterGroupsConfig, {"enable": True}, "filter_groups.metric must name"),
        (FilterGroupsConfig, {"enable": 1}, "filter_groups.enable=1"),
        (FilterGroupsConfig, {"max_num_gen_batches": 1.5}, "max_num_gen_batches=1.5"),
        (PFPPOConfig, {"reweight_method": "top"}, "reweight_method='top'; use 'pow', 'max_min' or 'max_random'"),
        (PFPPOConfig, {"weight_pow": -1}, "weight_pow=-1"),
        (RolloutCorrectionConfig, {"rollout_is": "seq"}, "rollout_is='seq'; use null, 'token' or 'sequence'"),
        (RolloutCorrectionConfig, {"rollout_is_threshold": 0}, "rollout_is_threshold=0"),
        (RolloutCorrectionConfig, {"rollout_is_threshold": "a_b"}, "rollout_is_threshold='a_b'"),
        (RolloutCorrectionConfig, {"rollout_is_threshold": True}, "rollout_is_threshold=True"),
        (RolloutCorrectionConfig, {"rollout_rs": "token_k1"}, "rollout_rs_threshold must be set"),
        (
            RolloutCorrectionConfig,
            {"rollout_rs": "geo", "rollout_rs_threshold": 2},
            "unknown option\\(s\\) \\['geo'\\]",
        ),
        (RolloutCorrectionConfig, {"bypass_mode": "no"}, "bypass_mode='no' must be true or false"),
        (RolloutCorrectionConfig, {"loss_type": "ppo"}, "loss_type='ppo'; use 'ppo_clip' or 'reinforce'"),
    ],
)
def test_nested_config_validation(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_threshold_parsing():
    assert parse_rollout_is_threshold(2) == (None, 2.0)
    assert parse_rollout_is_threshold("0.5_5") == (0.5, 5.0)
    assert parse_rollout_rs_thresholds("token_k1, seq_max_k3", "2.0,0.1") == {
        "token_k1": (0.5, 2.0),
        "seq_max_k3": (None, 0.1),
    }
    assert parse_rollout_rs_thresholds("seq_mean_k1,seq_mean_k1", "0.9_1.1") == {"seq_mean_k1": (0.9, 1.1)}
    with pytest.raises(ValueError, match="one positive bound or two"):
        parse_rollout_is_threshold("1_2_3")
    with pytest.raises(ValueError, match="comma-separated string"):
        parse_rollout_rs_thresholds(3, 1.0)


def test_presets():
    assert RolloutCorrectionConfig.decoupled_token_is().rollout_is == "token"
    assert RolloutCorrectionConfig.decoupled_seq_is(3.0).rollout_is_threshold == 3.0
    assert RolloutCorrectionConfig.decoupled_seq_is_rs().rollout_rs == "seq_sum_k1"
    assert RolloutCorrectionConfig.decoupled_geo_rs().rollout_rs_threshold == "0.999_1.001"
    assert RolloutCorrectionConfig.bypass_ppo_clip().bypass_mode
    assert RolloutCorrectionConfig.bypass_pg_is().loss_type == "reinforce"
