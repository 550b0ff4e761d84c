"""veRL's two config layouts, one trainer: each setting that veRL 0.10 renamed is read under its newer name.

Run scripts written for veRL 0.10 choose the mode with ``trainer.use_v1`` / ``trainer.v1.trainer_mode``, size the
standalone rollout servers with ``actor_rollout_ref.rollout.{nnodes,n_gpus_per_node}`` and put the reward settings
under ``reward.*``. Scripts written for earlier veRL (and for this project before) set ``trainer.mode``, the
top-level ``rollout.{nnodes,n_gpus_per_node}`` and ``reward_model.*`` / ``reward_manager.*`` /
``custom_reward_function.*``; the critic's FSDP settings moved from ``critic.model.fsdp_config`` to
``critic.fsdp``; the async modes' prefetch depth, ``trainer.v1.<mode>.num_warmup_batches``, is this project's
``async_training.max_lag``. Each pair in `ALIASES` is one setting with two names. :func:`resolve_layout` runs on the
driver before validation (and again, finding nothing to do, where the trainer is built without it):

- the older name set away from its default, the newer one at its default: the value moves to the newer name and a
  start-up warning names both (veRL's ``migrate_legacy_reward_impl``, which veRL's own ``main_ppo`` no longer calls,
  so there the older reward keys are silently ignored);
- both set, to different values: an error naming both;
- the newer name set: the older one is written from it, so code written for either generation (a recipe reading
  ``config.reward_model.reward_kwargs``) reads the value the trainer uses.

The trainer reads the newer names only. ``reward_model.*`` keeps the settings of this project's reward-model worker
that have no newer name (``micro_batch_size_per_gpu``, ``model.fsdp_config``, ...).
"""

from __future__ import annotations

import copy
import logging
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.trainer.config.errors import ConfigError
from verl.trainer.config.unread import is_away

__all__ = [
    "ALIASES",
    "ASYNC_MODES",
    "Alias",
    "migrate_legacy_reward_impl",
    "resolve_layout",
    "rollout_pool",
    "trainer_mode",
]

logger = logging.getLogger(__name__)


class Alias(NamedTuple):
    """One setting with two names: ``new`` (veRL 0.10's, read by the trainer) and ``old`` (earlier veRL's)."""

    new: str
    old: str


def _reward(*pairs: tuple[str, str]) -> tuple[Alias, ...]:
    return tuple(Alias(f"reward.{new}", old) for new, old in pairs)


TRAINER_ALIASES = (
    Alias("trainer.v1.trainer_mode", "trainer.mode"),
    Alias("critic.fsdp", "critic.model.fsdp_config"),  # veRL 0.10 moved the value model's engine block
)

# veRL 0.10's migrate_legacy_reward_impl table, plus this project's own reward keys (timeout_s, overlong_buffer).
REWARD_ALIASES = _reward(
    ("num_workers", "reward_model.num_workers"),
    ("timeout_s", "reward_model.timeout_s"),
    ("reward_manager.name", "reward_model.reward_manager"),
    ("reward_manager.name", "reward_manager.name"),
    ("reward_manager.source", "reward_model.reward_loop_source"),
    ("reward_manager.source", "reward_manager.source"),
    ("reward_manager.module.path", "reward_model.reward_loop_module_path"),
    ("reward_manager.module.path", "reward_manager.module.path"),
    ("reward_manager.module.name", "reward_model.reward_loop_class_name"),
    ("reward_manager.module.name", "reward_manager.module.name"),
    ("custom_reward_function.path", "custom_reward_function.path"),
    ("custom_reward_function.name", "custom_reward_function.name"),
    ("custom_reward_function.reward_kwargs", "custom_reward_function.reward_kwargs"),
    ("reward_model.enable", "reward_model.enable"),
    ("reward_model.enable_resource_pool", "reward_model.enable_resource_pool"),
    ("reward_model.n_gpus_per_node", "reward_model.n_gpus_per_node"),
    ("reward_model.nnodes", "reward_model.nnodes"),
    ("reward_model.model_path", "reward_model.model.path"),
    ("reward_kwargs", "reward_model.reward_kwargs"),
    ("reward_kwargs.overlong_buffer_cfg", "reward_model.overlong_buffer"),
    ("sandbox_fusion", "reward_model.sandbox_fusion"),
)

