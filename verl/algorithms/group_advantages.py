"""Outcome-reward advantage estimators that compare the responses to the same prompt: GRPO, Dr.GRPO, GDPO, Pass@k,
RLOO, OPO, GPG and REINFORCE++-baseline.

Each sample's score is its summed token reward; the group of a sample is given by ``index`` (the prompt ``uid``).
Group statistics come from scatter/index_add over dense group ids (no Python loop over samples or groups) and are
computed in fp64 from scores summed in at least fp32; the scalar advantage is broadcast over ``response_mask``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl.algorithms._common import cfg_get, check_same_shape, compute_dtype
from verl.algorithms.registry import AdvantageEstimator, register_adv_est
from verl.utils.torch_functional import as_torch_index, group_mean, group_mean_std, group_sum, masked_whiten

__all__ = [
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
]


def _scores_and_groups(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(per-sample scores in fp64, dense group ids, number of groups)."""
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    if index is None or len(index) != token_level_rewards.shape[0]:
        got = None if index is None else len(index)
        raise ValueError(f"index must give one group id per sample ({token_level_rewards.shape[0]}), got {got}")
    # Sum in the compute dtype (fp32 unless the input is fp64), then do the group statistics in fp64.
    scores = token_level_rewards.sum(dim=-1, dtype=compute_dtype(token_level_rewards)).double()
    groups = as_torch_index(index, device=scores.device)
    return scores, groups, int(groups.max()) + 1 if groups.numel() else 0


def _grpo_normalise(scores: torch.Tensor, groups: torch.Tensor, epsilon: float, norm_by_std: bool) -> torch.Tensor:
    """(s − mean_g) / (std_g + ε), or s − mean_g without ``norm_by_std``; a singleton group uses mean 0, std 1."""
    mean, std, _ = group_mean_std(scores, groups, eps=0.0)
    centered = scores - mean[groups]
    return centered / (std[groups] + epsilon) if norm_by_std else centered


