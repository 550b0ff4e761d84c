"""Reward managers: turn a rollout batch into token-level scores with a rule-based ``compute_score``.

``naive`` (one call per sample), ``batch`` (one call per batch) and ``dapo`` (per sample, with the overlong
penalty) are registered by name; ``@register("mine")`` adds another (see ``reward_manager.name``).
"""

from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample
from verl.workers.reward_manager.batch import BatchRewardManager
from verl.workers.reward_manager.dapo import DAPORewardManager
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "AbstractRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "RewardSample",
    "get_reward_manager_cls",
    "register",
]
