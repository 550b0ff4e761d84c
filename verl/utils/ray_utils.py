"""Starting Ray with enough logical CPUs for the workers a job places.

Placement-group bundles are ``{"CPU": 1}`` per worker process. A small machine (2 cores) that runs, say, four
workers therefore needs Ray started with at least four logical CPUs; logical CPUs are a scheduling budget, not
cores, so asking for more than the machine has is fine for workers that mostly wait on each other.
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["init_ray_for_workers", "required_logical_cpus"]

logger = logging.getLogger(__name__)


def required_logical_cpus(num_workers: int, reserve: int = 1) -> int:
    """Logical CPUs to start Ray with for ``num_workers`` worker processes: one bundle each, ``reserve`` spare
    (driver-side tasks), and never fewer than the machine's cores."""
    if num_workers < 0 or reserve < 0:
        raise ValueError(f"num_workers and reserve must be non-negative, got {num_workers}, {reserve}")
    return max(os.cpu_count() or 1, num_workers + reserve)


def init_ray_for_workers(num_workers: int, **ray_init_kwargs: Any) -> None:
    """``ray.init`` with ``num_cpus`` large enough for ``num_workers`` bundles (unless given), once.

    When Ray is already running, only checks that the cluster has enough CPUs and logs a warning otherwise
    (placement will then fail with a message naming the shortfall).
    """
    import ray

    needed = required_logical_cpus(num_workers)
    if ray.is_initialized():
        have = ray.cluster_resources().get("CPU", 0)
        if have < num_workers:
            logger.warning(
                "the Ray cluster has %s logical CPUs but %d worker processes need one each", have, num_workers
            )
        return
    ray_init_kwargs.setdefault("num_cpus", needed)
    ray_init_kwargs.setdefault("include_dashboard", False)
    ray.init(**ray_init_kwargs)
