"""veRL's older import path ``verl.utils.debug`` for the profiler's names (they live in :mod:`verl.utils.profiler`).

``DistProfilerExtension`` is looked up on first use, as :mod:`verl.utils.profiler` does, so importing this package
imports neither the single controller nor torch.
"""

from typing import Any

from verl.utils import profiler
from verl.utils.profiler import (
    DistProfiler,
    GPUMemoryLogger,
    ProfilerConfig,
    log_gpu_memory_usage,
    mark_annotate,
    mark_end_range,
    mark_start_range,
    marked_timer,
    simple_timer,
)

__all__ = [
    "DistProfiler",
    "DistProfilerExtension",
    "GPUMemoryLogger",
    "ProfilerConfig",
    "log_gpu_memory_usage",
    "mark_annotate",
    "mark_end_range",
    "mark_start_range",
    "marked_timer",
    "simple_timer",
]


def __getattr__(name: str) -> Any:
    if name == "DistProfilerExtension":
        return profiler.DistProfilerExtension
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
