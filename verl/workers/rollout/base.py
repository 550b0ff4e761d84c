"""The rollout contract every engine implements, and the registry that picks one by ``rollout.name``.

An engine serves requests (``async generate(request_id, *, prompt_ids, sampling_params)``, continuous batching,
abort and resume, weight versions: :mod:`verl.workers.rollout.serving`); the batch ``generate_sequences`` of a
``DataProto`` of left-padded prompts is a thin layer over it. In the hybrid engine it lives in the training worker's
process: it sleeps while the trainer trains (freeing its weights and KV cache where the backend can) and wakes to
receive the trainer's new weights.

Engines register with :func:`register_rollout`. The built-in ones are imported only when asked for, so importing
this module never imports vLLM or SGLang; asking for one whose package is missing raises an ``ImportError`` that
names the pip extra to install.
"""

from __future__ import annotations

import abc
import collections.abc
import importlib
import importlib.util
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

import torch

from verl.base_config import omega_conf_to_dataclass
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout.registry import (
    _BUILTIN_ROLLOUTS,
    _ROLLOUT_REGISTRY,
    registered_rollouts,
    rollout_unavailable_reason,
)
from verl.workers.rollout.serving import RequestServing

__all__ = [
    "WAKE_UP_TAGS",
    "BaseRollout",
    "get_rollout_class",
    "register_rollout",
    "registered_rollouts",
    "rollout_unavailable_reason",
]

# What `wake_up(tags)` can restore: the weights, and the KV cache (generation needs both).
WAKE_UP_TAGS = ("weights", "kv_cache")


class BaseRollout(RequestServing, abc.ABC):
    """A rollout engine: serves generation requests and exchanges weights with the trainer.

    Subclasses implement the weight and memory methods below and the request hooks of
    :class:`~verl.workers.rollout.serving.RequestServing` (admit, step, release), and call ``_init_serving``.

    Args:
        config: the ``actor_rollout_ref.rollout`` config (a :class:`RolloutConfig`, or a mapping converted to one).
        model_path: a Hugging Face model folder (config and weights).
        device: where the engine runs ("cpu", "cuda", "cuda:1", ...).
        **kwargs: engine-specific options.
    """

    #: Whether ``sleep`` really frees memory. Engines that cannot sleep make it a no-op and say so here.
    supports_sleep: ClassVar[bool] = False
    #: Whether the weights' values survive ``sleep`` / ``wake_up`` (vLLM's level-1 sleep keeps them in host memory);
    #: when not, a woken engine holds no values until ``update_weights`` fills them.
    weights_survive_sleep: ClassVar[bool] = True

    def __init__(
        self, config: RolloutConfig, model_path: str, device: str | torch.device = "cpu", **kwargs: Any
    ) -> None:
        if isinstance(config, collections.abc.Mapping) and not isinstance(config, RolloutConfig):
            config = omega_conf_to_dataclass(config, RolloutConfig)
        if not isinstance(config, RolloutConfig):
            raise TypeError(f"rollout config must be a RolloutConfig or a mapping, got {type(config).__name__}")
        self.config = config
        self.model_path = str(model_path)
        self.device = torch.device(device)

    @abc.abstractmethod
    def sleep(self) -> None:
        """Release the weights and the KV cache (idempotent; a no-op for engines without ``supports_sleep``)."""

    @abc.abstractmethod
    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what ``tags`` names ("weights", "kv_cache"; None: both). Idempotent.

        Woken weights hold no values until :meth:`update_weights` fills them.
        """

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load weights given by their Hugging Face state-dict names, cast to the engine's dtype.

        Implementations run inside :meth:`weight_update`: one call is one weight load (a new version) unless the
        caller holds a ``weight_update()`` around several.
        """

    @abc.abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The engine's current weights under their state-dict names (for a bit-exact check of a sync)."""

    @abc.abstractmethod
    def memory_bytes(self) -> int:
        """Bytes of the tensors (weights, buffers, cache) the engine holds now."""

    @staticmethod
    def _check_tags(tags: list[str] | None) -> tuple[str, ...]:
        """Normalize ``wake_up`` tags: None means all; an unknown tag raises ``ValueError``."""
        if tags is None:
            return WAKE_UP_TAGS
        if isinstance(tags, str):
            tags = [tags]
        unknown = [t for t in tags if t not in WAKE_UP_TAGS]
        if unknown:
            raise ValueError(f"wake_up tags {unknown} are unknown; use a subset of {list(WAKE_UP_TAGS)} or None")
        return tuple(tags)


def register_rollout(name: str) -> Callable[[type[BaseRollout]], type[BaseRollout]]:
    """Class decorator: make a :class:`BaseRollout` subclass available as ``rollout.name=<name>``."""

    def decorator(cls: type[BaseRollout]) -> type[BaseRollout]:
        if not (isinstance(cls, type) and issubclass(cls, BaseRollout)):
            raise TypeError(f"register_rollout({name!r}) decorates BaseRollout subclasses, got {cls!r}")
        existing = _ROLLOUT_REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"rollout engine {name!r} is already registered as {existing.__qualname__}")
        _ROLLOUT_REGISTRY[name] = cls
        return cls

    return decorator


def get_rollout_class(name: str) -> type[BaseRollout]:
    """The engine class registered as ``name``, importing a built-in engine on first use.

    Raises:
        ValueError: ``name`` is no engine.
        ImportError: the engine's package is not installed (the message says which pip extra to install).
    """
    if name in _ROLLOUT_REGISTRY:
        return _ROLLOUT_REGISTRY[name]
    if name not in _BUILTIN_ROLLOUTS:
        raise ValueError(f"unknown rollout engine rollout.name={name!r}; valid names: {registered_rollouts()}")
    module, package, install = _BUILTIN_ROLLOUTS[name]
    if package is not None and importlib.util.find_spec(package) is None:
        raise ImportError(f"rollout engine {name!r} needs the {package!r} package, which is not installed: {install}")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise ImportError(f"rollout engine {name!r}: its module {module} is not part of this verl build") from e
    if name not in _ROLLOUT_REGISTRY:
        raise ImportError(f"rollout engine {name!r}: importing {module} did not register it")
    return _ROLLOUT_REGISTRY[name]
