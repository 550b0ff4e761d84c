"""Timers and profilers at veRL's import path (``verl.utils.profiler``).

``marked_timer`` / ``simple_timer`` time stages into a ``timing_raw`` dict; `TorchProfiler` records a Chrome trace
per profiled step; `DistProfiler` picks a profiler from a role's `ProfilerConfig`. `DistProfilerExtension` (a worker
mixin) and `TorchProfiler` are imported on first use, so importing this package imports neither the single
controller nor torch.
"""

from verl.utils.profiler.config import ProfilerConfig, TorchProfilerToolConfig
from verl.utils.profiler.performance import (
    GPUMemoryLogger,
    StageTimer,
    gather_timing,
    log_gpu_memory_usage,
    marked_timer,
    reduce_timing,
    simple_timer,
)
from verl.utils.profiler.profile import DistProfiler, mark_annotate, mark_end_range, mark_start_range

__all__ = [
    "DistProfiler",
    "DistProfilerExtension",
    "GPUMemoryLogger",
    "ProfilerConfig",
    "StageTimer",
    "TorchProfiler",
    "TorchProfilerToolConfig",
    "gather_timing",
    "log_gpu_memory_usage",
    "mark_annotate",
    "mark_end_range",
    "mark_start_range",
    "marked_timer",
    "reduce_timing",
    "simple_timer",
]


def __getattr__(name: str):
    if name == "DistProfilerExtension":
        from verl.utils.profiler.extension import DistProfilerExtension

        return DistProfilerExtension
    if name == "TorchProfiler":  # loads torch: on first use, as the timers never need it
        from verl.utils.profiler.torch_profile import TorchProfiler

        return TorchProfiler
    raise AttributeError(f"module 'verl.utils.profiler' has no attribute {name!r}")