ALIASES = TRAINER_ALIASES + REWARD_ALIASES

# The standalone rollout servers' pool: veRL 0.10's keys (nnodes 0: not given) and the older top-level ones.
POOL_NEW, POOL_OLD = "actor_rollout_ref.rollout", "rollout"
POOL_KEYS = ("nnodes", "n_gpus_per_node")


def _base() -> DictConfig:
    from verl.trainer.config.compose import compose_config

    return compose_config("ppo_trainer")


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _get(config: DictConfig, key: str) -> Any:
    return _plain(OmegaConf.select(config, key, default=None))


def _set(config: DictConfig, key: str, value: Any) -> None:
    with open_dict(config):
        OmegaConf.update(config, key, copy.deepcopy(value), merge=False, force_add=True)


def _resolve(config: DictConfig, base: DictConfig, alias: Alias, problems: list[str]) -> None:
    old_away, new_away = is_away(config, base, alias.old), is_away(config, base, alias.new)
    old, new = _get(config, alias.old), _get(config, alias.new)
    if old_away and new_away:
        if old != new:
            problems.append(
                f"{alias.old}={old!r} and {alias.new}={new!r} are one setting under two names (veRL's older and "
                f"0.10's); set only {alias.new}"
            )
    elif old_away:
        logger.warning("%s=%r is veRL's older name of %s: read as %s=%r", alias.old, old, alias.new, alias.new, old)
        _set(config, alias.new, old)
    elif new_away:
        _set(config, alias.old, new)


def _resolve_pool(config: DictConfig, base: DictConfig, problems: list[str]) -> None:
    """``actor_rollout_ref.rollout.{nnodes,n_gpus_per_node}`` (veRL 0.10) or the top-level ``rollout.*`` (the
    fully-async recipe's, and this project's older names); the newer pair is in use when its ``nnodes`` > 0."""
    new = {k: _get(config, f"{POOL_NEW}.{k}") for k in POOL_KEYS}
    old = {k: _get(config, f"{POOL_OLD}.{k}") for k in POOL_KEYS}
    old_away = any(is_away(config, base, f"{POOL_OLD}.{k}") for k in POOL_KEYS)
    if new["nnodes"]:
        if old_away and old != new:
            problems.append(
                f"rollout.nnodes/n_gpus_per_node={old['nnodes']}/{old['n_gpus_per_node']} and "
                f"actor_rollout_ref.rollout.nnodes/n_gpus_per_node={new['nnodes']}/{new['n_gpus_per_node']} size "
                "one pool under two names; set only actor_rollout_ref.rollout.*"
            )
            return
        for k in POOL_KEYS:
            _set(config, f"{POOL_OLD}.{k}", new[k])
        return
    if old_away:
        logger.warning(
            "rollout.nnodes/n_gpus_per_node are the older names of actor_rollout_ref.rollout.nnodes/n_gpus_per_node: "
            "read as %s/%s",
            old["nnodes"],
            old["n_gpus_per_node"],
        )
        for k in POOL_KEYS:
            _set(config, f"{POOL_NEW}.{k}", old[k])
        return
    size_key = f"{POOL_NEW}.n_gpus_per_node"
    if is_away(config, base, size_key):  # a size without nodes: the pool would silently stay one server
        mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync")
        message = (
            f"{size_key}={new['n_gpus_per_node']} sizes the standalone rollout pool only with {POOL_NEW}.nnodes > 0 "
            f"(here {new['nnodes']})"
        )
        if mode == "separate_async":
            problems.append(message + "; set it (e.g. 1)")
        else:
            logger.warning("%s; no effect with trainer.v1.trainer_mode=%s", message, mode)


ASYNC_MODES = ("colocate_async", "separate_async")  # the modes that generate ahead of training
LAG = "async_training.max_lag"


def _warmup(mode: str) -> str:
    return f"trainer.v1.{mode}.num_warmup_batches"


