"""Build the worker configs from the user's DictConfig sections, deriving per-rank sizes into new fields.

The user's values are never changed: derived quantities (rollout.n copied into the actor, the data-parallel size,
per-rank mini-batch sizes) are passed to the dataclass constructors, which compute and freeze them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from verl.base_config import omega_conf_to_dataclass
from verl.workers.config.actor import ActorConfig, RefConfig
from verl.workers.config.critic import CriticConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.rollout import RolloutConfig

logger = logging.getLogger(__name__)


def known_keys(config: Any, cls: type, section: str) -> Any:
    """``config`` without the top-level keys ``cls`` (or the recipe subclass its ``_target_`` names) lacks: a
    recipe's own keys (SPIN's ``actor.dpo_beta``), which validation accepted from its yaml and its code reads from
    the raw section."""
    from omegaconf import OmegaConf

    if config is None or dataclasses.is_dataclass(config):
        return config
    values = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else dict(config)
    target = str(values.get("_target_") or "")
    if target and not target.startswith("verl."):
        return values  # a recipe's subclass: it declares its own keys
    if target:  # verl's own subclass (McoreActorConfig): its keys
        from verl.base_config import _locate

        own = _locate(target)
        cls = own if isinstance(own, type) and issubclass(own, cls) else cls
    fields = {f.name for f in dataclasses.fields(cls)} | {"_target_"}
    extra = sorted(k for k in values if k not in fields)
    if extra:
        logger.info("%s: keys read by the recipe's own code, not by verl: %s", section, extra)
    return {k: v for k, v in values.items() if k in fields}


__all__ = [
    "known_keys",
    "build_actor_config",
    "build_critic_config",
    "build_model_config",
    "build_ref_config",
    "build_rollout_config",
]


def build_model_config(config: Any) -> HFModelConfig:
    """``actor_rollout_ref.model`` → `HFModelConfig`."""
    return omega_conf_to_dataclass(config, HFModelConfig)


def build_rollout_config(config: Any) -> RolloutConfig:
    """``actor_rollout_ref.rollout`` → `RolloutConfig`."""
    return omega_conf_to_dataclass(config, RolloutConfig)


def build_actor_config(config: Any, rollout_n: int, dp_size: int, model: HFModelConfig | None = None) -> ActorConfig:
    """``actor_rollout_ref.actor`` → `ActorConfig` for one of ``dp_size`` ranks generating ``rollout_n`` samples
    per prompt (its ``ppo_mini_batch_size_per_rank`` is derived from them). An unset (null) ``use_remove_padding``
    takes ``model.use_remove_padding``, as in veRL."""
    actor = omega_conf_to_dataclass(known_keys(config, ActorConfig, "actor"), ActorConfig)
    derived: dict[str, Any] = {"rollout_n": rollout_n, "data_parallel_size": dp_size}
    if actor.use_remove_padding is None and model is not None:
        derived["use_remove_padding"] = bool(model.use_remove_padding)
    return dataclasses.replace(actor, **derived)


def build_ref_config(config: Any, model: HFModelConfig | None = None) -> RefConfig:
    """``actor_rollout_ref.ref`` → `RefConfig` (its engine is always forward-only; an unset
    ``use_remove_padding`` takes the model's)."""
    ref = omega_conf_to_dataclass(known_keys(config, RefConfig, "ref"), RefConfig)
    derived: dict[str, Any] = {"fsdp_config": dataclasses.replace(ref.fsdp_config, forward_only=True)}
    if hasattr(ref, "megatron"):  # McoreRefConfig
        derived["megatron"] = dataclasses.replace(ref.megatron, forward_only=True)
    if ref.use_remove_padding is None and model is not None:
        derived["use_remove_padding"] = bool(model.use_remove_padding)
    return dataclasses.replace(ref, **derived)


def build_critic_config(config: Any, dp_size: int) -> CriticConfig:
    """``critic`` → `CriticConfig` for one of ``dp_size`` ranks."""
    critic = omega_conf_to_dataclass(config, CriticConfig)
    return dataclasses.replace(critic, data_parallel_size=dp_size)
