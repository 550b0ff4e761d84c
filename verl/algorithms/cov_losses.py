"""Covariance-based policy losses of Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models" (arXiv:2505.22617): Clip-Cov and KL-Cov control entropy collapse by acting on the few
tokens whose (advantage, log-prob) covariance is large. Same contract as ``policy_losses``.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms._common import cfg_get, clip_bounds, global_batch_kwargs
from verl.algorithms.agg import agg_loss
from verl.algorithms.policy_losses import (
    LOG_RATIO_BOUND,
    apply_is_weights,
    pg_metrics,
    prepare_policy_inputs,
)
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean

__all__ = ["compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov"]


def _centered_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token (A − mean A)(log π − mean log π), means over the valid tokens (no gradient)."""
    log_prob = log_prob.detach()
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


def _fraction(config: Any, key: str, default: float) -> float:
    value = float(cfg_get(cfg_get(config, "policy_loss", None), key, default))
    if not 0 < value <= 1:
        raise ValueError(f"actor.policy_loss.{key}={value} must be a fraction in (0, 1]")
    return value


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clip-Cov: the PPO clipped loss, except that a random ``clip_cov_ratio`` of the valid tokens (at
    least one) whose covariance lies in (``clip_cov_lb``, ``clip_cov_ub``), among those PPO did not clip already,
    are detached: their loss and gradient are 0. The draw uses torch's global RNG.

    Metrics: ``pg_clipfrac`` is the fraction of detached tokens.

    Shape: (bs, response_length) inputs → scalar loss.
    """
    old_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    policy_loss = cfg_get(config, "policy_loss", None)
    ratio_to_detach = _fraction(config, "clip_cov_ratio", 0.0002)
    lower, upper = float(cfg_get(policy_loss, "clip_cov_lb", 1.0)), float(cfg_get(policy_loss, "clip_cov_ub", 5.0))
    clip_low, clip_high = clip_bounds(config)

    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    with torch.no_grad():
        cov = _centered_covariance(advantages, log_prob, mask)
        candidates = valid & ~(clipped > unclipped) & (cov > lower) & (cov < upper)
        candidate_idx = torch.nonzero(candidates.reshape(-1)).squeeze(-1)
        n_detach = max(int(ratio_to_detach * float(mask.sum())), 1)
        chosen = candidate_idx[torch.randperm(candidate_idx.numel(), device=candidate_idx.device)[:n_detach]]
        keep = torch.ones_like(mask).reshape(-1).index_fill_(0, chosen, 0.0).reshape(mask.shape)
    pg_losses = apply_is_weights(torch.maximum(unclipped, clipped) * keep, rollout_is_weights, valid)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, **global_batch_kwargs(config))
    with torch.no_grad():
        metrics = pg_metrics(masked_mean((keep == 0).to(mask.dtype), mask), masked_mean(-log_ratio, mask), 0.0)
    return loss, metrics


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """KL-Cov: the unclipped surrogate −A·r, plus ``ppo_kl_coef``·|log π − log π_old| on the
    ``kl_cov_ratio`` of valid tokens (at least one) with the largest covariance.

    Metrics: ``ppo_kl`` is the mean |log π − log π_old| (as in veRL); ``pg_clipfrac`` the fraction penalised.

    Shape: (bs, response_length) inputs → scalar loss.
    """
    old_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    ratio_to_penalise = _fraction(config, "kl_cov_ratio", 0.0002)
    coef = float(cfg_get(cfg_get(config, "policy_loss", None), "ppo_kl_coef", 0.1))

    log_ratio = log_prob - old_log_prob
    abs_kl = log_ratio.abs()
    pg_losses = -advantages * torch.exp(torch.clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    with torch.no_grad():
        penalise = torch.zeros_like(valid)
        n_valid = int(valid.sum())
        if n_valid > 0:
            cov = _centered_covariance(advantages, log_prob, mask).masked_fill(~valid, float("-inf"))
            top = torch.topk(cov.reshape(-1), max(1, int(n_valid * ratio_to_penalise))).indices
            penalise.reshape(-1)[top] = True
    pg_losses = torch.where(penalise, pg_losses + coef * abs_kl, pg_losses)
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights, valid)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, **global_batch_kwargs(config))
    with torch.no_grad():
        metrics = pg_metrics(masked_mean(penalise.to(mask.dtype), mask), masked_mean(abs_kl, mask), 0.0)
    return loss, metrics
