"""``batch``: one ``compute_score`` call for the whole batch (for functions that vectorize or call a service)."""

from __future__ import annotations

from verl.utils.reward_score.pool import ScoreResult
from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample, ScoredBatch
from verl.workers.reward_manager.registry import register

__all__ = ["BatchRewardManager"]


@register("batch")
class BatchRewardManager(AbstractRewardManager):
    """Calls ``compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...], extra_infos=[...],
    **reward_kwargs)`` once; it must return one number or dict per sample.

    The call runs in the scoring pool with one ``timeout_s`` for the whole batch. If it fails, every sample of the
    batch scores 0 and counts as failed; a single bad item in the returned list fails only its sample.
    """

    def score(self, samples: list[RewardSample]) -> ScoredBatch:
        kwargs = self.score_kwargs(
            {
                "data_sources": [s.data_source for s in samples],
                "solution_strs": [s.response_str for s in samples],
                "ground_truths": [s.ground_truth for s in samples],
                "extra_infos": [s.extra_info for s in samples],
            }
        )
        (result,) = self.pool.run([((), kwargs)])
        if result.ok:
            values = result.value
            if isinstance(values, (list, tuple)) and len(values) == len(samples):
                return self.check_results(samples, [ScoreResult(value=v) for v in values])
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
            result = ScoreResult(error=f"the batch compute_score returned {got}; expected a list of {len(samples)}")
        return self.check_results(samples, [result] * len(samples))
