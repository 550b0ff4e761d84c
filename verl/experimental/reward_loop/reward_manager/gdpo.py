"""veRL 0.10's reward-loop ``gdpo`` manager: ``compute_score`` with ``experiment_name`` in ``extra_info`` (the batch
manager ``gdpo``, one sample per ``run_single``)."""

from __future__ import annotations

from verl.experimental.reward_loop.reward_manager.batch_backed import BatchBackedRewardManager
from verl.experimental.reward_loop.reward_manager.registry import register

__all__ = ["GDPORewardManager"]


@register("gdpo")
class GDPORewardManager(BatchBackedRewardManager):
    """``compute_score`` with ``experiment_name`` in ``extra_info``."""

    batch_name = "gdpo"
