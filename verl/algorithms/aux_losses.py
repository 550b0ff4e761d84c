"""The critic's clipped value loss and the entropy term of the actor loss."""

from __future__ import annotations

import torch

from verl.algorithms.agg import agg_loss
from verl.utils.torch_functional import clip_by_value, entropy_from_logits, masked_mean

__all__ = ["compute_entropy_loss", "compute_value_loss"]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    loss_scale_factor: int | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (PPO2 baselines; Engstrom et al. 2020, arXiv:2005.12729, "value function clipping"):

        v_clip = clip(v, V_old − c, V_old + c);  loss = ½·agg(max((v − R)², (v_clip − R)²)).

    The global-batch arguments go to :func:`agg_loss`.

    Shape: vpreds, returns, values, response_mask (bs, response_length) → (scalar loss, scalar clip fraction).

    Returns:
        ``(vf_loss, vf_clipfrac)``: the loss (with gradient) and the detached fraction of tokens where the clipped
        error was the larger one.
    """
    valid = response_mask != 0
    vpreds_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    err = torch.where(valid, vpreds - returns, torch.zeros_like(vpreds)) ** 2
    err_clipped = torch.where(valid, vpreds_clipped - returns, torch.zeros_like(vpreds)) ** 2
    vf_loss = 0.5 * agg_loss(
        torch.maximum(err, err_clipped),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean((err_clipped > err).to(vf_loss.dtype), response_mask.to(vf_loss.dtype)).detach()
    return vf_loss, vf_clipfrac


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Mean token entropy of ``softmax(logits)``, aggregated with :func:`agg_loss` (the actor subtracts
    ``entropy_coeff`` times it; Williams & Peng 1991's entropy bonus).

    Shape: logits (bs, response_length, vocab), response_mask (bs, response_length) → scalar.
    """
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
