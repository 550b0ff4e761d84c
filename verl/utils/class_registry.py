"""Name → class registries (reward managers and the like) as plain dicts, with the decorator and the lookup."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["class_registry"]

T = TypeVar("T", bound=type)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def class_registry(registry: dict[str, type], what: str, key: str) -> tuple[Callable, Callable]:
    """``(register, lookup)`` over ``registry``: ``@register("name")`` on a class files it (a second, different class
    under a taken name is an error; the same class again, e.g. a reloaded module, is not); ``lookup("name")`` returns
    it, or raises ``ValueError`` naming ``what``, the config ``key`` and the registered names."""

    def register(name: str) -> Callable[[T], T]:
        def decorator(cls: T) -> T:
            existing = registry.get(name)
            if existing is not None and _qualified(existing) != _qualified(cls):
                raise ValueError(
                    f"{what} {name!r} is already registered to {_qualified(existing)}; "
                    f"register {_qualified(cls)} under another name"
                )
            registry[name] = cls
            return cls

        return decorator

    def lookup(name: str) -> type:
        try:
            return registry[name]
        except KeyError:
            raise ValueError(f"Unknown {what}: {name} ({key}); registered: {sorted(registry)}") from None

    return register, lookup
