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
from verl.trainer.config.layout import ASYNC_MODES, resolve_layout, trainer_mode

__all__ = [
    "ASYNC_MODES",
    "RESIDENT_BACKENDS",
    "ROLLOUT_POOL_DEFAULTS",
    "SEPARATE_BACKENDS",
    "async_training_config",
    "default_rollout_is",
    "total_training_steps",
    "uses_bypass_mode",
    "with_derived_settings",
]

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


# the weight push of a mode whose rollout engines live in processes of their own, per configured backend
RESIDENT_BACKENDS = {"naive": "shm", "shm": "shm"}
# ... and of a mode whose rollout engines are on a pool of their own (a collective push; naive: gloo, CPU and GPU)
SEPARATE_BACKENDS = {"naive": "gloo", "gloo": "gloo", "nccl": "nccl"}
# the top-level ``rollout`` section: the rollout pool of separate_async
ROLLOUT_POOL_DEFAULTS = {"nnodes": 1, "n_gpus_per_node": 1}
BACKENDS = {"colocate_async": RESIDENT_BACKENDS, "separate_async": SEPARATE_BACKENDS}


def default_rollout_is(config: Any) -> str | None:
    """The importance weighting an async mode adds (``async_training.default_rollout_is``): at ``max_lag`` > 0,
    when ``algorithm.rollout_correction`` sets no ``rollout_is``, ``rollout_rs`` or ``bypass_mode``; else None."""
    if trainer_mode(config) not in ASYNC_MODES:
        return None
    settings = async_training_config(config)
    correction = config.algorithm.get("rollout_correction") or {}
    if settings.max_lag == 0 or uses_bypass_mode(config):
        return None
    if correction.get("rollout_is") or correction.get("rollout_rs"):
        return None
    return settings.default_rollout_is


def with_derived_settings(config: DictConfig, total_steps: int) -> DictConfig:
    """A copy of ``config`` (resolved) with the derived settings filled in: ``optim.total_training_steps`` of the
    actor and the critic; with the bypass mode the actor's ``policy_loss`` (``loss_mode=bypass_mode`` and the
    rollout-correction settings its loss reads, as veRL's trainer writes them); in an async mode at lag > 0 without a
    correction of the user's, ``rollout_correction.rollout_is`` (:func:`default_rollout_is`); in ``colocate_async``
    the ``shm`` weight push and in ``separate_async`` the ``gloo`` one (the in-process ``naive`` backend cannot reach
    the servers' processes)."""
    out = resolve_layout(OmegaConf.create(OmegaConf.to_container(config, resolve=True)))
    with open_dict(out):
        out.actor_rollout_ref.actor.optim.total_training_steps = total_steps
        out.critic.optim.total_training_steps = total_steps
        rollout_is = default_rollout_is(out)
        if rollout_is is not None:
            logger.info(
                "trainer.v1.trainer_mode=%s at async_training.max_lag=%d: off-policy correction "
                "algorithm.rollout_correction.rollout_is=%r (async_training.default_rollout_is; null turns it off)",
                trainer_mode(out),
                async_training_config(out).max_lag,
                rollout_is,
            )
            out.algorithm.rollout_correction.rollout_is = rollout_is
        mode = trainer_mode(out)
        if mode in BACKENDS:
            engine = out.actor_rollout_ref.rollout.checkpoint_engine
            backend = BACKENDS[mode].get(engine.backend, engine.backend)
            if backend != engine.backend:
                logger.info("trainer.v1.trainer_mode=%s pushes weights across processes: backend %r", mode, backend)
            engine.backend = backend
        if uses_bypass_mode(out):
            policy_loss = out.actor_rollout_ref.actor.policy_loss
            logger.info("bypass mode: actor loss %r → 'bypass_mode'", policy_loss.loss_mode)
            policy_loss.loss_mode = "bypass_mode"
            policy_loss.rollout_correction = OmegaConf.merge(out.algorithm.rollout_correction, {"bypass_mode": True})
    return out