def _resolve_warmup(config: DictConfig, base: DictConfig, problems: list[str]) -> None:
    """``trainer.v1.<mode>.num_warmup_batches`` (veRL 0.10: batches dispatched before step 1, the prefetch depth)
    is the fixed-lag schedule's ``async_training.max_lag`` (batches generated ahead): one setting, two names. The
    running async mode's key and ``max_lag`` are resolved as an alias pair (the one set wins, both set and
    different is an error, and ``max_lag`` is written back to veRL's name); the other mode's key, or either under
    ``sync``, has no effect (a warning)."""
    mode = trainer_mode(config)  # a registered mode reads the section of the schedule it runs on
    for other in ASYNC_MODES:
        if other != mode and is_away(config, base, _warmup(other)):
            logger.warning(
                "%s=%r: no effect with trainer.v1.trainer_mode=%s", _warmup(other), _get(config, _warmup(other)), mode
            )
    if mode not in ASYNC_MODES:
        return
    key = _warmup(mode)
    warmup_away, lag_away = is_away(config, base, key), is_away(config, base, LAG)
    warmup, lag = _get(config, key), _get(config, LAG)
    if warmup_away and lag_away:
        if warmup != lag:
            problems.append(
                f"{key}={warmup!r} and {LAG}={lag!r} are one setting under two names (the batches generated ahead "
                f"of training; veRL 0.10's and this project's); set only one"
            )
    elif warmup_away:
        logger.info("%s=%r: the fixed-lag schedule generates that many batches ahead (%s)", key, warmup, LAG)
        _set(config, LAG, warmup)
    else:
        _set(config, key, lag)


def rollout_pool(config: Any) -> tuple[int, int]:
    """``(nnodes, n_gpus_per_node)`` of the standalone rollout servers: ``actor_rollout_ref.rollout.*`` when its
    ``nnodes`` > 0 (given, or read from the older names by :func:`resolve_layout`), else the top-level ``rollout.*``
    defaults (one node of one)."""
    rollout = OmegaConf.select(config, POOL_NEW, default=None) or {}
    if rollout.get("nnodes"):
        return int(rollout.nnodes), int(rollout.n_gpus_per_node)
    pool = config.get("rollout") or {}
    return int(pool.get("nnodes", 1)), int(pool.get("n_gpus_per_node", 1))


def resolve_layout(config: DictConfig, base: DictConfig | None = None) -> DictConfig:
    """Resolve every setting with two names into its newer one (see the module docstring), in place; returns
    ``config``. Raises `ConfigError` naming both keys of each setting given two different values. ``base``: the
    defaults (the composed ``ppo_trainer``)."""
    base = _base() if base is None else base
    problems: list[str] = []
    if OmegaConf.select(config, "trainer.use_v1", default=True) is False:
        logger.info(
            "trainer.use_v1=false (veRL's V0 trainer): one trainer runs both layouts here; the mode is "
            "trainer.v1.trainer_mode (or its older name trainer.mode)"
        )
    for alias in ALIASES:
        _resolve(config, base, alias, problems)
    _resolve_pool(config, base, problems)
    _resolve_warmup(config, base, problems)
    if problems:
        raise ConfigError(problems)
    return config


def migrate_legacy_reward_impl(config: DictConfig) -> DictConfig:
    """veRL 0.10's name for the reward part of :func:`resolve_layout`: the older ``reward_model.*`` /
    ``reward_manager.*`` / ``custom_reward_function.*`` keys are read into ``reward.*`` (each named in a warning);
    returns ``config``. The older keys keep the values, for code that still reads them."""
    base = _base()
    problems: list[str] = []
    for alias in REWARD_ALIASES:
        _resolve(config, base, alias, problems)
    if problems:
        raise ConfigError(problems)
    return config


def trainer_mode_name(config: Any) -> str:
    """The run's trainer mode as written: ``trainer.v1.trainer_mode`` (:func:`resolve_layout` wrote it; a config
    that never went through it and has no ``trainer.v1`` section is read at ``trainer.mode``); ``sync`` if neither
    is set. A mode added with ``register_trainer`` keeps its own name here."""
    if not OmegaConf.is_config(config):
        config = OmegaConf.create(config)
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None)
    return mode or OmegaConf.select(config, "trainer.mode", default=None) or "sync"


def trainer_mode(config: Any) -> str:
    """The built-in schedule the run's trainer mode runs on (``sync``, ``colocate_async``, ``separate_async``): the
    mode itself, or a registered mode's ``rollout_mode`` (:mod:`verl.trainer.ppo.v1.trainer_base`)."""
    from verl.trainer.ppo.v1.trainer_base import rollout_mode_of

    return rollout_mode_of(trainer_mode_name(config))
