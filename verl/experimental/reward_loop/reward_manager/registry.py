"""The reward-loop managers by name (veRL 0.10's registry): ``@register("name")`` on a
:class:`~verl.experimental.reward_loop.reward_manager.base.RewardManagerBase` subclass, ``get_reward_manager_cls``
to find it. ``reward.reward_manager.name`` is looked up among the batch managers (`verl.workers.reward_manager`)
first, then here."""

from __future__ import annotations

from verl.utils.class_registry import class_registry

__all__ = ["REWARD_MANAGER", "get_reward_manager_cls", "register"]

REWARD_MANAGER: dict[str, type] = {}

register, get_reward_manager_cls = class_registry(REWARD_MANAGER, "reward-loop manager", "reward.reward_manager.name")
