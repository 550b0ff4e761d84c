"""Logical-CPU accounting for Ray start-up."""

from __future__ import annotations

import os

import pytest

from verl.utils.ray_utils import init_ray_for_workers, required_logical_cpus


def test_required_logical_cpus_covers_every_worker_bundle():
    cores = os.cpu_count() or 1
    assert required_logical_cpus(0) == max(cores, 1)
    assert required_logical_cpus(cores + 5) == cores + 6  # one bundle per worker + one spare
    assert required_logical_cpus(cores + 5, reserve=0) == cores + 5
    with pytest.raises(ValueError, match="non-negative"):
        required_logical_cpus(-1)


def test_init_ray_for_workers_reuses_a_running_cluster(ray_cluster, caplog):
    before = ray_cluster.cluster_resources()["CPU"]
    init_ray_for_workers(2)  # already running: nothing restarts
    assert ray_cluster.cluster_resources()["CPU"] == before
    with caplog.at_level("WARNING"):
        init_ray_for_workers(int(before) + 1)
    assert "need one each" in caplog.text


def test_auto_await_serves_sync_and_async_callers():
    import asyncio
    import threading

    from verl.utils.ray_utils import auto_await

    threads = []

    @auto_await
    async def double(x: int) -> int:
        threads.append(threading.current_thread().name)
        await asyncio.sleep(0)
        return 2 * x

    assert double(3) == 6  # no event loop running: run to completion

    async def awaited() -> int:
        pending = double(4)
        assert asyncio.iscoroutine(pending)  # a coroutine's call returns the coroutine, to be awaited
        return await pending

    assert asyncio.run(awaited()) == 8
    sync_results = []

    async def from_a_loop_callback() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def callback() -> None:  # sync code on the loop's own thread: blocking this loop would deadlock
            sync_results.append(double(5))
            done.set_result(None)

        loop.call_soon(callback)
        await done

    asyncio.run(from_a_loop_callback())
    assert sync_results == [10] and threads[-1] != threading.main_thread().name  # run in a helper thread

    @auto_await
    def plain(x: int) -> int:
        return x + 1

    assert plain(1) == 2  # not a coroutine function: passed through
