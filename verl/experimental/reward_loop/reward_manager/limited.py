"""``rate_limited``: scoring through a judge with rate limits (veRL 0.10's manager of that name).

Every call first waits for the run's limits (`verl.experimental.reward_loop.rate_limits`: ``reward.max_concurrent``
calls at once [1], ``reward.max_rpm`` requests and ``reward.max_tpm`` tokens per minute [no limit], each call
counted as ``reward.estimated_tokens_per_request`` tokens [2000]), then runs ``compute_score`` under a time limit of
``reward.timeout`` seconds [300]. A call that runs out of time scores 0 with ``timeout: True`` and ``acc: 0.0`` in
its extra info (and is counted in ``reward/timeout_count``); one that raises is the caller's to count.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from verl.experimental.reward_loop.rate_limits import AsyncTokenBucket, RateLimitSettings, shared_rate_limits
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase, score_result
from verl.experimental.reward_loop.reward_manager.registry import register
from verl.protocol import DataProto

__all__ = ["AsyncTokenBucket", "RateLimitedRewardManager"]

logger = logging.getLogger(__name__)


@register("rate_limited")
class RateLimitedRewardManager(RewardManagerBase):
    """``compute_score`` per sample within the run's rate limits (see the module docstring)."""

    limits: Any = None  # the run's limits (class-wide: one per process, backed by one actor under Ray)
    settings: RateLimitSettings | None = None

    @classmethod
    def init_class(cls, config: Any, tokenizer: Any) -> None:
        """Connect the class to the run's limits (once per process: the first instance's settings hold, as in
        veRL; a later instance asking for others is warned)."""
        settings = RateLimitSettings.from_config((config.get("reward") if config is not None else None) or {})
        if cls.__dict__.get("_class_initialized", False):
            if settings != cls.settings:
                logger.warning(
                    "rate_limited: this process already scores within %s; the limits %s of a later manager are ignored",
                    cls.settings,
                    settings,
                )
            return
        cls.settings, cls.limits = settings, shared_rate_limits(settings)
        cls._class_initialized = True

    def setup(self) -> None:
        """The call's time limit, ``reward.timeout`` (this instance's)."""
        timeout = self.reward_section().get("timeout", 300.0)
        self.timeout_s = float(timeout) if timeout else 0.0

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        """Wait for the limits, then score the last row with ``compute_score`` within ``reward.timeout``."""
        inputs = self.sample(data)
        await self.limits.acquire()
        try:
            call = self.call_compute_score(inputs)
            value = await (asyncio.wait_for(call, self.timeout_s) if self.timeout_s > 0 else call)
        except asyncio.TimeoutError:
            logger.warning(
                "rate_limited: compute_score ran past reward.timeout=%ss (data_source=%r)",
                self.timeout_s,
                inputs.data_source,
            )
            return {"reward_score": 0.0, "reward_extra_info": {"timeout": True, "acc": 0.0}}
        finally:
            await self.limits.release()
        return score_result(value, "compute_score")
