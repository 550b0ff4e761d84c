"""``dapo``: per-sample scores plus DAPO's soft overlong punishment (Yu et al., 2025, "DAPO", §3.4, eq. 13).

With ``overlong_buffer_cfg.enable``, a response longer than ``max_resp_len − len`` tokens loses reward linearly,
reaching ``−penalty_factor`` at ``max_resp_len``::

    expected = max_resp_len − len
    overlong_reward = min(−(response_length − expected) / len · penalty_factor, 0)
    reward = score + overlong_reward

``overlong_buffer_cfg.log`` adds ``overlong_reward`` and ``overlong`` (bool) to ``reward_extra_info``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample, ScoredBatch
from verl.workers.reward_manager.registry import register

__all__ = ["DAPORewardManager", "OverlongBufferError"]


class OverlongBufferError(ValueError, AssertionError):
    """A bad ``overlong_buffer_cfg`` / ``max_resp_len``: a ``ValueError``, and an ``AssertionError`` as veRL's
    constructor raises, so code catching either sees it."""


@register("dapo")
class DAPORewardManager(AbstractRewardManager):
    """Naive scoring plus the overlong penalty. A non-dict score is also logged as ``acc`` (every per-sample
    manager does)."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Any = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)
        self.max_resp_len = max_resp_len
        self.overlong_buffer_cfg = overlong_buffer_cfg
        cfg = overlong_buffer_cfg or {}
        if cfg.get("enable", False):
            if not isinstance(max_resp_len, int) or max_resp_len <= 0:
                raise OverlongBufferError(
                    f"reward.reward_kwargs.overlong_buffer_cfg.enable=True: max_resp_len must be provided "
                    f"(data.max_response_length) as a positive int, got {max_resp_len!r}"
                )
            length = cfg.get("len")
            if not isinstance(length, int) or not 0 < length <= max_resp_len:
                raise OverlongBufferError(
                    f"reward.reward_kwargs.overlong_buffer_cfg.len={length!r} must be an int in (0, {max_resp_len}]: "
                    "max_resp_len must be larger than the buffer (data.max_response_length)"
                )

    def score(self, samples: list[RewardSample]) -> ScoredBatch:
        scored = self.run_per_sample(samples)
        cfg = self.overlong_buffer_cfg or {}
        if not cfg.get("enable", False):
            return scored
        buffer_len = int(cfg["len"])
        factor = float(cfg.get("penalty_factor", 1.0))
        expected = self.max_resp_len - buffer_len
        for i, sample in enumerate(samples):
            overlong_reward = min(-(sample.valid_response_length - expected) / buffer_len * factor, 0.0)
            scored.scores[i] += overlong_reward
            if cfg.get("log", False):
                scored.extra[i]["overlong_reward"] = overlong_reward
                scored.extra[i]["overlong"] = overlong_reward < 0
        return scored
