"""Advantage estimators built on per-token returns: GAE, REINFORCE++ and ReMax.

The recurrences run backwards over the response positions on time-major copies, each step a vector operation over the
whole batch; there is no loop over samples.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms._common import cfg_get, check_same_shape, compute_dtype
from verl.algorithms.registry import AdvantageEstimator, register_adv_est
from verl.utils.torch_functional import masked_whiten

__all__ = [
    "compute_gae_advantage_return",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
]


def _as_float(x: float | torch.Tensor, name: str) -> float:
    if torch.is_tensor(x):
        if x.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(x.shape)}")
        return float(x)
    return float(x)


@register_adv_est(AdvantageEstimator.GAE)
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | torch.Tensor,
    lam: float | torch.Tensor,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438, Eq. 16), then whitened.

    δ_t = r_t + γ·V_{t'} − V_t and A_t = δ_t + γλ·A_{t'}, where t' is the next position with ``response_mask`` = 1:
    masked positions (padding, or tool/observation tokens between turns) are skipped, so their reward and value
    take no part and A carries over them unchanged. returns = A + V; the advantages are then whitened over the
    masked entries.

    Shape: rewards, values, response_mask (bs, response_length) → advantages, returns (bs, response_length).

    Args:
        token_level_rewards: per-token rewards.
        values: critic values V_t.
        response_mask: 1 on the tokens the policy generated.
        gamma: discount γ.
        lam: GAE λ.
        **kwargs: ignored (lets the trainer call every estimator with the same keywords).
    """
    check_same_shape(token_level_rewards=token_level_rewards, values=values, response_mask=response_mask)
    gamma, lam = _as_float(gamma, "gamma"), _as_float(lam, "lam")
    out_dtype = torch.promote_types(token_level_rewards.dtype, values.dtype)
    dtype = compute_dtype(token_level_rewards, values)
    rewards_t = token_level_rewards.to(dtype).T.contiguous()
    values_t = values.to(dtype).T.contiguous()
    valid_t = (response_mask != 0).T.contiguous()

    advantages_t = torch.empty_like(rewards_t)
    next_value = torch.zeros_like(rewards_t[0])
    last_gae = torch.zeros_like(rewards_t[0])
    for t in range(rewards_t.shape[0] - 1, -1, -1):
        delta = rewards_t[t] + gamma * next_value - values_t[t]
        candidate = delta.add_(last_gae, alpha=gamma * lam)
        next_value = torch.where(valid_t[t], values_t[t], next_value)
        last_gae = torch.where(valid_t[t], candidate, last_gae)
        advantages_t[t] = last_gae

    advantages = advantages_t.T.contiguous()  # one transpose back, then every full-size op runs on contiguous data
    returns = advantages + values.to(dtype)
    advantages = masked_whiten(advantages, response_mask.to(dtype))
    return advantages.to(out_dtype), returns.to(out_dtype)


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config: Any = None, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return-to-go over the generated tokens, whitened over the
    batch.

    G_t = r_t + γ·G_{t'} on tokens with ``response_mask`` = 1, t' the next such token (0 past the last); G_t = 0
    on masked tokens (padding, and observation/tool tokens between the turns of a multi-turn response). The running
    return passes through a masked span unchanged (no reward added, no discount applied), so the final reward
    reaches every earlier turn, as in veRL 0.10 (before, the return restarted at 0 after each masked token).
    A = masked_whiten(G)·mask; the returns are G.

    Shape: rewards, response_mask (bs, response_length) → advantages, returns (bs, response_length).

    Args:
        token_level_rewards: per-token rewards.
        response_mask: 1 on generated tokens.
        config: AlgoConfig (or mapping) providing ``gamma`` (default 1.0).
        **kwargs: ignored.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    gamma = float(cfg_get(config, "gamma", 1.0))
    dtype = compute_dtype(token_level_rewards)
    rewards_t = token_level_rewards.to(dtype).T.contiguous()
    valid_t = (response_mask != 0).T.contiguous()

    returns_t = torch.zeros_like(rewards_t)
    running = torch.zeros_like(rewards_t[0])
    for t in range(rewards_t.shape[0] - 1, -1, -1):
        running = torch.where(valid_t[t], rewards_t[t] + gamma * running, running)
        returns_t[t] = torch.where(valid_t[t], running, returns_t[t])

    returns = returns_t.T.contiguous()
    mask = response_mask.to(dtype)
    advantages = masked_whiten(returns, mask).mul_(mask)
    return advantages.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


@register_adv_est(AdvantageEstimator.REMAX)
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2024, arXiv:2310.10505): the reward of the greedy response is the baseline.

    G_t = Σ_{k≥t} r_k·m_k (return-to-go); A_t = G_t − b·m_t with b = ``reward_baselines`` (the trainer scores an
    extra greedy generation per prompt).

    Shape: rewards, response_mask (bs, response_length), reward_baselines (bs,) → advantages, returns.
    """
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    if reward_baselines.shape != token_level_rewards.shape[:1]:
        raise ValueError(
            f"reward_baselines must have shape ({token_level_rewards.shape[0]},), got {tuple(reward_baselines.shape)}"
        )
    dtype = compute_dtype(token_level_rewards)
    mask = response_mask.to(dtype)
    returns = (token_level_rewards.to(dtype) * mask).flip(-1).cumsum_(-1).flip(-1)
    advantages = mask * reward_baselines.to(dtype).unsqueeze(-1)
    advantages = advantages.neg_().add_(returns)
    return advantages.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)
