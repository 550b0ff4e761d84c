"""``naive``: one ``compute_score`` call per sample."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample, ScoredBatch
from verl.workers.reward_manager.registry import register

__all__ = ["NaiveRewardManager"]


@contextmanager
def _score_timeout(seconds: float | None) -> Iterator[None]:
    """Raise ``TimeoutError`` in the block once it has run ``seconds`` (veRL 0.10's in-process guard, by SIGALRM).

    None or ≤ 0 disables it; off the main thread (where SIGALRM cannot be set) it is a no-op. Our managers do not
    need it — :class:`~verl.utils.reward_score.pool.RewardScorePool` already cuts each call at ``timeout_s`` — but
    code that scores in-process on the main thread can use it.
    """
    if not seconds or seconds <= 0:
        yield
        return

    def _alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"compute_score timed out after {seconds}s")

    try:
        previous = signal.signal(signal.SIGALRM, _alarm)
    except ValueError:  # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@register("naive")
class NaiveRewardManager(AbstractRewardManager):
    """Scores each sample with ``compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)``.

    A dict result contributes its ``"score"`` to the reward and every key to ``reward_extra_info``.
    ``compute_score_timeout`` (veRL 0.10's name) is accepted as ``timeout_s``, the per-call limit of the pool.
    """

    def __init__(self, *args: Any, compute_score_timeout: float | None = None, **kwargs: Any) -> None:
        if compute_score_timeout is not None:
            if "timeout_s" in kwargs:
                raise TypeError("give either compute_score_timeout or timeout_s, not both")
            kwargs["timeout_s"] = compute_score_timeout
        super().__init__(*args, **kwargs)

    def score(self, samples: list[RewardSample]) -> ScoredBatch:
        return self.run_per_sample(samples)
