"""Per-rank batch sizes derived from the user's global ones (computed once, into fields of their own)."""

from __future__ import annotations

__all__ = ["per_rank_mini_batch_size"]


def per_rank_mini_batch_size(
    prefix: str, ppo_mini_batch_size: int, rollout_n: int, dp_size: int, micro_batch_size_per_gpu: int | None
) -> int:
    """``ppo_mini_batch_size`` (prompts, global) × ``rollout_n`` ÷ ``dp_size``: the samples per rank per mini-batch.

    Raises ValueError naming ``prefix``'s keys when the division is not exact or the micro-batch is bigger.
    """
    for name, value in (("ppo_mini_batch_size", ppo_mini_batch_size), ("rollout_n", rollout_n)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{prefix}.{name}={value!r} must be an integer >= 1")
    if not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"{prefix}: data-parallel size {dp_size!r} must be an integer >= 1")
    total = ppo_mini_batch_size * rollout_n
    if total % dp_size:
        raise ValueError(
            f"{prefix}.ppo_mini_batch_size ({ppo_mini_batch_size}) × rollout.n ({rollout_n}) = {total} samples is not "
            f"divisible by {dp_size} data-parallel ranks; pick a mini-batch size that makes it divisible"
        )
    per_rank = total // dp_size
    if micro_batch_size_per_gpu is not None and micro_batch_size_per_gpu > per_rank:
        raise ValueError(
            f"{prefix}.ppo_micro_batch_size_per_gpu ({micro_batch_size_per_gpu}) is larger than the per-rank "
            f"mini-batch ({per_rank} = ppo_mini_batch_size × rollout.n ÷ {dp_size} ranks); lower it"
        )
    return per_rank
