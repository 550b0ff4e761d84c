"""veRL recipes' conventions that run unchanged here (SPPO, SPIN, retool), each as the recipe's code meets it:
validation called in a recipe's TaskRunner (no Hydra app), a recipe's own config keys and config subclasses, a null
advantage estimator, FSDP sections handed over as DictConfigs, and the device helpers veRL worker code calls."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from tests.trainer.config.test_validate import VALID
from verl.algorithms.config import AlgoConfig
from verl.base_config import omega_conf_to_dataclass
from verl.trainer.config.validate import ConfigError, merged
from verl.utils.config import validate_config
from verl.workers.config import ActorConfig, FSDPActorConfig
from verl.workers.config.builders import build_actor_config


@dataclasses.dataclass
class RecipeActorConfig(FSDPActorConfig):
    """As SPPO's ``SPPOActorConfig``: a subclass with a key of its own, named by ``_target_`` in the recipe yaml."""

    sppo_eta: float = 1.0


def test_validate_config_in_a_recipe_task_runner_takes_its_own_keys(caplog):
    """veRL's ``verl.utils.config.validate_config`` outside a Hydra app (a recipe's TaskRunner actor): the recipe's
    keys pass and are logged; a typo of one of verl's keys is still an error."""
    config = merged(VALID)
    for key, value in (("algorithm.sppo_eta", 1.0), ("actor_rollout_ref.actor.dpo_beta", 0.1)):
        OmegaConf.update(config, key, value, force_add=True)
    with caplog.at_level("WARNING"):
        validate_config(config, use_reference_policy=False, use_critic=True)
    assert "algorithm.sppo_eta" in caplog.text and "actor_rollout_ref.actor.dpo_beta" in caplog.text
    with pytest.raises(ConfigError, match="did you mean 'actor_rollout_ref.actor.clip_ratio'"):
        typo = merged(VALID)
        OmegaConf.update(typo, "actor_rollout_ref.actor.clip_ratoi", 0.2, force_add=True)
        validate_config(typo)


def test_a_recipe_config_subclass_and_its_own_keys_reach_the_worker():
    raw = {"_target_": f"{__name__}.RecipeActorConfig", "sppo_eta": 0.5, "ppo_mini_batch_size": 4}
    built = omega_conf_to_dataclass(OmegaConf.create(raw), ActorConfig)
    assert type(built) is RecipeActorConfig and built.sppo_eta == 0.5
    # SPIN's actor.dpo_beta beside verl's class: left to the recipe's code (it reads the raw section)
    section = OmegaConf.create({"_target_": "verl.workers.config.FSDPActorConfig", "dpo_beta": 0.1})
    section.ppo_mini_batch_size, section.ppo_micro_batch_size_per_gpu = 4, 2
    actor = build_actor_config(section, rollout_n=2, dp_size=1)
    assert actor.ppo_mini_batch_size_per_rank == 8 and not hasattr(actor, "dpo_beta")
    with pytest.raises(ValueError, match="unknown config key"):  # without a recipe around it, still refused
        omega_conf_to_dataclass({"dpo_beta": 0.1}, ActorConfig)


def test_a_null_advantage_estimator_is_for_a_recipe_fit():
    assert AlgoConfig(adv_estimator=None).adv_estimator is None  # SPPO's yaml: its fit() computes advantages
    with pytest.raises(ValueError, match="must name a registered advantage estimator"):
        AlgoConfig(adv_estimator="")


def test_fsdp_sections_as_dictconfigs():
    """Recipes hand ``self.config.actor.fsdp_config`` (a DictConfig, nested mappings included) to the engine."""
    from verl.workers.config.engine import FSDPEngineConfig

    section = OmegaConf.create({"wrap_policy": {"min_num_params": 0}, "mixed_precision": {"param_dtype": "fp32"}})
    config = FSDPEngineConfig(wrap_policy=section.wrap_policy, mixed_precision=section.mixed_precision)
    assert config.wrap_policy["min_num_params"] == 0
    with pytest.raises(ValueError, match="wrap_policy has unknown key"):
        FSDPEngineConfig(wrap_policy=OmegaConf.create({"min_params": 0}))
