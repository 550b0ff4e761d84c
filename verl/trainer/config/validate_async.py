"""The rules of the async trainer modes, checked with the rest of the config by
:func:`verl.trainer.config.validate.validate_config`: ``async_training.*`` against ``trainer.v1.trainer_mode``, the
rollout servers' pool and ``actor_rollout_ref.hybrid_engine`` (what ``separate_async`` reads)."""

from __future__ import annotations

import logging
from typing import Any

from verl.experimental.reward_loop.reward_model import served_reward_model
from verl.trainer.config.async_training import AsyncTrainingConfig
from verl.trainer.config.derived import ASYNC_MODES, ROLLOUT_POOL_DEFAULTS, async_training_config
from verl.trainer.config.layout import rollout_pool

__all__ = ["check_async_training"]

logger = logging.getLogger(__name__)


def check_async_training(config: Any, mode: str, problems: list[str]) -> None:
    """``async_training.*`` against ``trainer.v1.trainer_mode`` (the keys' meanings: `AsyncTrainingConfig`), the pool
    and ``actor_rollout_ref.hybrid_engine``; each problem appended to ``problems``."""
    try:
        settings = async_training_config(config)
    except (ValueError, TypeError) as e:
        problems.append(str(e))
        return
    if settings.partial_rollout and mode != "separate_async":
        problems.append(
            f"async_training.partial_rollout=true (abort the requests in flight at a weight push and resume them with "
            f"the new weights) with trainer.v1.trainer_mode={mode}: only separate_async, whose servers generate "
            "while the trainer pushes, can; set it false"
        )
    elif settings.partial_rollout and settings.max_lag == 0:
        logger.warning(
            "async_training.partial_rollout=true: no effect at async_training.max_lag=0, where no push arrives while "
            "the servers generate"
        )
    if settings.trigger_parameter_sync_step != 1:
        problems.append(
            f"async_training.trigger_parameter_sync_step={settings.trigger_parameter_sync_step}: trainer mode {mode} "
            "pushes the weights after every update (1)"
            + ("; generating with older weights is an async mode" if mode == "sync" else "; set it to 1")
        )
    reward_model = config.reward.reward_model
    colocated = reward_model.get("enable") and not reward_model.get("enable_resource_pool")
    if colocated and served_reward_model(config) and mode == "separate_async":
        problems.append(
            "reward.reward_model.enable=true with trainer.v1.trainer_mode=separate_async: a served reward model "
            "needs a pool of its own there (veRL's rule); set reward.reward_model.enable_resource_pool=true (with "
            "reward.reward_model.n_gpus_per_node / nnodes)"
        )
    elif colocated and not served_reward_model(config) and mode in ASYNC_MODES:
        problems.append(
            f"reward.reward_model.enable=true with trainer.v1.trainer_mode={mode}: the reward model scores each batch "
            "on the "
            "generation thread while the training workers update, so it cannot share their processes; set "
            "reward.reward_model.enable_resource_pool=true (with reward.reward_model.n_gpus_per_node / nnodes)"
        )
    _separate_pool(config, mode, problems)
    fixed_lag = config.trainer.v1.sampler.get("schedule", "fixed_lag") == "fixed_lag"
    if mode == "separate_async" and fixed_lag and (config.algorithm.get("filter_groups") or {}).get("enable", False):
        problems.append(
            "algorithm.filter_groups.enable=true with trainer.v1.trainer_mode=separate_async under the fixed lag: the "
            "trainer takes whole training batches from the sample queue, with no rollout filter; set "
            "trainer.v1.sampler.schedule=replay_buffer (its buffer evicts and refills the flat groups) or use the sync "
            "or colocate_async mode"
        )
    if mode == "colocate_async" and settings.staleness_threshold is not None:
        logger.warning(
            "async_training.staleness_threshold=%s: no effect with trainer.v1.trainer_mode=colocate_async, whose bound "
            "is "
            "async_training.max_lag=%d (batches generated ahead, each from one weight version)",
            settings.staleness_threshold,
            settings.max_lag,
        )
    if mode == "sync":
        defaults = AsyncTrainingConfig()
        ignored = [
            f"{k}={getattr(settings, k)}"
            for k in ("max_lag", "staleness_threshold")
            if getattr(settings, k) != getattr(defaults, k)
        ]
        if ignored:
            logger.warning(
                "async_training.%s: no effect with trainer.v1.trainer_mode=sync, which always trains on the newest "
                "weights "
                "(lag 0)",
                ", async_training.".join(ignored),
            )
    if settings.require_batches is not None:
        mini, batch = config.actor_rollout_ref.actor.ppo_mini_batch_size, config.data.train_batch_size
        if settings.require_batches * mini != batch:
            problems.append(
                f"async_training.require_batches={settings.require_batches} × actor_rollout_ref.actor."
                f"ppo_mini_batch_size={mini} = {settings.require_batches * mini} prompts per step, but "
                f"data.train_batch_size={batch}: the trainer takes data.train_batch_size prompts per step; make them "
                "agree or leave require_batches null"
            )


def _separate_pool(config: Any, mode: str, problems: list[str]) -> None:
    """The rollout servers' pool (``actor_rollout_ref.rollout.{nnodes,n_gpus_per_node}``, or the older top-level
    ``rollout.*``) and ``actor_rollout_ref.hybrid_engine``: what ``separate_async`` reads."""
    nnodes, n_gpus_per_node = rollout_pool(config)
    pool = {"nnodes": nnodes, "n_gpus_per_node": n_gpus_per_node}
    hybrid = config.actor_rollout_ref.get("hybrid_engine", True)
    if mode != "separate_async":
        if hybrid is False:
            problems.append(
                f"actor_rollout_ref.hybrid_engine=false with trainer.v1.trainer_mode={mode}: rollout engines apart "
                "from the training workers, on a pool of their own, are the separate_async mode; else leave it true"
            )
        changed = {k: pool[k] for k, default in ROLLOUT_POOL_DEFAULTS.items() if pool.get(k, default) != default}
        if changed:
            logger.warning(
                "actor_rollout_ref.rollout.%s: no effect with trainer.v1.trainer_mode=%s (the pool of separate_async)",
                ", actor_rollout_ref.rollout.".join(f"{k}={v}" for k, v in changed.items()),
                mode,
            )
        return
    for key in ROLLOUT_POOL_DEFAULTS:
        value = pool.get(key, ROLLOUT_POOL_DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(
                f"actor_rollout_ref.rollout.{key}={value!r}: the rollout servers' pool needs an integer >= 1"
            )
