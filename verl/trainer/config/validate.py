"""Validate the whole trainer config before any worker starts, reporting every problem at once.

Each problem names the key, the value and the fix. Checks: keys that the schema (``ppo_trainer.yaml``) does not
have, values of the wrong type, the config dataclasses' own validation, batch sizes that do not divide over the
workers, and keys verl accepts but does not implement (a value without effect here logs a warning; a value whose
meaning verl would get wrong is an error).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.base_config import omega_conf_to_dataclass
from verl.trainer.config.algorithm import SUM_PI_SQUARED_ESTIMATORS, AlgoConfig
from verl.workers.config import ActorConfig, CriticConfig, HFModelConfig, RefConfig, RolloutConfig

__all__ = ["ConfigError", "base_config", "need_critic", "need_reference_policy", "validate_config", "world_size"]

logger = logging.getLogger(__name__)

BASE_YAML = Path(__file__).with_name("ppo_trainer.yaml")
TRAINER_MODES = ("sync", "colocate_async", "separate_async")
IMPLEMENTED_MODES = ("sync",)

# (key, default, consequence, why): keys accepted for compatibility whose other values verl does not implement.
# "warn": the value has no effect here; "error": verl would silently do something else than the value asks.
UNIMPLEMENTED: list[tuple[str, Any, str, str]] = [
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1, "error", "sequence parallelism is not implemented"),
    ("critic.ulysses_sequence_parallel_size", 1, "error", "sequence parallelism is not implemented"),
    ("actor_rollout_ref.rollout.multi_turn.enable", False, "error", "multi-turn / tool rollouts are not implemented"),
    ("actor_rollout_ref.hybrid_engine", True, "error", "only the hybrid engine is implemented"),
    ("reward_model.launch_reward_fn_async", False, "warn", "rewards are computed in the driver's worker pool"),
    ("actor_rollout_ref.actor.use_torch_compile", True, "warn", "torch.compile is not used"),
    ("actor_rollout_ref.model.use_liger", False, "warn", "Liger kernels are not used"),
    ("actor_rollout_ref.model.use_fused_kernels", False, "warn", "fused kernels are not used"),
    ("actor_rollout_ref.model.enable_activation_offload", False, "warn", "activation offload is not implemented"),
    ("actor_rollout_ref.actor.checkpoint.async_save", False, "warn", "checkpoints are saved synchronously"),
    ("trainer.esi_redundant_time", 0, "warn", "ESI expiry handling is not implemented"),
    ("transfer_queue.enable", False, "error", "the transfer queue is not implemented"),
    ("critic.model.lora_rank", 0, "error", "LoRA training is not supported yet"),
    ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", 1, "error", "sequence parallelism is not implemented"),
    ("actor_rollout_ref.actor.optim.clip_grad", 1.0, "warn", "the actor clips with actor_rollout_ref.actor.grad_clip"),
    ("critic.optim.clip_grad", 1.0, "warn", "the critic clips with critic.grad_clip"),
    ("trainer.del_local_ckpt_after_load", False, "warn", "checkpoints are kept after loading (no remote copy)"),
]


class ConfigError(ValueError):
    """The config has problems; the message lists every one of them."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the config:\n{lines}")


def base_config() -> DictConfig:
    """The schema and defaults: ``verl/trainer/config/ppo_trainer.yaml``."""
    return OmegaConf.load(BASE_YAML)


def world_size(config: Any) -> int:
    """Worker processes of the global pool: ``trainer.n_gpus_per_node × trainer.nnodes``."""
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)


def need_critic(config: Any) -> bool:
    """A critic runs when ``critic.enable`` says so, or (unset) when the estimator is GAE."""
    enable = config.critic.get("enable")
    return bool(enable) if enable is not None else config.algorithm.adv_estimator == "gae"


def need_reference_policy(config: Any) -> bool:
    """A reference policy runs when a KL term needs it."""
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def _is_open(value: Any) -> bool:
    """A schema dict that accepts any keys (an empty mapping such as ``engine_kwargs`` or ``override_config``)."""
    return isinstance(value, DictConfig) and len(value) == 0


# Keys that take a string or a list of strings (veRL accepts both).
STR_OR_LIST_KEYS = ("data.train_files", "data.val_files", "trainer.logger")


def _type_problem(key: str, value: Any, default: Any) -> str | None:
    if key in STR_OR_LIST_KEYS and isinstance(value, ListConfig | list | str):
        return None
    if isinstance(default, str) and default.startswith("${"):  # the schema links it to another key: any type
        return None
    if default is None or value is None or isinstance(value, str) and value.startswith("${"):
        return None
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, ListConfig | list):
        ok = isinstance(value, ListConfig | list)
    else:
        return None
    if ok:
        return None
    return f"{key}={value!r} has the wrong type: expected {type(default).__name__} (default {default!r})"


