"""Rate limits for scoring with a paid or shared judge: at most ``max_concurrent`` calls at once, ``max_rpm``
requests and ``max_tpm`` tokens per minute (veRL 0.10's ``reward.*`` keys of its ``rate_limited`` manager).

Requests and tokens are token buckets that refill at the per-second rate and hold one second of it (the burst).
A caller *reserves* what it needs — the balance may go below zero — and waits until the reservation is covered,
so callers are served in arrival order and the long-run rate is exact: over any window of ``w`` seconds at most
``rate · (1 + w)`` requests (or tokens) are granted.

One :class:`RateLimits` serves a whole run: the scoring happens in several processes (every agent-loop worker, the
driver), so under Ray the limits live in one actor (:func:`shared_rate_limits`, named after the settings) that
each process asks for a slot; without Ray, in the process itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["AsyncTokenBucket", "RateLimitSettings", "RateLimits", "TokenBucket", "shared_rate_limits"]

logger = logging.getLogger(__name__)

ACTOR_NAME = "verl_reward_rate_limits"


@dataclass(frozen=True)
class RateLimitSettings:
    """The limits, from ``reward.{max_concurrent, max_rpm, max_tpm, estimated_tokens_per_request}``."""

    max_concurrent: int = 1
    max_rpm: float | None = None
    max_tpm: float | None = None
    estimated_tokens_per_request: int = 2000

    @classmethod
    def from_config(cls, reward: Any) -> RateLimitSettings:
        """From the ``reward`` section (absent keys: veRL's defaults); a limit that is not positive is an error
        naming its key."""
        reward = reward or {}
        settings = cls(
            max_concurrent=int(reward.get("max_concurrent", 1) or 1),
            max_rpm=reward.get("max_rpm"),
            max_tpm=reward.get("max_tpm"),
            estimated_tokens_per_request=int(reward.get("estimated_tokens_per_request", 2000)),
        )
        for key in ("max_concurrent", "max_rpm", "max_tpm", "estimated_tokens_per_request"):
            value = getattr(settings, key)
            if value is not None and not value > 0:
                raise ValueError(f"reward.{key}={value!r} must be positive (or absent: no limit)")
        return settings


class TokenBucket:
    """``per_second`` tokens a second, holding at most ``capacity`` (default: one second of them; see the module
    docstring)."""

    def __init__(
        self, per_second: float, clock: Callable[[], float] = time.monotonic, capacity: float | None = None
    ) -> None:
        self.rate = float(per_second)
        self.capacity = float(capacity) if capacity else self.rate
        self.tokens = self.capacity
        self.clock = clock
        self.updated = clock()

    def reserve(self, count: float) -> float:
        """Take ``count`` tokens now; returns the seconds until the balance covers them (0: at once)."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        self.tokens -= count
        return max(0.0, -self.tokens / self.rate)


class AsyncTokenBucket:
    """veRL 0.10's token bucket, awaited: ``rate_limit`` tokens a second, at most ``max_tokens`` (default: one
    second of them); ``await acquire(n)`` returns once ``n`` tokens are granted (in arrival order)."""

    def __init__(self, rate_limit: float, max_tokens: float | None = None) -> None:
        self.rate_limit = float(rate_limit)
        self.max_tokens = float(max_tokens or rate_limit)
        self._bucket = TokenBucket(self.rate_limit, capacity=self.max_tokens)
        self._used = False

    @property
    def last_update(self) -> float | None:
        """When the balance was last brought up to date (None before the first acquire)."""
        return self._bucket.updated if self._used else None

    @property
    def tokens(self) -> float:
        """The balance at the last grant (below zero while grants wait for the refill)."""
        return self._bucket.tokens

    async def acquire(self, num_tokens: float = 1.0) -> None:
        """Take ``num_tokens``, waiting until the balance covers them."""
        wait = self._bucket.reserve(float(num_tokens))
        self._used = True
        if wait > 0:
            await asyncio.sleep(wait)


class RateLimits:
    """The run's limits (see the module docstring); ``await acquire()`` before a call, ``release()`` after.

    ``granted`` holds the clock time of every grant (tests and metrics read it with :meth:`stats`)."""

    def __init__(self, settings: RateLimitSettings | dict[str, Any] | None = None) -> None:
        self.settings = settings if isinstance(settings, RateLimitSettings) else RateLimitSettings(**(settings or {}))
        s = self.settings
        self.requests = TokenBucket(s.max_rpm / 60.0) if s.max_rpm else None
        self.tokens = TokenBucket(s.max_tpm / 60.0) if s.max_tpm else None
        self.slots: asyncio.Semaphore | None = None  # made on the loop that first waits on it
        self.in_flight = self.max_in_flight = 0
        self.granted: list[float] = []

    def describe(self) -> dict[str, Any]:
        """The settings as a dict."""
        return asdict(self.settings)

    async def acquire(self) -> None:
        """Wait for a request (and its estimated tokens) to be allowed and for a free slot."""
        wait = 0.0
        if self.requests is not None:
            wait = self.requests.reserve(1.0)
        if self.tokens is not None:
            wait = max(wait, self.tokens.reserve(float(self.settings.estimated_tokens_per_request)))
        if wait > 0:
            await asyncio.sleep(wait)
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.settings.max_concurrent)
        await self.slots.acquire()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.granted.append(time.monotonic())

    def release(self) -> None:
        """Free the slot an :meth:`acquire` took."""
        if self.slots is None or self.in_flight == 0:
            raise RuntimeError("RateLimits.release without an acquire")
        self.in_flight -= 1
        self.slots.release()

    def stats(self) -> dict[str, Any]:
        """``{"granted": [times], "max_in_flight": n, "settings": {...}}``."""
        return {"granted": list(self.granted), "max_in_flight": self.max_in_flight, "settings": self.describe()}


class _LocalHandle:
    """The process's own :class:`RateLimits` behind the same calls as the actor's."""

    def __init__(self, limits: RateLimits) -> None:
        self.limits = limits

    async def acquire(self) -> None:
        await self.limits.acquire()

    async def release(self) -> None:
        self.limits.release()

    async def stats(self) -> dict[str, Any]:
        return self.limits.stats()


class _ActorHandle:
    """The run's :class:`RateLimits` in a named Ray actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def acquire(self) -> None:
        await self.actor.acquire.remote()

    async def release(self) -> None:
        await self.actor.release.remote()

    async def stats(self) -> dict[str, Any]:
        return await self.actor.stats.remote()


_local: dict[RateLimitSettings, _LocalHandle] = {}


def shared_rate_limits(settings: RateLimitSettings) -> Any:
    """The run's limits for ``settings``: a handle with ``async acquire()``, ``async release()`` and
    ``async stats()`` — of the actor named after the settings under Ray (made by the first caller), of the
    process's own :class:`RateLimits` otherwise."""
    import ray

    if not ray.is_initialized():
        return _local.setdefault(settings, _LocalHandle(RateLimits(settings)))
    digest = hashlib.sha1(repr(settings).encode()).hexdigest()[:12]
    actor = (
        ray.remote(RateLimits)
        .options(name=f"{ACTOR_NAME}_{digest}", get_if_exists=True, max_concurrency=1000, num_cpus=0)
        .remote(settings)
    )
    logger.info("reward rate limits %s in actor %s_%s", settings, ACTOR_NAME, digest)
    return _ActorHandle(actor)
