"""`agg_loss`: reduce a per-token loss matrix to the scalar that is back-propagated.

The contract with the actor, which makes the loss independent of how a mini-batch is split over ``dp_size`` data-
parallel ranks and over micro-batches within a rank:

* every rank calls ``agg_loss`` on each of its micro-batches with the same global arguments: ``dp_size``,
  ``batch_num_tokens`` (valid tokens in the whole mini-batch, all ranks) and ``global_batch_size`` (sequences with at
  least one valid token in the whole mini-batch, all ranks);
* it back-propagates each micro-batch loss as is (gradients accumulate, i.e. add up over micro-batches);
* data-parallel gradient reduction averages over ranks (FSDP/DDP), hence the ``· dp_size`` below.

Then (1/dp_size) Σ_ranks Σ_micro-batches agg_loss(micro-batch) equals agg_loss(whole mini-batch) in every mode.
"""

from __future__ import annotations

import torch

from verl.algorithms.config import LOSS_AGG_MODES
from verl.utils.torch_functional import masked_sum

__all__ = ["LOSS_AGG_MODES", "agg_loss"]


def _nonzero(x: torch.Tensor) -> torch.Tensor:
    """``x`` with zeros replaced by ones: dividing a zero sum by it gives 0 instead of NaN."""
    return torch.where(x != 0, x, torch.ones_like(x))


def _as_tensor(count: int | float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(count, device=like.device).to(like.dtype)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    loss_scale_factor: int | float | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat`` over the valid entries of ``loss_mask``; invariant to dp/micro-batch splitting.

    With N = ``batch_num_tokens``, S = ``global_batch_size``, D = ``dp_size`` and ℓ_i = Σ_t L_it·m_it:

    * "token-mean": Σ_it L·m / N · D (DAPO's token-level loss, arXiv:2503.14476);
    * "token-sum": Σ_it L·m · D (no normalisation: the gradient is the sum over the mini-batch's tokens);
    * "seq-mean-token-sum": Σ_i ℓ_i / S · D;
    * "seq-mean-token-mean": Σ_i (ℓ_i / Σ_t m_it) / S · D (GRPO, arXiv:2402.03300, Eq. 3);
    * "seq-mean-token-sum-norm": Σ_i ℓ_i / S · D / F (Dr.GRPO, arXiv:2503.20783: sequence sums over a constant),
      F = ``loss_scale_factor``, default the padded response length ``loss_mask.shape[-1]``;
    * "seq-mean-token-sum-norm-legacy": Σ_i ℓ_i · D / F, what "seq-mean-token-sum-norm" meant before veRL 0.8
      (no mean over the sequences: the loss grows with the batch size).

    N and S default to the local counts, which is only right for ``dp_size == 1``. Fully masked sequences count in
    no mode; an all-masked input (or a zero count) gives 0, not NaN.

    Shape: ``loss_mat``, ``loss_mask`` (bs, response_length) → scalar (at least fp32).

    Raises:
        ValueError: unknown ``loss_agg_mode``; ``dp_size > 1`` without the global count the mode needs; a
            ``loss_scale_factor`` that is not > 0.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode={loss_agg_mode!r}; use one of {list(LOSS_AGG_MODES)}")
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)} must match")
    if dp_size < 1:
        raise ValueError(f"dp_size={dp_size} must be >= 1")
    if loss_scale_factor is not None and not loss_scale_factor > 0:
        raise ValueError(f"loss_scale_factor={loss_scale_factor} must be > 0")
    loss_mat = loss_mat.to(torch.promote_types(loss_mat.dtype, torch.float32))
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss(token-mean) needs the global batch_num_tokens when dp_size > 1")
            batch_num_tokens = mask.sum()
        return masked_sum(loss_mat, mask) / _nonzero(_as_tensor(batch_num_tokens, mask)) * dp_size
    scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, mask) * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm-legacy":
        return masked_sum(loss_mat, mask) * dp_size / scale

    seq_tokens = mask.sum(dim=-1)
    seq_losses = masked_sum(loss_mat, mask, axis=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / _nonzero(seq_tokens)
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError(f"agg_loss({loss_agg_mode}) needs the global global_batch_size when dp_size > 1")
        global_batch_size = (seq_tokens > 0).sum()
    loss = seq_losses.sum() / _nonzero(_as_tensor(global_batch_size, mask)) * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / scale
    return loss
