"""Stage timers and device-memory logging (``verl.utils.profiler``).

``marked_timer(name, timing_raw)`` adds the seconds spent in a block to ``timing_raw[name]`` (accumulating over
repeated blocks of the same name). It is a context manager, and also has ``start()`` / ``stop()`` for a span that
does not fit one ``with`` block.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "GPUMemoryLogger",
    "StageTimer",
    "gather_timing",
    "log_gpu_memory_usage",
    "marked_timer",
    "reduce_timing",
    "simple_timer",
]

_LOGGER = logging.getLogger(__name__)  # the default; the functions below take a `logger` argument

_UNITS = {"GB": 1024**3, "MB": 1024**2, "KB": 1024}


class StageTimer:
    """Adds the seconds between ``start()`` and ``stop()`` (or of a ``with`` block) to ``timing_raw[name]``.

    ``last`` holds the seconds of the latest span. Reusable: each span adds to the same entry.
    """

    def __init__(self, name: str, timing_raw: dict[str, float]) -> None:
        if not isinstance(timing_raw, dict):
            raise TypeError(f"timing_raw must be a dict of name -> seconds, got {type(timing_raw).__name__}")
        self.name = name
        self.timing_raw = timing_raw
        self.last = 0.0
        self._started: float | None = None

    def start(self) -> StageTimer:
        """Start a span; starting one that is running raises RuntimeError."""
        if self._started is not None:
            raise RuntimeError(f"timer {self.name!r} is already running")
        self._started = time.perf_counter()
        return self

    def stop(self) -> float:
        """End the span, add its seconds to ``timing_raw[name]`` and return them."""
        if self._started is None:
            raise RuntimeError(f"timer {self.name!r} was stopped without being started")
        self.last = time.perf_counter() - self._started
        self._started = None
        self.timing_raw[self.name] = self.timing_raw.get(self.name, 0.0) + self.last
        return self.last

    def __enter__(self) -> StageTimer:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def simple_timer(name: str, timing_raw: dict[str, float]) -> StageTimer:
    """A `StageTimer` accumulating into ``timing_raw[name]`` (use as ``with simple_timer("gen", timing_raw):``)."""
    return StageTimer(name, timing_raw)


def marked_timer(
    name: str,
    timing_raw: dict[str, float],
    color: str | None = None,
    domain: str | None = None,
    category: str | None = None,
    **kwargs: Any,
) -> StageTimer:
    """Like :func:`simple_timer`; ``color`` / ``domain`` / ``category`` are veRL's NVTX-marker options, accepted and
    unused (no NVTX ranges are emitted here)."""
    return StageTimer(name, timing_raw)


def _memory_info(unit: str = "GB", precision: int = 2) -> tuple[str, str, str, str]:
    """(allocated, reserved, used, total) device memory as strings in ``unit``; zeros without an accelerator."""
    import torch  # here, not at the top: the timers are imported by processes that never load torch

    if unit not in _UNITS:
        raise ValueError(f"unit={unit!r}; use one of {list(_UNITS)}")
    if not torch.cuda.is_available():
        return ("0.00",) * 4  # type: ignore[return-value]
    div = _UNITS[unit]
    free, total = torch.cuda.mem_get_info()
    values = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), total - free, total)
    return tuple(f"{v / div:.{precision}f}" for v in values)  # type: ignore[return-value]


def _memory_message(head: str) -> str:
    allocated, reserved, used, total = _memory_info()
    return (
        f"{head}, memory allocated (GB): {allocated}, memory reserved (GB): {reserved}, "
        f"device memory used/total (GB): {used}/{total}"
    )


def _this_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def log_gpu_memory_usage(
    head: str, logger: logging.Logger | None = None, level: int = logging.DEBUG, rank: int | None = 0
) -> None:
    """Log device memory (allocated / reserved / used / total) under ``head`` on rank ``rank`` (None: every
    rank), to ``logger`` (default: this module's)."""
    if rank is None or _this_rank() == rank:
        (logger or _LOGGER).log(level, _memory_message(head))


class GPUMemoryLogger:
    """Decorator logging device memory before and after each call of the decorated function.

    Example::

        @GPUMemoryLogger(role="actor", logger=logger)
        def update_actor(self, batch): ...
    """

    def __init__(
        self, role: str, logger: logging.Logger | None = None, level: int = logging.DEBUG, log_only_rank_0: bool = True
    ) -> None:
        self.role = role
        self.logger = logger or _LOGGER
        self.level = level
        self.log_only_rank_0 = log_only_rank_0

    def __call__(self, decorated_function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(decorated_function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return self.log(decorated_function, *args, **kwargs)

        return wrapper

    def log(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``func`` between two memory log lines (only on rank 0 with ``log_only_rank_0``)."""
        enabled = self.logger.isEnabledFor(self.level) and (not self.log_only_rank_0 or _this_rank() == 0)
        if enabled:
            self.logger.log(self.level, _memory_message(f"[{self.role}] Before {func.__name__}"))
        output = func(*args, **kwargs)
        if enabled:
            self.logger.log(self.level, _memory_message(f"[{self.role}] After {func.__name__}"))
        return output


def reduce_timing(timing_raw: dict[str, float], reduce_op: Any = None) -> dict[str, float]:
    """All-reduce (default: average) each timing over the process group; unchanged outside torch.distributed."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or not timing_raw:
        return timing_raw
    keys = sorted(timing_raw)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    values = torch.tensor([timing_raw[k] for k in keys], dtype=torch.float64, device=device)
    if reduce_op is None:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        values /= dist.get_world_size()
    else:
        dist.all_reduce(values, op=reduce_op)
    return dict(zip(keys, values.cpu().tolist()))


def gather_timing(timing_raw: dict[str, float]) -> dict[str, list[float]]:
    """Each timing as the list of every rank's value (``[value]`` outside torch.distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return {k: [v] for k, v in timing_raw.items()}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, dict(timing_raw))
    return {k: [rank_timing.get(k, 0.0) for rank_timing in gathered] for k in timing_raw}
