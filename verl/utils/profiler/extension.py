"""`DistProfilerExtension`: a worker mixin exposing ``start_profile`` / ``stop_profile`` to the driver."""

from __future__ import annotations

from typing import Any

from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.profiler.profile import DistProfiler

__all__ = ["DistProfilerExtension"]


class DistProfilerExtension:
    """Mixin for a `Worker` holding a `DistProfiler` as ``self.profiler``; the driver calls
    ``worker_group.start_profile(profile_step=N)`` and ``worker_group.stop_profile()`` on every rank."""

    def __init__(self, profiler: DistProfiler) -> None:
        self.profiler = profiler

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, **kwargs: Any) -> None:
        """Start profiling this rank for the current step."""
        self.profiler.start(**kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> str | None:
        """Stop profiling this rank; the trace path where one was written."""
        return self.profiler.stop()