def _walk(user: DictConfig, schema: DictConfig, prefix: str, problems: list[str]) -> None:
    """Unknown keys and wrong types of ``user`` against ``schema`` (both DictConfigs, unresolved)."""
    for key in user:
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in schema:
            known = ", ".join(sorted(str(k) for k in schema))
            problems.append(f"unknown key {path!r}; the keys at {prefix or 'the top level'} are: {known}")
            continue
        unode, snode = user._get_node(key), schema._get_node(key)
        if isinstance(snode, DictConfig):
            if isinstance(unode, DictConfig):
                if not _is_open(snode):
                    _walk(unode, snode, path, problems)
            elif unode._value() is not None and not OmegaConf.is_interpolation(user, key):
                problems.append(f"{path} must be a mapping like its default, got {unode._value()!r}")
            continue
        problem = _type_problem(path, unode._value(), snode._value())
        if problem:
            problems.append(problem)


def _dataclass_problem(builder, section: str, problems: list[str]) -> Any:
    try:
        return builder()
    except (ValueError, TypeError) as e:
        problems.append(f"{section}: {e}")
        return None


def _sizes(config: Any, problems: list[str]) -> None:
    workers = world_size(config)
    data, actor, rollout = config.data, config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    samples = data.train_batch_size * rollout.n
    if samples % workers:
        problems.append(
            f"data.train_batch_size × actor_rollout_ref.rollout.n = {data.train_batch_size} × {rollout.n} = {samples} "
            f"is not divisible by {workers} workers (trainer.n_gpus_per_node × trainer.nnodes); change the batch size "
            "or the worker count"
        )
    if actor.ppo_mini_batch_size > data.train_batch_size:
        problems.append(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} is larger than "
            f"data.train_batch_size={data.train_batch_size}; lower it"
        )
    elif data.train_batch_size % actor.ppo_mini_batch_size:
        problems.append(
            f"data.train_batch_size={data.train_batch_size} is not a multiple of actor_rollout_ref.actor."
            f"ppo_mini_batch_size={actor.ppo_mini_batch_size}; make it one"
        )
    if not actor.use_dynamic_bsz and actor.ppo_micro_batch_size_per_gpu is None:
        problems.append("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is required unless use_dynamic_bsz=true")
    if not rollout.log_prob_use_dynamic_bsz and rollout.log_prob_micro_batch_size_per_gpu is None:
        problems.append(
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu is required unless log_prob_use_dynamic_bsz"
        )
    if need_critic(config):
        critic = config.critic
        if not critic.use_dynamic_bsz and critic.ppo_micro_batch_size_per_gpu is None:
            problems.append("critic.ppo_micro_batch_size_per_gpu is required (the critic runs: adv_estimator=gae)")


def _trainer(config: Any, problems: list[str]) -> None:
    mode = config.trainer.get("mode", "sync")
    if mode not in TRAINER_MODES:
        problems.append(f"trainer.mode={mode!r}; use one of {list(TRAINER_MODES)}")
    elif mode not in IMPLEMENTED_MODES:
        problems.append(f"trainer.mode={mode!r} is not available yet; use trainer.mode=sync")
    device = config.trainer.get("device", "auto")
    if device not in ("auto", "cpu", "cuda"):
        problems.append(f"trainer.device={device!r}; use auto, cpu or cuda")
    elif device == "cuda":
        import torch

        if not torch.cuda.is_available():
            problems.append("trainer.device=cuda but no CUDA device is visible; use trainer.device=auto or cpu")
    if world_size(config) < 1:
        problems.append("trainer.n_gpus_per_node × trainer.nnodes must be at least 1")
    _resume(config.trainer, problems)


def _resume(trainer: Any, problems: list[str]) -> None:
    mode = trainer.resume_mode
    if mode not in ("auto", "disable", "resume_path"):
        problems.append(f"trainer.resume_mode={mode!r}; use auto, disable or resume_path")
    elif mode == "resume_path":
        path = trainer.resume_from_path
        if not path or "global_step_" not in os.path.basename(os.path.normpath(str(path))):
            problems.append(
                f"trainer.resume_mode=resume_path needs trainer.resume_from_path to be a global_step_<N> folder, "
                f"got {path!r}"
            )
    for key in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
        value = trainer.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append(f"trainer.{key}={value!r} must be null (keep all) or a positive integer")
    if trainer.get("default_hdfs_dir"):
        problems.append("trainer.default_hdfs_dir: copying checkpoints to HDFS is not supported; leave it null")


