"""`need_reward_model` from a config (veRL 0.10) or from a role→worker mapping (veRL's older call)."""

from __future__ import annotations

from omegaconf import OmegaConf

from verl.trainer.ppo.utils import Role, need_reward_model


def test_need_reward_model_reads_the_config_or_the_role_mapping():
    assert need_reward_model(OmegaConf.create({"reward": {"reward_model": {"enable": True}}})) is True
    assert need_reward_model(OmegaConf.create({"reward": {"reward_model": {"enable": False}}})) is False
    assert need_reward_model(OmegaConf.create({"reward_model": {"enable": True}})) is True  # legacy top-level key
    assert need_reward_model(OmegaConf.create({"reward": {}})) is False
    assert need_reward_model({Role.RewardModel: object}) and not need_reward_model({Role.ActorRollout: object})
