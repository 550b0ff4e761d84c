"""Reward managers by name: ``@register("naive")`` on a class, ``get_reward_manager_cls("naive")`` to find it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["REWARD_MANAGER_REGISTRY", "get_reward_manager_cls", "register"]

REWARD_MANAGER_REGISTRY: dict[str, type] = {}

T = TypeVar("T", bound=type)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make the manager available as ``reward_manager.name=<name>``.

    Registering a second, different class under a taken name raises ``ValueError`` (re-registering the same class,
    e.g. when its module is reloaded, is allowed).
    """

    def decorator(cls: T) -> T:
        existing = REWARD_MANAGER_REGISTRY.get(name)
        if existing is not None and _qualified(existing) != _qualified(cls):
            raise ValueError(
                f"reward manager {name!r} is already registered to {_qualified(existing)}; "
                f"register {_qualified(cls)} under another name"
            )
        REWARD_MANAGER_REGISTRY[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    """The manager class registered as ``name``; ``ValueError`` listing the registered names otherwise."""
    try:
        return REWARD_MANAGER_REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"Unknown reward manager: {name} (reward_manager.name); registered: {sorted(REWARD_MANAGER_REGISTRY)}"
        ) from None
