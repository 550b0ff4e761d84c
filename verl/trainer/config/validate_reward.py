"""Start-up checks of the ``reward`` section: settings that a run would silently not apply."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["RATE_LIMIT_KEYS", "VLLM_ONLY", "check_reward", "reward_pool_size"]

logger = logging.getLogger(__name__)

# veRL 0.10's rate_limited manager reads these from ``reward`` (its scripts add them with ``+``)
RATE_LIMIT_KEYS = ("max_concurrent", "max_rpm", "max_tpm", "estimated_tokens_per_request", "timeout")


# the served judge's engine settings that only the vllm engine reads
VLLM_ONLY = (
    "gpu_memory_utilization",
    "enforce_eager",
    "tensor_model_parallel_size",
    "max_num_batched_tokens",
    "max_model_len",
    "max_num_seqs",
    "load_format",
    "enable_chunked_prefill",
    "enable_prefix_caching",
)


def reward_pool_size(config: Any) -> int:
    """Worker processes of the reward model's own pool (``reward.reward_model.enable_resource_pool``), else 0."""
    rm = config.reward.reward_model
    if not (rm.get("enable") and rm.get("enable_resource_pool")):
        return 0
    return int(rm.get("n_gpus_per_node") or 0) * int(rm.get("nnodes") or 0)


def check_reward(config: Any, problems: list[str]) -> None:
    """The overlong buffer and the rate limits against the reward manager that would apply them; a served
    reward model's settings."""
    _overlong_buffer(config, problems)
    _rate_limits(config, problems)
    _served_judge(config, problems)


def _served_judge(config: Any, problems: list[str]) -> None:
    """A served reward model needs its path; without a custom function it must be a classifier (its score is the
    reward); a generative judge needs a registered engine, and settings its engine does not read are named."""
    from verl.experimental.reward_loop.reward_model import served_reward_model

    if not served_reward_model(config):
        return
    rm = config.reward.reward_model
    path = rm.get("model_path")
    if not path:
        problems.append("reward.reward_model.enable serves reward.reward_model.model_path: set it")
        return
    discriminative = _is_classifier(path)
    if discriminative is False and not config.reward.custom_reward_function.get("path"):
        problems.append(
            f"reward.reward_model.enable without reward.custom_reward_function.path: {path} is a causal LM (a "
            "generative judge); give a reward function that asks it, or a classifier whose score is the reward"
        )
    rollout = rm.get("rollout") or {}
    from verl.trainer.config.compose import compose_config

    base = compose_config("ppo_trainer").reward.reward_model.rollout
    if discriminative:  # a classifier's replica reads the dtype and the seed only
        unread = [key for key in base if key not in ("dtype", "seed") and rollout.get(key) != base.get(key)]
        if unread:
            logger.warning(
                "reward.reward_model.rollout.%s: a classifier at %s is served without a rollout engine, which reads "
                "only dtype and seed",
                "/".join(unread),
                path,
            )
        return
    from verl.workers.rollout.registry import registered_rollouts

    name = rollout.get("name", "hf")
    if name not in registered_rollouts():
        engines = registered_rollouts()
        problems.append(f"reward.reward_model.rollout.name={name!r}: the rollout engines are {engines}")
    if name == "hf":
        changed = [key for key in VLLM_ONLY if rollout.get(key) != base.get(key)]
        if changed:
            logger.warning(
                "reward.reward_model.rollout.%s: the hf engine does not read them (only vllm does)", "/".join(changed)
            )


def _is_classifier(path: str) -> bool | None:
    """Whether the local checkpoint at ``path`` is a classifier (None: not a local folder, checked when served)."""
    import os

    if not os.path.isfile(os.path.join(os.path.expanduser(path), "config.json")):
        return None
    from verl.experimental.reward_loop.score_server import is_discriminative

    return is_discriminative(os.path.expanduser(path))


def _registered_class(config: Any) -> type | None:
    """The registered manager class the config names (None: an importlib manager, checked when it is built, or an
    unknown name, reported when it is built)."""
    manager = config.reward.reward_manager
    if (manager.get("source") or "register") != "register":
        return None
    from verl.trainer.ppo.reward import registered_manager

    try:
        return registered_manager(manager.get("name") or "naive")
    except ValueError:
        return None


def _overlong_buffer(config: Any, problems: list[str]) -> None:
    """``reward.reward_kwargs.overlong_buffer_cfg.enable`` (the older ``reward_model.overlong_buffer.enable``) with a
    registered manager that does not apply the buffer would train without the overlong punishment: refused."""
    reward = config.reward
    if not ((reward.get("reward_kwargs") or {}).get("overlong_buffer_cfg") or {}).get("enable", False):
        return
    from verl.experimental.reward_loop.reward_manager import RewardManagerBase
    from verl.workers.reward_manager.build import constructor_parameters

    name = reward.reward_manager.get("name") or "naive"
    cls = _registered_class(config)
    if cls is None or issubclass(cls, RewardManagerBase):
        return  # a reward-loop manager reads reward.reward_kwargs itself
    if "overlong_buffer_cfg" not in constructor_parameters(cls)[0]:
        problems.append(
            f"reward.reward_kwargs.overlong_buffer_cfg.enable=true, but the reward manager {name!r} does not apply "
            "the overlong buffer: set reward.reward_manager.name=dapo or disable the buffer"
        )


def _rate_limits(config: Any, problems: list[str]) -> None:
    """``reward.{max_concurrent, max_rpm, max_tpm, estimated_tokens_per_request, timeout}``: valid values, read by
    the ``rate_limited`` manager (and its subclasses) only — with another, start-up says they do nothing."""
    reward = config.reward
    given = [key for key in RATE_LIMIT_KEYS if reward.get(key) is not None]
    if not given:
        return
    from verl.experimental.reward_loop.rate_limits import RateLimitSettings
    from verl.experimental.reward_loop.reward_manager import RateLimitedRewardManager

    try:
        RateLimitSettings.from_config(reward)
    except ValueError as e:
        problems.append(str(e))
    timeout = reward.get("timeout")
    if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
        problems.append(f"reward.timeout={timeout!r} must be a number of seconds (0: no limit)")
    cls = _registered_class(config)
    if cls is not None and not issubclass(cls, RateLimitedRewardManager):
        logger.warning(
            "reward.%s: read only by the rate_limited reward manager; reward.reward_manager.name=%s does not apply "
            "them (set reward.reward_manager.name=rate_limited)",
            "/".join(given),
            reward.reward_manager.get("name") or "naive",
        )
