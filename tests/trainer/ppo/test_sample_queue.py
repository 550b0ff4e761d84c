"""`SampleQueue`, the staleness-bounded queue between a rollouter and the trainer (separate_async, in the making), with
real threads: a rollouter that reserves, generates (sleeps) and fills, a trainer that takes, trains (sleeps) and
pushes. What is checked: the bound holds for every group trained, the queue never holds more than max_lag + 1
batches, every group drawn is trained exactly once and in order, and the slow side is the one the other waits for."""

from __future__ import annotations

import random
import threading
import time

import pytest

from verl.trainer.ppo.sample_queue import QueueClosed, SampleQueue


def test_a_place_is_granted_only_within_the_bound_and_batches_leave_in_reservation_order():
    queue = SampleQueue(batch_groups=2, max_lag=1)
    places = [queue.reserve() for _ in range(4)]  # weight version 0, trained at versions 0, 0, 1, 1
    with pytest.raises(TimeoutError, match=r"a group of weight version 0 \(async_training.max_lag=1\) waited"):
        queue.reserve(timeout=0.05)  # it would be trained at version 2
    for i in (1, 3, 2, 0):  # finished out of order
        queue.fill(places[i], f"g{i}")
    assert [p.group for p in queue.take()] == ["g0", "g1"]
    queue.on_weights(1)
    with pytest.raises(TimeoutError):  # taking and pushing do not help a group of version 0: 1 + 2 // 2 - 0 > 1
        queue.reserve(timeout=0.05)
    queue.on_rollout_weights(1)
    assert queue.reserve().version == 1  # newer weights in the rollouter do: trained at 2, one version later
    with pytest.raises(ValueError, match="filled already"):
        queue.fill(places[0], "again")
    assert queue.metrics()["fully_async/count/queue_groups"] == 3
    assert queue.metrics()["fully_async/count/queue_ready_groups"] == 2


class CountingCondition(threading.Condition):
    """A condition that counts the threads waiting on it (read under its lock)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting += 1  # the caller holds the lock
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1


def test_close_wakes_the_waiting_sides():
    queue = SampleQueue(batch_groups=1, max_lag=0)
    queue.reserve()
    queue._cv = CountingCondition()
    errors = []

    def wait(call):
        try:
            call()
        except QueueClosed as error:
            errors.append(str(error))

    threads = [
        threading.Thread(target=wait, args=(queue.take,)),
        threading.Thread(target=wait, args=(queue.reserve,)),
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    try:
        while True:  # both blocked in the queue (a take with nothing filled, a reserve beyond the bound)
            with queue._cv:
                if queue._cv.waiting == 2:
                    break
            assert time.monotonic() < deadline, f"{queue._cv.waiting} of 2 threads waiting on the queue after 30 s"
            time.sleep(0.005)
    finally:
        queue.close()
    for thread in threads:
        thread.join(timeout=5)
    assert errors == ["the sample queue was closed"] * 2 and queue._cv.waiting == 0


def run(gen_s: float, train_s: float, max_lag: int, steps: int = 12, batch_groups: int = 3, seed: int = 0) -> dict:
    """A rollouter and a trainer thread over one queue; returns what the trainer saw."""
    rng = random.Random(seed)
    queue = SampleQueue(batch_groups, max_lag)
    seen: dict = {"ids": [], "staleness": [], "longest": 0}
    lock = threading.Lock()

    def rollouter() -> None:
        next_id = 0
        try:
            while True:
                place = queue.reserve()
                seen["longest"] = max(seen["longest"], len(queue))
                time.sleep(gen_s * rng.uniform(0.5, 1.5))
                queue.fill(place, next_id)  # the data loader's order
                next_id += 1
        except QueueClosed:
            return

    thread = threading.Thread(target=rollouter, daemon=True)
    thread.start()
    for step in range(steps):
        batch = queue.take(timeout=30)
        with lock:  # trained with version `step` (one push per step)
            seen["ids"] += [place.group for place in batch]
            seen["staleness"] += [step - place.version for place in batch]
        time.sleep(train_s)
        queue.on_weights(step + 1)
        queue.on_rollout_weights(step + 1)  # the push reaches the rollouter's engines
    queue.close()
    thread.join(timeout=10)
    seen.update(queue.metrics())
    return seen


@pytest.mark.parametrize("max_lag", [0, 1, 2])
def test_a_slow_trainer_makes_the_rollouter_wait_at_the_bound(max_lag):
    seen = run(gen_s=0.002, train_s=0.03, max_lag=max_lag)
    assert seen["ids"] == list(range(36))  # every group once, in the order drawn
    assert seen["staleness"] == fixed_lag(max_lag)  # the bound is reached, never broken
    assert seen["longest"] <= (max_lag + 1) * 3  # at most max_lag + 1 batches queued
    assert seen["timing_s/queue_reserve_wait_total"] > seen["timing_s/queue_take_wait_total"]


def fixed_lag(max_lag: int, steps: int = 12, batch_groups: int = 3) -> list[int]:
    """Each group's staleness at a fixed lag: step j trains groups generated by version max(0, j - max_lag)."""
    return [min(step, max_lag) for step in range(steps) for _ in range(batch_groups)]


def test_a_slow_rollouter_makes_the_trainer_wait_and_the_versions_stay_those_of_the_fixed_lag():
    seen = run(gen_s=0.02, train_s=0.001, max_lag=2)
    assert seen["ids"] == list(range(36))
    assert seen["staleness"] == fixed_lag(2)  # which version generates which group does not depend on speed
    assert seen["timing_s/queue_take_wait_total"] > seen["timing_s/queue_reserve_wait_total"]
