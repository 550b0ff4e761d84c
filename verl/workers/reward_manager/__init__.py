"""Reward managers: turn a rollout batch into token-level scores with a rule-based ``compute_score``.

``naive`` (one call per sample), ``batch`` (one call per batch), ``dapo`` (per sample, with the overlong
penalty), ``gdpo`` (per sample, for the ``gdpo`` estimator) and ``prime`` (PRIME's: per sample, veRL's positional
call, scores kept as ``acc``) are registered by name; ``@register("mine")`` adds another (see
``reward.reward_manager.name``).
"""

from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample
from verl.workers.reward_manager.batch import BatchRewardManager
from verl.workers.reward_manager.dapo import DAPORewardManager
from verl.workers.reward_manager.gdpo import GDPORewardManager
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.prime import PrimeRewardManager
from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "AbstractRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "GDPORewardManager",
    "NaiveRewardManager",
    "PrimeRewardManager",
    "RewardSample",
    "get_reward_manager_cls",
    "register",
]
