"""The reward-loop managers by name (veRL 0.10's registry): ``@register("name")`` on a
:class:`~verl.experimental.reward_loop.reward_manager.base.RewardManagerBase` subclass, ``get_reward_manager_cls``
to find it. ``reward.reward_manager.name`` is looked up here first, then in the batch managers' registry
(`verl.workers.reward_manager`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["REWARD_MANAGER", "get_reward_manager_cls", "register"]

REWARD_MANAGER: dict[str, type] = {}

T = TypeVar("T", bound=type)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make the reward-loop manager available as ``reward.reward_manager.name=<name>``; a second,
    different class under a taken name is an error (the same class again, e.g. a reloaded module, is not)."""

    def decorator(cls: T) -> T:
        existing = REWARD_MANAGER.get(name)
        if existing is not None and _qualified(existing) != _qualified(cls):
            raise ValueError(
                f"reward manager {name!r} is already registered to {_qualified(existing)}; "
                f"register {_qualified(cls)} under another name"
            )
        REWARD_MANAGER[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    """The reward-loop manager registered as ``name``; ``ValueError`` listing the registered names otherwise."""
    try:
        return REWARD_MANAGER[name]
    except KeyError:
        raise ValueError(
            f"Unknown reward manager: {name} (reward.reward_manager.name); reward-loop managers: "
            f"{sorted(REWARD_MANAGER)}"
        ) from None
