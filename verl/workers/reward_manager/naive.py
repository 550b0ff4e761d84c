"""``naive``: one ``compute_score`` call per sample."""

from __future__ import annotations

from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample, ScoredBatch
from verl.workers.reward_manager.registry import register

__all__ = ["NaiveRewardManager"]


@register("naive")
class NaiveRewardManager(AbstractRewardManager):
    """Scores each sample with ``compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)``.

    A dict result contributes its ``"score"`` to the reward and every key to ``reward_extra_info``.
    """

    def score(self, samples: list[RewardSample]) -> ScoredBatch:
        return self.run_per_sample(samples)
