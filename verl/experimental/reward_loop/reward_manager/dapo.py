"""veRL 0.10's reward-loop ``dapo`` manager: ``compute_score`` plus DAPO's overlong penalty (the batch manager
``dapo``, one sample per ``run_single``; ``reward.reward_kwargs.overlong_buffer_cfg`` / ``max_resp_len``)."""

from __future__ import annotations

from typing import Any

from verl.experimental.reward_loop.reward_manager.batch_backed import BatchBackedRewardManager
from verl.experimental.reward_loop.reward_manager.registry import register

__all__ = ["DAPORewardManager"]


@register("dapo")
class DAPORewardManager(BatchBackedRewardManager):
    """``compute_score`` plus DAPO's overlong penalty (``reward.reward_kwargs.overlong_buffer_cfg``)."""

    batch_name = "dapo"

    @property
    def max_resp_len(self) -> int | None:
        """The response length the overlong penalty counts from (the batch manager's)."""
        return self.batch_manager.max_resp_len

    @property
    def overlong_buffer_cfg(self) -> Any:
        """``reward.reward_kwargs.overlong_buffer_cfg`` as the batch manager holds it."""
        return self.batch_manager.overlong_buffer_cfg
