"""Metric sinks behind one small interface, chosen by ``trainer.logger`` (veRL's ``Tracking``).

Backends: ``console`` (one ``step:N - key:value - ...`` line per step through ``logging``) and ``file`` (veRL's
jsonl: ``$VERL_FILE_LOGGER_PATH`` or ``<project>/<experiment>.jsonl``, one ``{"step", "data"}`` line per step).
Others (tensorboard, wandb, mlflow) register the same way; a backend that is not available fails at start-up with
a message naming the extra to install. The resolved config is logged at step 0.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Tracking", "register_tracker"]

logger = logging.getLogger(__name__)

_BACKENDS: dict[str, Callable[..., Any]] = {}
# Backends veRL knows but this version does not ship yet, with the extra that will bring them.
_NOT_YET = {
    "tensorboard": "trackers",
    "wandb": "trackers",
    "mlflow": "trackers",
    "swanlab": "trackers",
    "clearml": "trackers",
    "trackio": "trackers",
    "vemlp_wandb": "trackers",
    "tracking": "trackers",
}


def register_tracker(name: str) -> Callable:
    """Register a backend class: ``cls(project_name, experiment_name, config)`` with ``log(data, step)`` and
    ``finish()``."""

    def decorator(cls: Callable) -> Callable:
        if name in _BACKENDS and _BACKENDS[name] is not cls:
            raise ValueError(f"tracker {name!r} is already registered")
        _BACKENDS[name] = cls
        return cls

    return decorator


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


@register_tracker("console")
class ConsoleLogger:
    """``step:N - key:value - ...`` through the ``verl.console`` logger (stdout at INFO by default)."""

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        self.log_ = logging.getLogger("verl.console")
        if not self.log_.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.log_.addHandler(handler)
            self.log_.setLevel(logging.INFO)
            self.log_.propagate = False

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.log_.info("step:%d - %s", step, " - ".join(f"{k}:{_fmt(v)}" for k, v in sorted(data.items())))

    def finish(self) -> None:
        pass


@register_tracker("file")
class FileLogger:
    """veRL's jsonl file: one ``{"step": N, "data": {...}}`` line per step."""

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        path = os.environ.get("VERL_FILE_LOGGER_PATH") or os.path.join(project_name, f"{experiment_name}.jsonl")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in finish()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in data.items()}
        self._file.write(json.dumps({"step": step, "data": clean}) + "\n")
        self._file.flush()

    def finish(self) -> None:
        self._file.close()


class Tracking:
    """Fan metrics out to the backends named in ``default_backend`` (a name or a list of names)."""

    supported_backend = ["console", "file", *_NOT_YET]

    def __init__(
        self, project_name: str, experiment_name: str, default_backend: str | list[str] = "console", config: Any = None
    ) -> None:
        names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        self.loggers = {}
        for name in names:
            if name in _BACKENDS:
                self.loggers[name] = _BACKENDS[name](project_name, experiment_name, config)
            elif name in _NOT_YET:
                raise ValueError(
                    f"trainer.logger backend {name!r} is not available in this version of verl (it will come with "
                    f"the {_NOT_YET[name]!r} extra); use console and/or file"
                )
            else:
                raise ValueError(f"unknown trainer.logger backend {name!r}; available: {sorted(_BACKENDS)}")
        if config is not None:
            logger.info("resolved config: %s", config)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for backend in self.loggers.values():
            backend.log(data, step)

    def finish(self) -> None:
        for backend in self.loggers.values():
            backend.finish()
