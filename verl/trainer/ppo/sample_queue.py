"""The bounded queue between a rollouter that generates all the time and the trainer (``trainer.mode=separate_async``,
in the making): whole GRPO groups in, training batches of ``batch_groups`` groups out, the staleness bound kept.

Versions count weight pushes (the trainer's ``weight_version``): the trainer trains its next batch with version
``V`` and pushes after every batch (a batch taken counts as pushed: the next one is trained after it), so the group
at queue position ``q`` is trained with version ``V + q // batch_groups``. A group generated from version ``v`` (its
oldest token's) may be trained at most ``max_lag`` versions later. The rollouter therefore *reserves* a place
before it generates a group (:meth:`SampleQueue.reserve`, with the version its engines hold:
:meth:`SampleQueue.on_rollout_weights`), which is granted only while ``V + q // batch_groups − v ≤ max_lag`` for
the next place ``q`` (places in flight count); it then fills the place with the finished group
(:meth:`SampleQueue.fill`). Batches leave in reservation order (:meth:`SampleQueue.take` waits for the first
``batch_groups`` places to be filled), so every group is trained at the version its reservation counted on,
whatever order the groups finish in, and the order does not depend on timing. Taking a batch and pushing leave
``V + q // batch_groups`` unchanged: what lets the rollouter reserve again is newer weights (a larger ``v``), so the
queue never holds more than ``max_lag + 1`` batches, and the rollouter waits for the trainer exactly when running
further ahead would break the bound. The trainer waits when the next batch is not complete.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["QueueClosed", "QueuedGroup", "SampleQueue"]

_EMPTY = object()


class QueueClosed(RuntimeError):
    """The queue was closed while a caller waited on it (the run is stopping)."""


@dataclass
class QueuedGroup:
    """One prompt's group of samples (``group``; unset while it generates) and the weight version its place was
    reserved with, the oldest version that may generate its tokens."""

    version: int
    group: Any = _EMPTY

    @property
    def filled(self) -> bool:
        return self.group is not _EMPTY


class SampleQueue:
    """Groups from the rollouter to the trainer under the staleness bound (see the module docstring).

    Args:
        batch_groups: groups per training batch (``data.train_batch_size`` prompts).
        max_lag: the bound, in weight versions (``async_training.max_lag``).
        trainer_version: the version the trainer's next batch trains with (and the rollouter's weights at start).
    """

    def __init__(self, batch_groups: int, max_lag: int, trainer_version: int = 0) -> None:
        if batch_groups < 1 or max_lag < 0:
            raise ValueError(f"SampleQueue: batch_groups={batch_groups} must be >= 1 and max_lag={max_lag} >= 0")
        self.batch_groups, self.max_lag = int(batch_groups), int(max_lag)
        self.trainer_version = self.rollout_version = int(trainer_version)
        self._places: collections.deque[QueuedGroup] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self.reserve_wait_s = self.take_wait_s = 0.0  # time the rollouter / the trainer spent waiting

    def __len__(self) -> int:
        """Places reserved and not taken (generating or ready)."""
        with self._cv:
            return len(self._places)

    def _trained_at(self) -> int:
        """The version the next place reserved would be trained with."""
        return self.trainer_version + len(self._places) // self.batch_groups

    def _wait(self, ready: Any, timeout: float | None, what: str) -> float:
        start = time.perf_counter()
        ok = self._cv.wait_for(lambda: self._closed or ready(), timeout=timeout)
        if self._closed:
            raise QueueClosed("the sample queue was closed")
        if not ok:
            raise TimeoutError(f"{what} waited {timeout} s")
        return time.perf_counter() - start

    def reserve(self, timeout: float | None = None) -> QueuedGroup:
        """A place for a group about to be generated with the rollouter's weights (``rollout_version``), granted
        when that group would be trained at most ``max_lag`` versions later; else wait until newer weights reach
        the rollouter (:meth:`on_rollout_weights`). Raises TimeoutError after ``timeout`` seconds,
        :class:`QueueClosed` when closed."""
        with self._cv:
            self.reserve_wait_s += self._wait(
                lambda: self._trained_at() - self.rollout_version <= self.max_lag,
                timeout,
                f"a group of weight version {self.rollout_version} (async_training.max_lag={self.max_lag})",
            )
            place = QueuedGroup(self.rollout_version)
            self._places.append(place)
            return place

    def fill(self, place: QueuedGroup, group: Any) -> None:
        """The group of a reserved place is generated."""
        with self._cv:
            if place.filled:
                raise ValueError("this place of the sample queue is filled already")
            place.group = group
            self._cv.notify_all()

    def take(self, timeout: float | None = None) -> list[QueuedGroup]:
        """The first ``batch_groups`` places once all are filled, in reservation order (TimeoutError /
        QueueClosed as :meth:`reserve`)."""
        count = self.batch_groups
        with self._cv:
            self.take_wait_s += self._wait(
                lambda: len(self._places) >= count and all(self._places[i].filled for i in range(count)),
                timeout,
                f"the trainer, for {count} groups,",
            )
            batch = [self._places.popleft() for _ in range(count)]
            # the next batch is trained after this one's push: a place granted from now on counts on that version
            self.trainer_version += 1
            self._cv.notify_all()
            return batch

    def on_weights(self, version: int) -> None:
        """The trainer pushed ``version``: its next batch trains with it (:meth:`take` counted on the push already;
        a step without one — a critic warm-up — is corrected here)."""
        with self._cv:
            self.trainer_version = int(version)
            self._cv.notify_all()

    def on_rollout_weights(self, version: int) -> None:
        """The rollouter's engines now generate with ``version`` (a push reached them)."""
        with self._cv:
            self.rollout_version = int(version)
            self._cv.notify_all()

    def close(self) -> None:
        """Wake every waiting caller with :class:`QueueClosed`."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def metrics(self) -> dict[str, float]:
        """``fully_async/count/queue_groups`` (places reserved and not taken) and ``fully_async/count/
        queue_ready_groups`` (of those, generated), and the rollouter's and the trainer's waits so far."""
        with self._cv:
            return {
                "fully_async/count/queue_groups": float(len(self._places)),
                "fully_async/count/queue_ready_groups": float(sum(p.filled for p in self._places)),
                "timing_s/queue_reserve_wait_total": self.reserve_wait_s,
                "timing_s/queue_take_wait_total": self.take_wait_s,
            }
