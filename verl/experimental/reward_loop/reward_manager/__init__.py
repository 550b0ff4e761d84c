"""veRL 0.10's reward-loop managers (``verl.experimental.reward_loop.reward_manager``): the contract
(:class:`RewardManagerBase`), the registry (``register`` / ``get_reward_manager_cls``) and the built-ins
``naive``, ``dapo``, ``gdpo``, ``rate_limited``, ``remote``."""

from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER, get_reward_manager_cls, register  # noqa: I001
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase, ScoreInputs, score_result
from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager
from verl.experimental.reward_loop.reward_manager.gdpo import GDPORewardManager
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.experimental.reward_loop.reward_manager.limited import RateLimitedRewardManager
from verl.experimental.reward_loop.reward_manager.remote import RemoteRewardManager

__all__ = [
    "REWARD_MANAGER",
    "DAPORewardManager",
    "GDPORewardManager",
    "NaiveRewardManager",
    "RateLimitedRewardManager",
    "RemoteRewardManager",
    "RewardManagerBase",
    "ScoreInputs",
    "get_reward_manager_cls",
    "register",
    "score_result",
]
