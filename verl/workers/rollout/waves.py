"""Waves: requests that a client sends one by one but that must join the engine's batch together.

Requests arriving over Ray one at a time would be admitted in timing-dependent groups, and the engine's numerics
(padding, batch shapes) follow the groups: the same samples could come out differently from run to run. A client
that knows a set of requests belongs together tags each with ``wave=(wave_id, index, size)``; the engine holds them
until all ``size`` have arrived and then submits them at once, in ``index`` order — the same batch every run. A wave
that is still incomplete ``timeout_s`` after its first request is submitted as it is (a warning names it).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["WaveAssembler"]

logger = logging.getLogger(__name__)

WAVE_TIMEOUT_S = 30.0


def _copy_outcome(source: concurrent.futures.Future, target: concurrent.futures.Future) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())


class WaveAssembler:
    """Collects the requests of each wave and submits a complete wave with ``submit_many`` (one admission).

    Args:
        submit_many: the engine's ``submit_many(requests) -> futures``.
        timeout_s: how long an incomplete wave waits for its missing requests.
    """

    def __init__(
        self, submit_many: Callable[[list[tuple]], list[concurrent.futures.Future]], timeout_s: float = WAVE_TIMEOUT_S
    ) -> None:
        self._submit_many = submit_many
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._waves: dict[str, dict[str, Any]] = {}

    def submit(self, wave: tuple[str, int, int], request: tuple) -> concurrent.futures.Future:
        """Add ``request`` (``submit_many``'s tuple) as item ``index`` of wave ``wave_id`` of ``size`` requests; the
        future resolves to its output once the wave has run."""
        wave_id, index, size = str(wave[0]), int(wave[1]), int(wave[2])
        if not 0 <= index < size:
            raise ValueError(f"generate({request[0]!r}): wave index {index} is outside the wave's size {size}")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            entry = self._waves.get(wave_id)
            if entry is None:
                timer = threading.Timer(self._timeout_s, self._flush, args=(wave_id, True))
                timer.daemon = True
                entry = self._waves[wave_id] = {"size": size, "items": {}, "timer": timer}
                timer.start()
            if index in entry["items"]:
                raise ValueError(f"generate({request[0]!r}): wave {wave_id!r} already has a request at index {index}")
            entry["items"][index] = (request, future)
            complete = len(entry["items"]) >= entry["size"]
        if complete:
            self._flush(wave_id, False)
        return future

    def _flush(self, wave_id: str, timed_out: bool) -> None:
        with self._lock:
            entry = self._waves.pop(wave_id, None)
        if entry is None:
            return
        entry["timer"].cancel()
        items = [entry["items"][i] for i in sorted(entry["items"])]
        if timed_out:
            logger.warning(
                "wave %s: %d of its %d requests arrived within %.0f s; submitting those",
                wave_id,
                len(items),
                entry["size"],
                self._timeout_s,
            )
        try:
            futures = self._submit_many([request for request, _ in items])
        except BaseException as error:  # e.g. a bad request: every caller of the wave hears of it
            for _, future in items:
                future.set_exception(error)
            return
        for (_, target), source in zip(items, futures):
            source.add_done_callback(lambda done, target=target: _copy_outcome(done, target))
