"""Frozen, dict-readable config dataclasses and their construction from OmegaConf.

`BaseConfig` is the parent of every config dataclass in verl. An instance is immutable once built (a field may be
assigned exactly once, which is what the dataclass ``__init__`` and ``__post_init__`` do), and it reads like a
read-only mapping so code written for a ``DictConfig`` (``cfg["clip_ratio"]``, ``cfg.get("x", 1)``) keeps working.
Derived values (per-rank sizes and the like) go into fields of their own, set once in ``__post_init__``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import types
import typing
from typing import Any, TypeVar

__all__ = ["BaseConfig", "ConfigKeyError", "omega_conf_to_dataclass"]

T = TypeVar("T")


class ConfigKeyError(KeyError, AttributeError):
    """A config has no such key: both a ``KeyError`` (mapping code) and an ``AttributeError`` (attribute code)."""


@dataclasses.dataclass
class BaseConfig(collections.abc.Mapping):
    """A dataclass whose fields can be assigned once, and that reads like a ``Mapping``.

    Subclasses list the names that may be reassigned after construction in ``_mutable_fields`` (normally none).
    """

    _mutable_fields: typing.ClassVar[frozenset[str]] = frozenset()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__ and name not in self._mutable_fields:
            raise dataclasses.FrozenInstanceError(
                f"{type(self).__name__}.{name} is frozen; build a new config with dataclasses.replace() instead"
            )
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete {type(self).__name__}.{name}: configs are frozen")

    # Mapping interface: the dataclass fields are the keys (iteration, len, ``in``); ``[]`` and ``get`` also read
    # the config's properties (derived values) and public attributes set on the instance, as veRL's attribute-based
    # lookups do. A missing key raises `ConfigKeyError` (a KeyError and an AttributeError); a non-string key raises
    # TypeError, like ``getattr``.
    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str):
            raise TypeError(f"{type(self).__name__} keys are strings, got {type(key).__name__}: {key!r}")
        if (
            key in self._field_names()
            or isinstance(getattr(type(self), key, None), property)
            or (not key.startswith("_") and key in self.__dict__)
        ):
            return getattr(self, key)
        raise ConfigKeyError(key)

    def __contains__(self, key: object) -> bool:
        return key in self._field_names()

    def __iter__(self):
        return iter(self._field_names())

    def __len__(self) -> int:
        return len(self._field_names())

    def get(self, key: str, default: Any = None) -> Any:
        """``dict.get``: the field's (or property's) value, or ``default`` when there is no such key."""
        try:
            return self[key]
        except KeyError:
            return default

    @classmethod
    def _field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """A plain nested ``dict`` copy (nested configs become dicts too)."""
        return dataclasses.asdict(self)


def _is_dictconfig(obj: Any) -> bool:
    try:
        from omegaconf import DictConfig
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        return False
    return isinstance(obj, DictConfig)


def _to_container(obj: Any) -> Any:
    """DictConfig/ListConfig → plain containers with interpolations resolved; anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover
        return obj
    if isinstance(obj, DictConfig | ListConfig):
        return OmegaConf.to_container(obj, resolve=True)
    return obj


def _locate(path: str) -> type:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"_target_ {path!r} must be a dotted path 'package.module.ClassName'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"_target_ {path!r} cannot be imported: {e}") from e


def _build(tp: Any, value: Any, path: str) -> Any:
    """Convert ``value`` to the annotated type ``tp``, recursing into dataclasses; ``path`` names it in errors."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in typing.get_args(tp) if a is not type(None)]
        dataclass_args = [a for a in non_none if dataclasses.is_dataclass(a)]
        if dataclass_args and isinstance(value, collections.abc.Mapping):
            return _build(dataclass_args[0], value, path)
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, collections.abc.Mapping):
            raise TypeError(f"config key {path or '<root>'!r} must be a mapping for {tp.__name__}, got {value!r}")
        return _build_dataclass(tp, value, path)
    return value


def _build_dataclass(cls: type[T], values: collections.abc.Mapping, path: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in values if k not in fields and k != "_target_")
    if unknown:
        where = f" under {path!r}" if path else ""
        raise ValueError(f"unknown config key(s) {unknown}{where} for {cls.__name__}; valid keys: {sorted(fields)}")
    kwargs = {}
    for name, value in values.items():
        if name == "_target_":
            continue
        kwargs[name] = _build(hints.get(name, Any), value, f"{path}.{name}" if path else name)
    return cls(**kwargs)


def omega_conf_to_dataclass(config: Any, dataclass_type: type[T] | None = None) -> T | Any:
    """Build a config dataclass from a ``DictConfig`` (or a plain mapping).

    Args:
        config: a ``DictConfig``/mapping, or an already-built dataclass instance (returned unchanged).
        dataclass_type: the dataclass to build. When ``None``, the class named by the mapping's ``_target_`` key is
            used; a ``_target_`` that is not a dataclass is built with ``hydra.utils.instantiate`` (as veRL does).

    Returns:
        An instance of the dataclass. Nested mappings become nested dataclasses where the field is annotated with
        one. Unknown keys raise ``ValueError`` naming the key and the valid keys.
    """
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return config
    values = _to_container(config) if _is_dictconfig(config) else dict(config)
    if dataclass_type is None:
        target = values.get("_target_")
        if not target:
            raise ValueError("omega_conf_to_dataclass needs a dataclass_type or a '_target_' key in the config")
        dataclass_type = _locate(target)
        if not dataclasses.is_dataclass(dataclass_type):  # any other class: build it the way veRL does, with hydra
            from hydra.utils import instantiate

            return instantiate(values, _convert_="partial")
    elif str(values.get("_target_") or "").rpartition(".")[0]:
        # a subclass of the requested config (a recipe's, as SPPO's SPPOActorConfig with its own keys; or verl's
        # Megatron role configs, McoreActorConfig with its megatron block): built as itself
        own = _locate(str(values["_target_"]))
        if isinstance(own, type) and issubclass(own, dataclass_type) and dataclasses.is_dataclass(own):
            dataclass_type = own
    if not dataclasses.is_dataclass(dataclass_type):
        raise TypeError(f"{dataclass_type!r} is not a dataclass")
    return _build_dataclass(dataclass_type, values, "")
