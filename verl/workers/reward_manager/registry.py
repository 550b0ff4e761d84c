"""Reward managers by name: ``@register("naive")`` on a class, ``get_reward_manager_cls("naive")`` to find it."""

from __future__ import annotations

from verl.utils.class_registry import class_registry

__all__ = ["REWARD_MANAGER_REGISTRY", "get_reward_manager_cls", "register"]

REWARD_MANAGER_REGISTRY: dict[str, type] = {}

register, get_reward_manager_cls = class_registry(REWARD_MANAGER_REGISTRY, "reward manager", "reward_manager.name")
