"""The tracker registry, the shared value/config helpers, the ``console`` and ``file`` backends and ``Tracking``.

See the package docstring (:mod:`verl.utils.tracking`) for what each backend writes.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "ConsoleLogger",
    "FileLogger",
    "Tracking",
    "available_backends",
    "config_text",
    "console_logger",
    "file_logger_path",
    "flatten_config",
    "live_backend",
    "normalize_metrics",
    "plain_config",
    "register_tracker",
    "require_package",
    "to_scalar",
]

logger = logging.getLogger(__name__)

CONFIG_KEY = "trainer.logger"
TRACKERS_EXTRA = "pip install 'verl[trackers]'"

_BACKENDS: dict[str, Callable[..., Any]] = {}
# Names veRL accepts for a backend shipped here under another name (deprecated there too).
_ALIASES = {"tracking": "wandb"}
# Backends veRL knows that this library does not ship.
_NOT_SHIPPED = ("swanlab", "clearml", "vemlp_wandb")
# The most recently opened instance of each backend, while it is open (for ValidationGenerationsLogger).
_LIVE: dict[str, Any] = {}


def register_tracker(name: str) -> Callable:
    """Register a backend class under ``name``: ``cls(project_name, experiment_name, config)`` with
    ``log(data, step)`` and ``finish()``. An optional class attribute ``requires`` lists the
    ``(module, pip package)`` pairs it imports; they are checked before any backend is opened."""

    def decorator(cls: Callable) -> Callable:
        if name in _BACKENDS and _BACKENDS[name] is not cls:
            raise ValueError(f"tracker {name!r} is already registered")
        _BACKENDS[name] = cls
        if name not in Tracking.supported_backend:
            Tracking.supported_backend.append(name)
        return cls

    return decorator


def available_backends() -> list[str]:
    """The backend names ``trainer.logger`` accepts (sorted; aliases excluded)."""
    return sorted(_BACKENDS)


def require_package(backend: str, module: str, package: str | None = None, extra: str = TRACKERS_EXTRA) -> Any:
    """Import ``module`` for ``backend``; when it is missing raise an ImportError naming the package and the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{CONFIG_KEY} backend {backend!r} needs the {package or module!r} package, which is not installed: {extra}"
        ) from err


def live_backend(name: str) -> Any | None:
    """The open instance of backend ``name`` (the latest one opened), or None."""
    return _LIVE.get(name)


# --------------------------------------------------------------------------------------------- values and config
def to_scalar(value: Any) -> Any:
    """numpy scalars and 0-d arrays/tensors → ``float`` (``bool`` stays ``bool``); anything else is returned as is."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if hasattr(value, "item") and tuple(getattr(value, "shape", (1,))) == ():
        item = value.item()
        return item if isinstance(item, bool) else float(item) if isinstance(item, (int, float)) else item
    return value


def is_number(value: Any) -> bool:
    """True for int/float values (bools excluded) that trackers can plot."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def normalize_metrics(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with string keys and scalar-like values converted by :func:`to_scalar`."""
    return {str(key): to_scalar(value) for key, value in data.items()}


def plain_config(config: Any) -> Any:
    """``config`` as plain dicts/lists (an OmegaConf config is resolved; a dataclass becomes a dict)."""
    if config is None or isinstance(config, (dict, list, str, int, float, bool)):
        return config
    if type(config).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(config, resolve=True)
    import dataclasses

    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    return config


def config_text(config: Any) -> str:
    """A readable YAML rendering of ``config`` (JSON when it is not YAML-serialisable)."""
    try:
        import yaml

        return yaml.safe_dump(config, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip()
    except Exception:  # noqa: BLE001 - any value YAML refuses falls back to JSON with str()
        return json.dumps(config, indent=2, default=str)


def flatten_config(config: Any, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """Nested dicts flattened to ``{"a.b.c": leaf}``; lists and other leaves are kept whole."""
    if not isinstance(config, Mapping):
        return {prefix or "config": config}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, name, sep))
        else:
            flat[name] = value
    return flat


def file_logger_path(project_name: str, experiment_name: str) -> str:
    """The ``file`` backend's jsonl path: ``$VERL_FILE_LOGGER_PATH`` or ``<project>/<experiment>.jsonl``."""
    return os.environ.get("VERL_FILE_LOGGER_PATH") or os.path.join(project_name, f"{experiment_name}.jsonl")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def console_logger() -> logging.Logger:
    """The ``verl.console`` logger: at INFO unless a level was set, with its own stderr handler (and not
    propagating) unless a handler was attached."""
    log = logging.getLogger("verl.console")
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.propagate = False
    return log


