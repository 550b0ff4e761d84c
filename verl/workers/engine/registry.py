"""Training engines by ``strategy`` name (``actor.strategy``, ``critic.strategy``): a recipe adds a name, not a fork."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ENGINE_REGISTRY", "get_engine_class", "register_engine"]

ENGINE_REGISTRY: dict[str, type] = {}
# engines whose module imports an optional package: registered when first asked for
LAZY_ENGINES = {"megatron": "verl.workers.engine.megatron_engine"}


def register_engine(*names: str) -> Callable[[type], type]:
    """Class decorator: make the engine class available under each of ``names``."""

    def decorator(cls: type) -> type:
        for name in names:
            if name in ENGINE_REGISTRY and ENGINE_REGISTRY[name] is not cls:
                raise ValueError(f"engine strategy {name!r} is already registered by {ENGINE_REGISTRY[name].__name__}")
            ENGINE_REGISTRY[name] = cls
        return cls

    return decorator


def get_engine_class(strategy: str) -> type:
    """The engine class registered for ``strategy`` ("fsdp" and "fsdp2" → ``FSDPEngine``, "megatron" →
    ``MegatronEngine``)."""
    if strategy not in ENGINE_REGISTRY and strategy in LAZY_ENGINES:
        import importlib

        importlib.import_module(LAZY_ENGINES[strategy])
    if strategy not in ENGINE_REGISTRY:
        raise ValueError(f"unknown engine strategy {strategy!r}; registered: {sorted(ENGINE_REGISTRY)}")
    return ENGINE_REGISTRY[strategy]
