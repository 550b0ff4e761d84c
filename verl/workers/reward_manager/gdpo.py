"""``gdpo``: per-sample scores for the ``gdpo`` advantage estimator (veRL 0.10's reward manager of that name).

The scoring function returns a dict with one entry per reward component (the keys named by
``algorithm.gdpo_reward_keys``) and a ``score``; every entry lands in the reward's extra info, where the estimator
reads the components. The function's ``extra_info`` also carries ``experiment_name`` (``trainer.experiment_name``),
as veRL's manager gives it.
"""

from __future__ import annotations

from typing import Any

from verl.workers.reward_manager.abstract import RewardSample, ScoredBatch
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.registry import register

__all__ = ["GDPORewardManager"]


@register("gdpo")
class GDPORewardManager(NaiveRewardManager):
    """Naive scoring with ``experiment_name`` in every sample's ``extra_info``."""

    def __init__(self, *args: Any, experiment_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.experiment_name = experiment_name

    def score(self, samples: list[RewardSample]) -> ScoredBatch:
        for sample in samples:
            sample.extra_info.setdefault("experiment_name", self.experiment_name)
        return self.run_per_sample(samples)
