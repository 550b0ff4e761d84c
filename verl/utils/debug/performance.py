"""veRL's ``verl.utils.debug.performance``: the timers of :mod:`verl.utils.profiler.performance`."""

from verl.utils.profiler.performance import GPUMemoryLogger, log_gpu_memory_usage, reduce_timing, simple_timer

__all__ = ["GPUMemoryLogger", "log_gpu_memory_usage", "reduce_timing", "simple_timer"]
