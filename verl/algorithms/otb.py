"""Optimal Token Baseline (OTB): a per-token baseline that minimises the variance of the policy gradient, for
single-turn responses and, compacting away the non-generated tokens, for multi-turn tool-integrated ones (TIR).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms._common import check_same_shape, compute_dtype
from verl.algorithms.registry import AdvantageEstimator, register_adv_est
from verl.utils.torch_functional import as_torch_index, group_sum

__all__ = ["compute_multi_turn_optimal_token_baseline_advantage", "compute_optimal_token_baseline_advantage"]


def _compact(x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Move each row's valid entries to the front (order kept); the rest of the row is 0.

    ``x`` must be 0 on invalid entries and ``position`` the rank of each valid entry in its row (clamped at 0): the
    valid entries land on distinct columns and the invalid ones add 0.
    """
    return torch.zeros_like(x).scatter_add_(1, position, x)


def _otb(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
    handle_zero_tail: bool,
    epsilon: float,
    compact: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_same_shape(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        old_log_probs=old_log_probs,
        sum_pi_squared=sum_pi_squared,
        rollout_is_weights=rollout_is_weights,
    )
    if len(index) != token_level_rewards.shape[0]:
        raise ValueError(f"index must give one group id per sample ({token_level_rewards.shape[0]}), got {len(index)}")
    dtype = compute_dtype(token_level_rewards, old_log_probs, sum_pi_squared)
    valid = response_mask != 0
    mask = valid.to(dtype)
    zero = torch.zeros((), dtype=dtype, device=valid.device)
    returns = torch.where(valid, token_level_rewards.to(dtype), zero).flip(-1).cumsum_(-1).flip(-1)

    # ‖∇log π_t‖² proxy: 1 − 2π_t + Σπ², scaled by the squared IS weight when correcting for the rollout policy.
    # (In-place steps below only touch fresh tensors; this function runs without autograd.)
    w = torch.exp(old_log_probs.to(dtype)).mul_(-2).add_(1).add_(sum_pi_squared.to(dtype))
    if rollout_is_weights is not None:
        w.mul_(rollout_is_weights.to(dtype).square())
    w_cum = torch.where(valid, w, zero).cumsum_(dim=-1)

    lengths = valid.sum(dim=-1)
    if compact:  # align the trajectories by generated-token count instead of absolute position
        position = (valid.cumsum(dim=-1) - 1).clamp_(min=0)
        returns_c = _compact(torch.where(valid, returns, zero), position)
        w_c = _compact(torch.where(valid, w_cum, zero), position)
        mask_c = (torch.arange(valid.shape[1], device=valid.device) < lengths.unsqueeze(-1)).to(dtype)
        member = lengths > 0  # empty trajectories take no part in their group
    else:
        returns_c, w_c, mask_c = returns, w_cum, mask
        member = torch.ones_like(lengths, dtype=torch.bool)

    groups = as_torch_index(index, device=returns.device)
    k = int(groups.max()) + 1 if groups.numel() else 0
    weight = w_c * mask_c
    denominator = group_sum(weight, groups, k).add_(epsilon)
    group_size = group_sum(member.to(dtype), groups, k)
    # A singleton group has no baseline: zero its row of the numerator.
    numerator = group_sum(weight.mul_(returns_c), groups, k).mul_((group_size > 1).to(dtype).unsqueeze(-1))
    baseline = numerator.div_(denominator)[groups]

    if handle_zero_tail:
        # The unique longest trajectory of a group gets no baseline past the second-longest one's length.
        member_len = torch.where(member, lengths, -1)
        longest = torch.full((k,), -1, dtype=lengths.dtype, device=lengths.device)
        longest = longest.scatter_reduce(0, groups, member_len, reduce="amax")
        is_longest = member & (member_len == longest[groups])
        n_longest = group_sum(is_longest.to(dtype), groups, k)
        runner_up = torch.full((k,), -1, dtype=lengths.dtype, device=lengths.device)
        runner_up = runner_up.scatter_reduce(0, groups, torch.where(is_longest, -1, member_len), reduce="amax")
        zero_tail = is_longest & (n_longest[groups] == 1) & (group_size[groups] > 1)
        tail = torch.arange(baseline.shape[1], device=baseline.device) >= runner_up[groups].unsqueeze(-1)
        baseline.masked_fill_(zero_tail.unsqueeze(-1) & tail, 0.0)

    advantages = baseline.neg_().add_(returns_c)
    if compact:
        advantages = advantages.gather(1, position)
    out_dtype = token_level_rewards.dtype
    return advantages.mul_(mask).to(out_dtype), returns.to(out_dtype)


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline: A_t = G_t − B_t with a per-position baseline per prompt group,

        B_t = Σ_g G_t·W_t / (Σ_g W_t + ε),   W_t = Σ_{j≤t} (1 − 2π_j + Σ_v π_v²)·ρ_j²,

    the variance-minimising baseline b* = E[G‖∇log π‖²]/E[‖∇log π‖²] (Greensmith et al. 2004, "Variance Reduction
    Techniques for Gradient Estimates in Reinforcement Learning", JMLR 5) with the cumulative squared
    score-function norm of a softmax policy as the weight. G is the reward-to-go,
    π_j = exp(old_log_probs), Σπ² comes from the old-log-prob pass (``actor.calculate_sum_pi_squared``) and ρ are the
    optional rollout IS weights. A singleton group has baseline 0. With ``handle_zero_tail`` (the default since veRL
    0.10; False before) the unique longest trajectory of a group gets baseline 0 past the second-longest length,
    where it has no peers. Extra keyword arguments from the trainer are ignored.

    Shape: all tensors (bs, response_length), index (bs,) → advantages, returns (bs, response_length).
    """
    return _otb(
        token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights,
        handle_zero_tail, epsilon, compact=False,
    )  # fmt: skip


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE)
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline for multi-turn (tool-integrated) responses: as
    :func:`compute_optimal_token_baseline_advantage`, but the baseline is indexed by the count of generated tokens
    so far rather than the absolute position (tool-output tokens between turns are skipped), and trajectories with
    no generated token take no part in their group.

    Shape: all tensors (bs, response_length), index (bs,) → advantages, returns (bs, response_length).
    """
    return _otb(
        token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights,
        handle_zero_tail, epsilon, compact=True,
    )  # fmt: skip
