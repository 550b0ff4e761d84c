"""veRL's ``verl.utils.rollout_trace`` names, so agent loops written for veRL import and run.

Rollout tracing itself is not implemented here: `RolloutTraceConfig.init` accepts ``backend=None`` (tracing off,
veRL's default) and refuses a backend by name (``rollout.trace.backend``), so a run never believes it is traced
when it is not. With tracing off, `rollout_trace_op` calls the decorated method unchanged (as veRL does without a
backend) and `rollout_trace_attr` only scopes whether tracing is enabled.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, ClassVar

_trace_enabled: ContextVar[bool] = ContextVar("_trace_enabled", default=True)


class RolloutTraceConfig:
    """The process's rollout-trace settings (one per process, as veRL's singleton)."""

    _instance: ClassVar[RolloutTraceConfig | None] = None
    backend: str | None = None
    client: object | None = None
    token2text: bool = False
    project_name: str | None = None
    experiment_name: str | None = None
    max_samples_per_step_per_worker: int | None = None
    _initialized: bool = False

    @classmethod
    def get_instance(cls) -> RolloutTraceConfig:
        """The process's settings."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    @classmethod
    def init(
        cls,
        project_name: str,
        experiment_name: str,
        backend: str | None,
        token2text: bool = False,
        max_samples_per_step_per_worker: int | None = None,
    ) -> None:
        """Set the settings once per process; a backend (``weave``, ``mlflow``) raises ``NotImplementedError``."""
        config = cls.get_instance()
        if config._initialized:
            return
        if backend is not None:
            raise NotImplementedError(
                f"rollout.trace.backend={backend!r}: rollout tracing is not implemented in this library (leave it null)"
            )
        config.project_name, config.experiment_name = project_name, experiment_name
        config.token2text = token2text
        config.max_samples_per_step_per_worker = max_samples_per_step_per_worker
        config._initialized = True

    @classmethod
    def get_backend(cls) -> str | None:
        """The tracing backend (always None here)."""
        return cls.get_instance().backend

    @classmethod
    def get_client(cls) -> object | None:
        """The backend's client (always None here)."""
        return cls.get_instance().client

    @classmethod
    def enable_token2text(cls) -> bool:
        """Whether traces would decode token ids."""
        return cls.get_instance().token2text

    @classmethod
    def reset(cls) -> None:
        """Forget the settings (tests)."""
        cls._instance = None


@contextlib.contextmanager
def rollout_trace_attr(
    sample_index: Any = None,
    step: int | None = None,
    rollout_n: int | None = None,
    name: str = "rollout_trace",
    validate: bool = False,
    trace: bool = True,
) -> Iterator[None]:
    """Scope the attributes of a traced sample; ``trace=False`` turns tracing off inside the block."""
    token = _trace_enabled.set(trace)
    try:
        yield
    finally:
        _trace_enabled.reset(token)


def rollout_trace_op(func: Callable) -> Callable:
    """Mark a method (sync or async) as a traced operation; without a backend it runs unchanged."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await func(*args, **kwargs)

        return async_wrapper

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper
