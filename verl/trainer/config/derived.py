"""Settings derived from other keys, computed once, before any worker starts.

The trainer never rewrites a user's key while it runs. What the workers need that follows from other keys (the run
length for the lr schedules, the bypass loss when the rollout's log-probs are the old ones) is written into a copy
of the config by :func:`with_derived_settings`, once, in ``RayPPOTrainer.__init__``; the validator reads the same
rules (:func:`async_training_config`, :func:`uses_bypass_mode`).
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.base_config import omega_conf_to_dataclass
from verl.trainer.config.async_training import AsyncTrainingConfig

__all__ = ["async_training_config", "total_training_steps", "uses_bypass_mode", "with_derived_settings"]

logger = logging.getLogger(__name__)


def async_training_config(config: Any) -> AsyncTrainingConfig:
    """The ``async_training`` section as its frozen dataclass (defaults when the section is missing)."""
    section = config.get("async_training") or {}
    return omega_conf_to_dataclass(section, AsyncTrainingConfig)


def uses_bypass_mode(config: Any) -> bool:
    """Whether the rollout's log-probs are the old log-probs (no recomputation): ``algorithm.rollout_correction.
    bypass_mode``, or ``async_training.use_rollout_log_probs`` without ``compute_prox_log_prob``."""
    correction = config.algorithm.get("rollout_correction") or {}
    return bool(correction.get("bypass_mode", False)) or async_training_config(config).bypass_old_log_prob


def total_training_steps(config: Any, batches_per_epoch: int) -> int:
    """``trainer.total_training_steps``, or ``total_epochs`` × the data loader's batches per epoch."""
    if config.trainer.total_training_steps is not None:
        return int(config.trainer.total_training_steps)
    return batches_per_epoch * int(config.trainer.total_epochs)


def with_derived_settings(config: DictConfig, total_steps: int) -> DictConfig:
    """A copy of ``config`` (resolved) with the derived settings filled in: ``optim.total_training_steps`` of the
    actor and the critic, and with the bypass mode the actor's ``policy_loss`` (``loss_mode=bypass_mode`` and the
    rollout-correction settings its loss reads, as veRL's trainer writes them)."""
    out = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    with open_dict(out):
        out.actor_rollout_ref.actor.optim.total_training_steps = total_steps
        out.critic.optim.total_training_steps = total_steps
        if uses_bypass_mode(out):
            policy_loss = out.actor_rollout_ref.actor.policy_loss
            logger.info("bypass mode: actor loss %r → 'bypass_mode'", policy_loss.loss_mode)
            policy_loss.loss_mode = "bypass_mode"
            policy_loss.rollout_correction = OmegaConf.merge(out.algorithm.rollout_correction, {"bypass_mode": True})
    return out
