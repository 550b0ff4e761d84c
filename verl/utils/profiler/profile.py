"""`DistProfiler`: a role's profiler, chosen by ``profiler.tool``, recording only on the configured ranks.

A worker builds ``self.profiler = DistProfiler(rank, ProfilerConfig(...), role="actor")`` and the trainer calls
``start(profile_step=N)`` / ``stop()`` around the profiled steps (through `DistProfilerExtension`). ``tool: torch``
writes one Chrome trace per step with `TorchProfiler`; the other veRL tools (nsys, npu, torch_memory) are not
available here and do nothing, with a warning.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from verl.utils.profiler.config import ProfilerConfig, TorchProfilerToolConfig

__all__ = ["DistProfiler", "mark_annotate", "mark_end_range", "mark_start_range"]

logger = logging.getLogger(__name__)


def mark_start_range(
    message: str | None = None, color: str | None = None, domain: str | None = None, category: str | None = None
) -> None:
    """veRL's NVTX range start; a no-op here (no NVTX)."""
    return None


def mark_end_range(range_id: Any) -> None:
    """veRL's NVTX range end; a no-op here."""
    return None


def mark_annotate(
    message: str | None = None, color: str | None = None, domain: str | None = None, category: str | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """veRL's NVTX function annotation; returns the function unchanged here."""
    return lambda func: func


def _torch_tool_config(tool_config: Any) -> TorchProfilerToolConfig:
    """The torch tool's options from a `TorchProfilerToolConfig`, a mapping of its fields, or veRL's
    ``{"torch": {...}, "nsys": {...}}`` per-tool mapping."""
    if isinstance(tool_config, TorchProfilerToolConfig):
        return tool_config
    if tool_config is None:
        return TorchProfilerToolConfig()
    if isinstance(tool_config, Mapping):
        if "torch" in tool_config:
            return _torch_tool_config(tool_config["torch"])
        return TorchProfilerToolConfig(**{k: v for k, v in tool_config.items() if k in ("contents", "discrete")})
    contents = getattr(tool_config, "contents", None)
    return TorchProfilerToolConfig(contents=list(contents or []), discrete=bool(getattr(tool_config, "discrete", 0)))


class DistProfiler:
    """Dispatches ``start`` / ``stop`` to the profiler of ``config.tool`` on the ranks ``config`` selects.

    Args:
        rank: this worker's global rank.
        config: the role's `ProfilerConfig` (None or ``enable: false``: nothing is recorded).
        tool_config: the tool's options (default ``config.tool_config``).
        role: names the trace files (keyword, default ``"worker"``); ``save_path`` overrides ``config.save_path``.
    """

    def __init__(self, rank: int, config: ProfilerConfig | None = None, tool_config: Any = None, **kwargs: Any):
        config = config or ProfilerConfig()
        self.config = config
        self.rank = rank
        self._enable = bool(config.enable and config.tool)
        self._this_rank = config.profiles_rank(rank)
        self._this_step = False
        self._impl: Any = None
        tool_config = config.tool_config if tool_config is None else tool_config
        self._discrete = bool(getattr(tool_config, "discrete", False)) if tool_config is not None else False
        if not self._enable:
            return
        if config.tool == "torch":
            from verl.utils.profiler.torch_profile import TorchProfiler

            torch_cfg = _torch_tool_config(tool_config)
            save_path = kwargs.get("save_path") or config.save_path or "outputs/profile"
            self._impl = TorchProfiler(
                save_path, role=kwargs.get("role") or "worker", rank=rank, contents=torch_cfg.contents
            )
        else:
            logger.warning("profiler.tool=%r is not available in this verl; nothing will be recorded", config.tool)

    def check_enable(self) -> bool:
        """Whether profiling is on for this role."""
        return self._enable

    def check_this_rank(self) -> bool:
        """Whether this rank is profiled."""
        return self._this_rank

    def check_this_step(self) -> bool:
        """Whether a profiled step is in progress."""
        return self._this_step

    def is_discrete_mode(self) -> bool:
        """veRL's ``discrete`` flag of the tool config."""
        return self._discrete

    def start(self, **kwargs: Any) -> None:
        """Begin a profiled step (``profile_step=N`` or ``step=N`` names the trace; default 0)."""
        self._this_step = True
        if self._impl is not None and self._this_rank:
            step = kwargs.get("profile_step", kwargs.get("step"))
            self._impl.start(step=0 if step is None else int(step))

    def stop(self) -> str | None:
        """End the profiled step; returns the trace path when one was written on this rank."""
        self._this_step = False
        if self._impl is not None and self._this_rank:
            return self._impl.stop()
        return None

    @classmethod
    def annotate(
        cls,
        message: str | None = None,
        color: str | None = None,
        domain: str | None = None,
        category: str | None = None,
        **kwargs_outer: Any,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator for a worker method: while its ``self.profiler`` records, the call is a named range
        (``message`` or the method name) in the trace."""

        def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(func)
            def wrapper(self_instance: Any, *args: Any, **kwargs: Any) -> Any:
                profiler = getattr(self_instance, "profiler", None)
                recording = (
                    isinstance(profiler, DistProfiler)
                    and profiler._impl is not None
                    and profiler.check_this_step()
                    and profiler.check_this_rank()
                )
                if not recording:
                    return func(self_instance, *args, **kwargs)
                import torch

                with torch.profiler.record_function(message or func.__name__):
                    return func(self_instance, *args, **kwargs)

            return wrapper

        return decorator
