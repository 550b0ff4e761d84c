"""Starting Ray with enough logical CPUs for the workers a job places, and veRL's small Ray helpers.

Placement-group bundles are ``{"CPU": 1}`` per worker process. A small machine (2 cores) that runs, say, four
workers therefore needs Ray started with at least four logical CPUs; logical CPUs are a scheduling budget, not
cores, so asking for more than the machine has is fine for workers that mostly wait on each other.

Ray gives each worker process one compute thread (``OMP_NUM_THREADS`` = its logical CPUs, 1). A job that starts its
own cluster instead splits the machine's cores between the processes that compute at once
(:func:`cpu_threads_per_worker`), unless ``OMP_NUM_THREADS`` is set: one training worker on a 2-core laptop uses
both cores, as a plain ``torch`` script would.

``parallel_put`` puts many objects into the object store from a thread pool; ``ray_noset_visible_devices`` tells
whether Ray was told to leave ``*_VISIBLE_DEVICES`` alone; ``auto_await`` lets one ``async def`` serve sync and
async callers (veRL's decorator of the same name).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from verl.utils.errors import InvalidDataError

__all__ = [
    "auto_await",
    "cpu_threads_per_worker",
    "get_event_loop",
    "init_ray_for_workers",
    "parallel_put",
    "ray_noset_visible_devices",
    "required_logical_cpus",
]

# Ray leaves the matching *_VISIBLE_DEVICES variable alone when one of these is set (one per accelerator kind).
NOSET_VISIBLE_DEVICES_ENV_VARS = (
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_HABANA_VISIBLE_MODULES",
    "RAY_EXPERIMENTAL_NOSET_NEURON_RT_VISIBLE_CORES",
    "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS",
    "RAY_EXPERIMENTAL_NOSET_ONEAPI_DEVICE_SELECTOR",
)

logger = logging.getLogger(__name__)


def required_logical_cpus(num_workers: int, reserve: int = 1) -> int:
    """Logical CPUs to start Ray with for ``num_workers`` worker processes: one bundle each, ``reserve`` spare
    (driver-side tasks), and never fewer than the machine's cores."""
    if num_workers < 0 or reserve < 0:
        raise ValueError(f"num_workers and reserve must be non-negative, got {num_workers}, {reserve}")
    return max(os.cpu_count() or 1, num_workers + reserve)


def cpu_threads_per_worker(num_workers: int) -> int:
    """Compute threads for each of ``num_workers`` processes that compute at once on this machine: its cores split
    evenly, at least one each."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be positive, got {num_workers}")
    return max(1, (os.cpu_count() or 1) // num_workers)


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


def ray_noset_visible_devices(env_vars: Mapping[str, str] | None = None) -> bool:
    """Whether any ``RAY_EXPERIMENTAL_NOSET_*_VISIBLE_*`` variable is set (non-empty) in ``env_vars`` (default:
    ``os.environ``): then Ray does not set the visible-device variable of actors."""
    env = os.environ if env_vars is None else env_vars
    return any(env.get(name) for name in NOSET_VISIBLE_DEVICES_ENV_VARS)


def parallel_put(data_list: Sequence[Any], max_workers: int | None = None) -> list[Any]:
    """``ray.put`` every item of ``data_list`` from a thread pool (default ``min(len, 16)`` threads); returns the
    object refs in the order of ``data_list``. An empty ``data_list`` raises `InvalidDataError`."""
    import ray

    items = list(data_list)
    if not items:
        raise InvalidDataError("parallel_put: data_list is empty")
    if max_workers is None:
        max_workers = min(len(items), 16)
    if max_workers < 1:
        raise ValueError(f"parallel_put: max_workers must be >= 1, got {max_workers}")
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        return list(pool.map(ray.put, items))


def get_event_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop, made and set when it has none (veRL's helper for sync code driving coroutines)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    return loop


def auto_await(func: Any) -> Any:
    """Decorate an ``async def`` so sync and async code can both call it (veRL's ``auto_await``).

    - awaited in a coroutine (the calling frame is a coroutine's): the call returns the coroutine, to be awaited;
    - called where no event loop runs (a plain script, the trainer's thread): the coroutine runs to completion on a
      fresh loop and the call returns its result;
    - called from sync code on a thread whose event loop is running (a callback of that loop): blocking that loop
      on itself would deadlock, so the coroutine runs on a fresh loop in a helper thread and the call returns its
      result.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        if not inspect.iscoroutine(result):
            return result
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(result)
        caller = sys._getframe(1)
        if caller.f_code.co_flags & inspect.CO_COROUTINE:
            return result
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, result).result()

    return wrapper