def _broadcast(
    per_sample: torch.Tensor, token_level_rewards: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Scalar per sample → (bs, response_length) on the response tokens, in the rewards' dtype."""
    dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
    return per_sample.to(dtype).unsqueeze(-1) * response_mask.to(dtype)


@register_adv_est(AdvantageEstimator.GRPO)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, arXiv:2402.03300, Sec. 4.1.2): A_i = (s_i − mean_g) / (std_g + ε).

    With ``norm_adv_by_std_in_grpo=False`` it is Dr.GRPO's A_i = s_i − mean_g (Liu et al. 2025,
    arXiv:2503.20783). std is the unbiased group std; a singleton group uses mean 0 and std 1.

    Shape: rewards, response_mask (bs, response_length), index (bs,) → advantages, returns (the same tensor).
    """
    scores, groups, _ = _scores_and_groups(token_level_rewards, response_mask, index)
    advantage = _grpo_normalise(scores, groups, epsilon, norm_adv_by_std_in_grpo)
    advantages = _broadcast(advantage, token_level_rewards, response_mask)
    return advantages, advantages


# veRL keeps a separate vectorized twin; here there is one (vectorized) implementation under both names.
compute_grpo_vectorized_outcome_advantage = compute_grpo_outcome_advantage
register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)(compute_grpo_outcome_advantage)


def _reward_components(non_tensor_batch: Mapping[str, Any], keys: Sequence[str], batch_size: int) -> list[torch.Tensor]:
    """One fp64 (bs,) tensor per key of ``non_tensor_batch``; every problem names the key (and the row)."""
    missing = [key for key in keys if key not in non_tensor_batch]
    if missing:
        raise ValueError(
            f"algorithm.gdpo_reward_keys names {missing}, which the batch does not hold; the reward function's "
            f"dict must return them (non-tensor keys present: {sorted(non_tensor_batch)})"
        )
    components = []
    for key in keys:
        try:
            values = np.asarray(non_tensor_batch[key], dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ValueError(f"GDPO reward component {key!r} must hold one number per sample: {e}") from None
        if values.shape != (batch_size,):
            raise ValueError(
                f"GDPO reward component {key!r} has shape {values.shape}; expected one number per sample "
                f"({batch_size},)"
            )
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(f"GDPO reward component {key!r} is {values[bad[0]]} at row {int(bad[0])}")
        components.append(torch.from_numpy(values))
    return components


def _gdpo_weights(weights: Sequence[float] | None, keys: Sequence[str]) -> list[float]:
    if weights is None:
        return [1.0] * len(keys)
    weights = list(weights)
    if len(weights) != len(keys) or not all(
        isinstance(w, int | float) and not isinstance(w, bool) and np.isfinite(w) for w in weights
    ):
        raise ValueError(
            f"algorithm.gdpo_reward_weights={weights!r} must be {len(keys)} finite numbers, one per key of "
            f"algorithm.gdpo_reward_keys={list(keys)}"
        )
    return [float(w) for w in weights]


@register_adv_est(AdvantageEstimator.GDPO)
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Any = None,
    gdpo_reward_keys: Sequence[str] | None = None,
    gdpo_reward_weights: Sequence[float] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO, Group reward-Decoupled normalization Policy Optimization (Liu et al. 2026, arXiv:2601.05242).

    With several rewards (accuracy, format, ...), GRPO on their sum lets the widest-spread one decide the sign of the
    advantage. GDPO normalises each reward k on its own within the prompt group, then sums and whitens over the batch:

        Â_ik = (s_ik − mean_g(s_k)) / (std_g(s_k) + ε);   A_i = Σ_k w_k·Â_ik;   A = whiten(A_i·m)·m,

    s_ik = ``non_tensor_batch[key_k][i]`` (the reward function's dict puts each component there), w_k =
    ``gdpo_reward_weights`` (default 1 each), the whitening over the batch's valid tokens. Each Â_ik is exactly
    :func:`compute_grpo_outcome_advantage`'s (``norm_adv_by_std_in_grpo=False`` drops the std; a singleton group
    has mean 0, std 1).

    ``gdpo_reward_keys`` / ``gdpo_reward_weights`` default to ``config.gdpo_reward_keys`` / ``.gdpo_reward_weights``
    (``algorithm.*``). Called without keys and without ``non_tensor_batch`` (a direct call, as veRL allows), the one
    reward is the summed ``token_level_rewards``: GRPO, then whitened. ``batch`` is accepted for veRL's signature and
    not read (veRL only uses it to place each value on the last response token before summing the row).

    Shape: rewards, response_mask (bs, response_length), index (bs,) → advantages, returns (the same tensor).

    Raises:
        ValueError: ``non_tensor_batch`` given without reward keys, a key it lacks, a component that is not one
            finite number per sample, or weights that do not match the keys.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    keys = gdpo_reward_keys if gdpo_reward_keys is not None else cfg_get(config, "gdpo_reward_keys", None)
    weights = gdpo_reward_weights if gdpo_reward_weights is not None else cfg_get(config, "gdpo_reward_weights", None)
    if isinstance(keys, str):
        raise ValueError(f"algorithm.gdpo_reward_keys={keys!r} must be a list of keys, e.g. [{keys!r}]")
    scores, groups, _ = _scores_and_groups(token_level_rewards, response_mask, index)
    if keys:
        if non_tensor_batch is None:
            raise ValueError(
                f"GDPO needs the batch's non-tensor data (non_tensor_batch) to read algorithm.gdpo_reward_keys="
                f"{list(keys)}"
            )
        components = [c.to(scores.device) for c in _reward_components(non_tensor_batch, keys, scores.shape[0])]
    elif non_tensor_batch is not None:
        raise ValueError(
            "GDPO needs algorithm.gdpo_reward_keys: the keys of the reward components the reward function returns in "
            f"its dict (non-tensor keys present: {sorted(non_tensor_batch)})"
        )
    else:
        keys, components = ["token_level_rewards"], [scores]
    total = torch.zeros_like(scores)
    for w, component in zip(_gdpo_weights(weights, keys), components):
        total += w * _grpo_normalise(component, groups, epsilon, norm_adv_by_std_in_grpo)
    dtype = torch.promote_types(token_level_rewards.dtype, torch.float32)
    mask = response_mask.to(dtype)
    summed = total.to(dtype).unsqueeze(-1) * mask
    advantages = masked_whiten(summed, mask).mul_(mask).to(token_level_rewards.dtype)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training (Chen et al. 2025, arXiv:2503.19595): only the best response of each group gets an advantage,
    r_max − r_second (÷ (std_g + ε) when normalising); every other response gets 0.

    ``config.norm_adv_by_std_in_grpo`` overrides the argument when a config is given. Ties for the best go to the
    first sample (its advantage is then 0 anyway).

    Shape: rewards, response_mask (bs, response_length), index (bs,) → advantages, returns (the same tensor).

    Raises:
        ValueError: a group has fewer than 2 samples.
    """
    if config is not None:
        norm_adv_by_std_in_grpo = bool(cfg_get(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo))
    scores, groups, k = _scores_and_groups(token_level_rewards, response_mask, index)
    _, std, count = group_mean_std(scores, groups, eps=0.0)
    if (count < 2).any():
        first_small = int(torch.nonzero(count[groups] < 2)[0])
        raise ValueError(
            f"grpo_passk needs at least 2 samples per group; the group of sample {first_small} "
            f"(uid {index[first_small]!r}) has {int(count[groups[first_small]])}"
        )
    rows = torch.arange(scores.shape[0], device=scores.device)
    best = torch.full((k,), float("-inf"), dtype=scores.dtype, device=scores.device)
    best = best.scatter_reduce(0, groups, scores, reduce="amax")
    best_row = torch.full((k,), scores.shape[0], dtype=torch.long, device=scores.device)
    best_row = best_row.scatter_reduce(0, groups, torch.where(scores == best[groups], rows, scores.shape[0]), "amin")
    others = torch.where(rows == best_row[groups], torch.full_like(scores, float("-inf")), scores)
    second = torch.full((k,), float("-inf"), dtype=scores.dtype, device=scores.device)
    second = second.scatter_reduce(0, groups, others, reduce="amax")
    gap = best - second
    if norm_adv_by_std_in_grpo:
        gap = gap / (std + epsilon)
    advantage = torch.zeros_like(scores).index_copy_(0, best_row, gap)
    advantages = _broadcast(advantage, token_level_rewards, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262): A = masked_whiten((s − mean_g) over the response
    tokens), i.e. the group mean as baseline, normalised over the whole batch; a singleton group's mean is 0.

    Shape: rewards, response_mask (bs, response_length), index (bs,) → advantages, returns (the same tensor).
    """
    scores, groups, _ = _scores_and_groups(token_level_rewards, response_mask, index)
    mean, _, _ = group_mean_std(scores, groups, eps=0.0)
    dtype = torch.promote_types(token_level_rewards.dtype, torch.float32)
    mask = response_mask.to(dtype)
    centered = (scores - mean[groups]).to(dtype).unsqueeze(-1) * mask
    advantages = masked_whiten(centered, mask).mul_(mask).to(token_level_rewards.dtype)
    return advantages, advantages


def _rloo(token_level_rewards, response_mask, index, keep_singleton_score: bool) -> torch.Tensor:
    scores, groups, _ = _scores_and_groups(token_level_rewards, response_mask, index)
    mean, _, count = group_mean_std(scores, groups, eps=0.0)
    n = count[groups]
    leave_one_out = n / (n - 1).clamp_min(1) * (scores - mean[groups])
    singleton = scores if keep_singleton_score else torch.zeros_like(scores)
    return _broadcast(torch.where(n > 1, leave_one_out, singleton), token_level_rewards, response_mask)


@register_adv_est(AdvantageEstimator.RLOO)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): A_i = s_i − mean of the other n−1 scores of the group
    = n/(n−1)·(s_i − mean_g). A singleton group keeps its score (baseline 0).

    Shape: rewards, response_mask (bs, response_length), index (bs,) → advantages, returns (the same tensor).
    """
    advantages = _rloo(token_level_rewards, response_mask, index, keep_singleton_score=True)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO as :func:`compute_rloo_outcome_advantage`, except that a singleton group gets advantage 0 (as veRL's
    ``rloo_vectorized`` does); the same vectorized code computes both.
    """
    advantages = _rloo(token_level_rewards, response_mask, index, keep_singleton_score=False)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.OPO)
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, arXiv:2505.23585): the baseline is the
    length-weighted group mean b_g = Σ|y_i|·s_i / Σ|y_i|; A_i = s_i − b_g. A singleton group, or one whose responses
    are all empty, has baseline 0.

    Shape: rewards, response_mask (bs, response_length), index (bs,) → advantages, returns (the same tensor).
    """
    scores, groups, k = _scores_and_groups(token_level_rewards, response_mask, index)
    lengths = response_mask.sum(dim=-1, dtype=torch.float32).double()  # counts are exact in fp32
    baseline, total_length = group_mean(scores, groups, k, weights=lengths)
    count = group_sum(torch.ones_like(scores), groups, k)
    baseline = torch.where((count > 1) & (total_length > 0), baseline, torch.zeros_like(baseline))
    advantages = _broadcast(scores - baseline[groups], token_level_rewards, response_mask)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GPG)
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546): A_i = α·(s_i − mean_g)/F_norm with
    α = bs / #{i : s_i ≠ 0} (the paper's correction for groups that carry no signal).

    ``alpha`` is accepted for veRL's signature but, as there, α is always recomputed from the batch. A singleton
    group's mean is 0.

    Shape: rewards, response_mask (bs, response_length), index (bs,) → advantages, returns (the same tensor).
    """
    scores, groups, _ = _scores_and_groups(token_level_rewards, response_mask, index)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    mean, _, _ = group_mean_std(scores, groups, eps=0.0)
    advantages = _broadcast(alpha * (scores - mean[groups]) / f_norm, token_level_rewards, response_mask)
    return advantages, advantages