# --------------------------------------------------------------------------------------------- built-in backends
class ConsoleLogger:
    """``step:N - key:value - ...`` through the ``verl.console`` logger; the resolved config once, as YAML."""

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        self.log_ = console_logger()
        if config is not None:
            self.log_.info("resolved config (%s/%s):\n%s", project_name, experiment_name, config_text(config))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.log_.info("step:%d - %s", step, " - ".join(f"{k}:{_fmt(v)}" for k, v in sorted(data.items())))

    def finish(self) -> None:
        pass


class FileLogger:
    """veRL's jsonl: one ``{"step": N, "data": {...}}`` line per step, after a ``{"step": 0, "data": {},
    "config": {...}}`` line with the resolved config."""

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        self.path = file_logger_path(project_name, experiment_name)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in finish()
        if config is not None:
            self._write({"step": 0, "data": {}, "config": config})
        logger.info("file logger: writing to %s", os.path.abspath(self.path))

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self._write({"step": step, "data": {k: _json_safe(v) for k, v in data.items()}})

    def finish(self) -> None:
        if not self._file.closed:
            self._file.close()


# --------------------------------------------------------------------------------------------- the fan-out
class Tracking:
    """Fan metrics out to the backends named in ``default_backend`` (a name or a list of names; ``trainer.logger``).

    Every name is checked, and every needed package imported, before any backend is opened, so a typo or a
    missing extra fails at start-up.
    """

    supported_backend: list[str] = []

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: str | Iterable[str] = "console",
        config: Any = None,
    ) -> None:
        names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        resolved = _resolve_names(names)
        for name in resolved:
            for module, package in getattr(_BACKENDS[name], "requires", ()):
                require_package(name, module, package)
        config = plain_config(config)
        self.loggers: dict[str, Any] = {}
        self.logger = self.loggers  # veRL's attribute name
        try:
            for name in resolved:
                backend = _BACKENDS[name](project_name, experiment_name, config)
                self.loggers[name] = backend
                _LIVE[name] = backend
        except BaseException:
            self.finish()
            raise

    def log(self, data: Mapping[str, Any], step: int, backend: str | Iterable[str] | None = None) -> None:
        """Log ``data`` at ``step`` to every backend (or only to those named in ``backend``)."""
        wanted = None if backend is None else {backend} if isinstance(backend, str) else set(backend)
        clean = normalize_metrics(data)
        for name, sink in self.loggers.items():
            if wanted is None or name in wanted:
                sink.log(clean, step)

    def finish(self, exit_code: int | None = None) -> None:
        """Close every backend once (later calls do nothing); ``exit_code`` (non-zero: the run failed) goes to the
        backends that record it (wandb's run exit code, mlflow's run status). A backend that fails to close is
        logged, not raised."""
        if getattr(self, "_finished", False):
            return
        self._finished = True
        for name, sink in list(self.logger.items()):
            try:
                if exit_code is not None and _accepts(sink.finish, exit_code=exit_code):
                    sink.finish(exit_code=exit_code)
                else:
                    sink.finish()
            except Exception:  # noqa: BLE001 - one broken sink must not keep the others open
                logger.exception("closing the %r tracker failed", name)
            if _LIVE.get(name) is sink:
                del _LIVE[name]


def _accepts(fn: Callable, **kwargs: Any) -> bool:
    """Whether ``fn`` takes these keyword arguments (by name or through ``**kwargs``)."""
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError:
        return False
    return True


def _resolve_names(names: list[str]) -> list[str]:
    """Map aliases, reject unknown or unshipped names; the order is kept and duplicates dropped."""
    available = ", ".join(available_backends())
    resolved: list[str] = []
    for name in names:
        if name in _ALIASES:
            import warnings

            target = _ALIASES[name]
            warnings.warn(
                f"{CONFIG_KEY} backend {name!r} is deprecated, use {target!r}", DeprecationWarning, stacklevel=3
            )
            logger.warning("%s backend %r is deprecated, using %r", CONFIG_KEY, name, target)
            name = target
        if name in _BACKENDS:
            if name not in resolved:
                resolved.append(name)
        elif name in _NOT_SHIPPED:
            raise ValueError(f"{CONFIG_KEY} backend {name!r} is not supported by this verl; available: {available}")
        else:
            raise ValueError(f"unknown {CONFIG_KEY} backend {name!r}; available: {available}")
    return resolved


register_tracker("console")(ConsoleLogger)
register_tracker("file")(FileLogger)
