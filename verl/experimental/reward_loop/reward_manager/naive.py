"""veRL 0.10's reward-loop ``naive`` manager: ``compute_score`` per sample (the batch manager ``naive``, one sample per
``run_single``)."""

from __future__ import annotations

from verl.experimental.reward_loop.reward_manager.batch_backed import BatchBackedRewardManager
from verl.experimental.reward_loop.reward_manager.registry import register

__all__ = ["NaiveRewardManager"]


@register("naive")
class NaiveRewardManager(BatchBackedRewardManager):
    """``compute_score`` per sample."""

    batch_name = "naive"