def _unimplemented(config: Any, problems: list[str]) -> None:
    for key, default, consequence, why in UNIMPLEMENTED:
        value = OmegaConf.select(config, key, default=default)
        if value == default:
            continue
        if consequence == "error":
            problems.append(f"{key}={value!r}: {why}; leave it at {default!r}")
        else:
            logger.warning("%s=%r has no effect here: %s", key, value, why)


def _rollout_engine(config: Any, problems: list[str]) -> None:
    from verl.workers.rollout.base import rollout_unavailable_reason

    name = config.actor_rollout_ref.rollout.name
    reason = rollout_unavailable_reason(name) if isinstance(name, str) else None
    if reason:
        problems.append(f"actor_rollout_ref.rollout.name={name!r}: {reason}; or use rollout.name=hf")


def _estimator(config: Any, problems: list[str]) -> None:
    estimator = config.algorithm.adv_estimator
    actor = config.actor_rollout_ref.actor
    if estimator in SUM_PI_SQUARED_ESTIMATORS and not actor.calculate_sum_pi_squared:
        problems.append(
            f"algorithm.adv_estimator={estimator!r} needs Σπ² per token from the old-log-prob pass: set "
            "actor_rollout_ref.actor.calculate_sum_pi_squared=true"
        )
    filter_groups = config.algorithm.get("filter_groups") or {}
    data = config.data
    if filter_groups.get("enable", False):
        if filter_groups.get("metric") == "seq_final_reward" and config.algorithm.use_kl_in_reward:
            problems.append(
                "algorithm.filter_groups.metric='seq_final_reward' with algorithm.use_kl_in_reward: the groups are "
                "filtered before the KL penalty exists; use 'seq_reward' or a reward metric such as 'acc'"
            )
    elif data.get("gen_batch_size", data.train_batch_size) != data.train_batch_size:
        problems.append(
            f"data.gen_batch_size={data.gen_batch_size} differs from data.train_batch_size={data.train_batch_size}: "
            "only dynamic sampling (algorithm.filter_groups.enable=true) generates more prompts than it trains on"
        )
    if estimator in SUM_PI_SQUARED_ESTIMATORS and config.algorithm.rollout_correction.bypass_mode:
        problems.append(f"algorithm.adv_estimator={estimator!r} needs the old-log-prob pass, which bypass_mode skips")


def validate_config(config: DictConfig, check_environment: bool = True) -> None:
    """Raise `ConfigError` listing every problem of ``config`` (a composed trainer config). ``check_environment``:
    also check that this environment can run it (the rollout engine's package is installed); off to check a config
    meant for another machine."""
    problems: list[str] = []
    _walk(config, base_config(), "", problems)
    if problems:  # unknown keys / wrong types: the rest would only repeat them
        raise ConfigError(problems)
    resolved = OmegaConf.to_container(config, resolve=True)
    cfg = OmegaConf.create(resolved)
    arr = cfg.actor_rollout_ref
    _dataclass_problem(lambda: omega_conf_to_dataclass(arr.model, HFModelConfig), "actor_rollout_ref.model", problems)
    rollout = _dataclass_problem(
        lambda: omega_conf_to_dataclass(arr.rollout, RolloutConfig), "actor_rollout_ref.rollout", problems
    )
    n = rollout.n if rollout is not None else 1
    workers = max(world_size(cfg), 1)
    _dataclass_problem(
        lambda: dataclasses.replace(
            omega_conf_to_dataclass(arr.actor, ActorConfig), rollout_n=n, data_parallel_size=workers
        ),
        "actor_rollout_ref.actor",
        problems,
    )
    if need_reference_policy(cfg):
        _dataclass_problem(lambda: omega_conf_to_dataclass(arr.ref, RefConfig), "actor_rollout_ref.ref", problems)
    if need_critic(cfg):
        _dataclass_problem(
            lambda: dataclasses.replace(omega_conf_to_dataclass(cfg.critic, CriticConfig), data_parallel_size=workers),
            "critic",
            problems,
        )
    _dataclass_problem(lambda: omega_conf_to_dataclass(cfg.algorithm, AlgoConfig), "algorithm", problems)
    _sizes(cfg, problems)
    _trainer(cfg, problems)
    _unimplemented(cfg, problems)
    _estimator(cfg, problems)
    if check_environment:
        _rollout_engine(cfg, problems)
    if problems:
        raise ConfigError(problems)


def merged(overrides: Mapping[str, Any] | list[str] | None = None) -> DictConfig:
    """The base config with ``overrides`` (a dotlist like ``["data.train_batch_size=8"]`` or a nested mapping)."""
    base = base_config()
    if overrides is None:
        return base
    extra = OmegaConf.from_dotlist(list(overrides)) if isinstance(overrides, list) else OmegaConf.create(overrides)
    return OmegaConf.merge(base, extra)
