"""Tensor helpers shared by the algorithms and the workers: masked statistics, log-probs and entropy from logits,
response masks, padding, and grouping samples by id.

Every function here is pure (no distributed state, no config) except :func:`distributed_masked_mean`, which
reduces over the default process group when one is initialized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "as_torch_index",
    "clip_by_value",
    "compute_position_id_with_mask",
    "distributed_masked_mean",
    "entropy_from_logits",
    "entropy_from_logits_with_chunking",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_response_mask",
    "group_mean",
    "group_mean_std",
    "group_sum",
    "has_active_dropout",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "pad_2d_list_to_length",
    "pad_sequence_to_length",
    "sum_pi_squared_from_logits",
]

# Upper bound on the number of logits one chunk of `logprobs_from_logits` touches at a time (64 MiB in fp32).
LOGPROB_CHUNK_ELEMENTS = 1 << 24


# ----------------------------------------------------------------------------------------------------------------
# Masked statistics
# ----------------------------------------------------------------------------------------------------------------
def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask over ``axis`` (all elements when ``None``); masked entries never leak NaN/inf into the sum.

    Shape: ``values`` and ``mask`` broadcast together; the result drops ``axis``.
    """
    valid = torch.where(mask != 0, values, torch.zeros((), dtype=values.dtype, device=values.device))
    # `valid` is a fresh tensor that `where` does not save for backward, so it may be scaled in place.
    in_place = valid.shape == mask.shape and not mask.requires_grad and torch.result_type(valid, mask) == valid.dtype
    valid = valid.mul_(mask) if in_place else valid * mask
    return valid.sum() if axis is None else valid.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the entries where ``mask`` is non-zero (weighted by ``mask``); 0 where none is.

    Shape: ``values`` and ``mask`` broadcast together; the result drops ``axis``.
    """
    total = masked_sum(values, mask, axis)
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    count = count.to(total.dtype)
    return total / torch.where(count > 0, count, torch.ones_like(count))


def _masked_moments(values: torch.Tensor, mask: torch.Tensor, unbiased: bool):
    """(mean, variance, values − mean) over the masked entries."""
    mean = masked_mean(values, mask)
    centered = values - mean
    variance = masked_mean(centered * centered, mask)
    if unbiased:
        count = float(mask.sum())
        if count == 0:
            raise ValueError("masked_var: the mask selects no element")
        if count == 1:
            raise ValueError("masked_var: the mask selects a single element; its unbiased variance is undefined")
        variance = variance * (count / (count - 1))
    return mean, variance, centered


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries of ``values`` (a scalar), with Bessel's correction when ``unbiased``.

    Raises:
        ValueError: ``mask`` selects no entry, or (``unbiased``) exactly one.
    """
    return _masked_moments(values, mask, unbiased)[1]


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values − mean) / sqrt(var + 1e-8) over the masked entries; adds the mean back when not ``shift_mean``.

    Shape: same as ``values``. Raises like :func:`masked_var` on masks with fewer than two entries.
    """
    mean, variance, centered = _masked_moments(values, mask, unbiased=True)
    scale = torch.rsqrt(variance + 1e-8)
    whitened = centered * scale if torch.is_grad_enabled() else centered.mul_(scale)
    return whitened if shift_mean else whitened + mean


def distributed_masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:func:`masked_mean` over all ranks of the default process group (local when none is initialized)."""
    total = masked_sum(values, mask).double()
    count = mask.sum().double()
    if dist.is_available() and dist.is_initialized():
        stats = torch.stack([total, count])
        dist.all_reduce(stats)
        total, count = stats[0], stats[1]
    mean = total / count if count > 0 else torch.zeros_like(total)
    return mean.to(values.dtype)


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor | float, tensor_max: torch.Tensor | float) -> torch.Tensor:
    """Element-wise ``min(max(x, tensor_min), tensor_max)`` where the bounds may be tensors."""
    lower = torch.as_tensor(tensor_min, dtype=x.dtype, device=x.device)
    upper = torch.as_tensor(tensor_max, dtype=x.dtype, device=x.device)
    return torch.minimum(torch.maximum(x, lower), upper)


# ----------------------------------------------------------------------------------------------------------------
# Log-probs and entropy
# ----------------------------------------------------------------------------------------------------------------
def _row_chunks(num_rows: int, vocab: int) -> list[tuple[int, int]]:
    rows = max(1, LOGPROB_CHUNK_ELEMENTS // max(vocab, 1))
    return [(start, min(start + rows, num_rows)) for start in range(0, num_rows, rows)]


class _LogprobsFromLogits(torch.autograd.Function):
    """log softmax(logits)[label], computed chunk by chunk; saves only the logits and one log-normaliser per row."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        flat_labels = labels.reshape(-1, 1).long()
        out_dtype = torch.promote_types(logits.dtype, torch.float32)
        logprobs = torch.empty(flat.shape[0], dtype=out_dtype, device=logits.device)
        lse = torch.empty_like(logprobs)
        for start, end in _row_chunks(flat.shape[0], vocab):
            chunk = flat[start:end].to(out_dtype)
            lse[start:end] = torch.logsumexp(chunk, dim=-1)
            logprobs[start:end] = chunk.gather(-1, flat_labels[start:end]).squeeze(-1) - lse[start:end]
        ctx.save_for_backward(logits, flat_labels, lse)
        return logprobs.reshape(labels.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, flat_labels, lse = ctx.saved_tensors
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        grad_flat = grad_out.reshape(-1, 1).to(lse.dtype)
        grad_logits = torch.empty_like(flat)
        for start, end in _row_chunks(flat.shape[0], vocab):
            go = grad_flat[start:end]
            # d/dx_j [x_label - logsumexp(x)] = 1[j = label] - softmax(x)_j
            grad = torch.exp(flat[start:end].to(lse.dtype) - lse[start:end, None]).mul_(-go)
            grad.scatter_add_(-1, flat_labels[start:end], go)
            grad_logits[start:end] = grad
        return grad_logits.reshape(logits.shape), None


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``, without materialising a full softmax copy.

    The forward and backward passes walk the flattened rows in chunks of at most ``LOGPROB_CHUNK_ELEMENTS`` logits,
    so the extra memory is one chunk, not one more ``(..., vocab)`` tensor. Low-precision logits are upcast per chunk,
    and the result is at least fp32.

    Shape: ``logits`` (..., vocab), ``labels`` (...) → (...).

    Args:
        logits: unnormalised scores.
        labels: token ids to score.
        inplace_backward: accepted for veRL compatibility; the gradient is always written to a fresh buffer so that
            other consumers of ``logits`` (e.g. the entropy) keep a valid graph.
    """
    del inplace_backward
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape without the vocab dim "
            f"{tuple(logits.shape[:-1])}"
        )
    return _LogprobsFromLogits.apply(logits, labels)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` along the last dim: logsumexp(x) − Σ softmax(x)·x.

    Shape: (..., vocab) → (...); computed in at least fp32.
    """
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    probs = torch.softmax(x, dim=-1)
    return torch.logsumexp(x, dim=-1) - (probs * x).sum(dim=-1)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """:func:`entropy_from_logits` over ``chunk_size`` rows at a time, bounding the softmax temporary.

    Shape: (rows, vocab) → (rows,). Meant for no-grad passes (under autograd each chunk keeps its softmax).
    """
    if logits.dim() != 2:
        raise ValueError(f"entropy_from_logits_with_chunking expects (rows, vocab) logits, got {tuple(logits.shape)}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    out = torch.empty(logits.shape[0], dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    for start in range(0, logits.shape[0], chunk_size):
        out[start : start + chunk_size] = entropy_from_logits(logits[start : start + chunk_size])
    return out


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Σ_v softmax(logits)_v², the per-token quantity the optimal-token-baseline estimator needs.

    Shape: (..., vocab) → (...); computed in at least fp32.
    """
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.exp(torch.logsumexp(2 * x, dim=-1) - 2 * torch.logsumexp(x, dim=-1))


# ----------------------------------------------------------------------------------------------------------------
# Masks, positions and padding
# ----------------------------------------------------------------------------------------------------------------
def get_response_mask(
    response_id: torch.Tensor, eos_token: int | Sequence[int] = 2, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """1 for every response token up to and including the first EOS token, 0 after it.

    Shape: (bs, response_length) → (bs, response_length).

    Args:
        response_id: generated token ids (right padded).
        eos_token: one EOS id or several.
        dtype: dtype of the mask.
    """
    eos = torch.as_tensor(eos_token, device=response_id.device).reshape(-1)
    is_eos = torch.isin(response_id, eos).to(torch.int64)
    eos_before = is_eos.cumsum(dim=-1) - is_eos  # EOS tokens strictly before each position
    return (eos_before == 0).to(dtype)


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip padding: cumsum(mask) − 1, clipped at 0. Shape: (bs, seq_len) → (bs, seq_len)."""
    return torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0)


def pad_sequence_to_length(
    tensors: torch.Tensor, max_seq_len: int, pad_token_id: int | float, left_pad: bool = False
) -> torch.Tensor:
    """Pad the last dim of ``tensors`` to ``max_seq_len`` with ``pad_token_id`` (no-op when already long enough)."""
    missing = max_seq_len - tensors.shape[-1]
    if missing <= 0:
        return tensors
    pad = (missing, 0) if left_pad else (0, missing)
    return torch.nn.functional.pad(tensors, pad, value=pad_token_id)


def pad_2d_list_to_length(
    response: Sequence[Sequence[int]], pad_token_id: int, max_length: int | None = None
) -> torch.Tensor:
    """Right-pad a list of token-id lists into a ``(len(response), max(max_length, longest))`` tensor."""
    longest = max((len(row) for row in response), default=0)
    width = longest if max_length is None else max(longest, max_length)
    out = torch.full((len(response), width), pad_token_id, dtype=torch.long)
    for i, row in enumerate(response):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Grouping samples by id (e.g. the prompt `uid` shared by the n responses to one prompt)
# ----------------------------------------------------------------------------------------------------------------
def as_torch_index(index: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """Map arbitrary group ids (uid strings, ints, a tensor) to dense group numbers ``0..K-1``.

    Samples share a number exactly when their ids are equal. Object arrays are hashed (pandas.factorize), numeric
    arrays and tensors are sorted (unique); either way there is no Python loop over the samples.

    Shape: (bs,) → (bs,) int64.
    """
    if torch.is_tensor(index):
        if index.dim() != 1:
            raise ValueError(f"index must be 1-D, got shape {tuple(index.shape)}")
        _, inverse = torch.unique(index, return_inverse=True)
        return inverse.to(device=device or index.device, dtype=torch.long)
    array = np.asarray(index)
    if array.ndim != 1:
        raise ValueError(f"index must be 1-D, got shape {array.shape}")
    if array.dtype == object:
        import pandas as pd

        codes, _ = pd.factorize(array, use_na_sentinel=False)
        inverse = np.asarray(codes, dtype=np.int64)
    else:
        _, inverse = np.unique(array, return_inverse=True)
    return torch.from_numpy(inverse.astype(np.int64, copy=False)).to(device=device)


def group_sum(values: torch.Tensor, group: torch.Tensor, num_groups: int | None = None) -> torch.Tensor:
    """Σ of ``values`` rows per group. Shape: values (bs, ...), group (bs,) → (num_groups, ...)."""
    if num_groups is None:
        num_groups = int(group.max()) + 1 if group.numel() else 0
    out = torch.zeros((num_groups, *values.shape[1:]), dtype=values.dtype, device=values.device)
    return out.index_add_(0, group, values)


def group_mean(
    values: torch.Tensor, gidx: torch.Tensor, num_groups: int, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group (weighted) mean of ``values`` and the per-group total weight; 0 for a group of zero weight.

    Each group is shifted by its minimum before summing, so a group of equal values has exactly that value as mean.

    Shape: values, gidx, weights (bs,) → two (num_groups,) tensors.
    """
    weights = torch.ones_like(values) if weights is None else weights
    shift = torch.full((num_groups,), float("inf"), dtype=values.dtype, device=values.device)
    shift = shift.scatter_reduce(0, gidx, values, reduce="amin")
    total_weight = group_sum(weights, gidx, num_groups)
    shifted_sum = group_sum(weights * (values - shift[gidx]), gidx, num_groups)
    has_weight = total_weight > 0
    mean = torch.where(has_weight, shift + shifted_sum / torch.where(has_weight, total_weight, 1.0), 0.0)
    return mean, total_weight


def group_mean_std(
    scores: torch.Tensor, gidx: torch.Tensor, eps: float = 1e-6, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group mean, unbiased std and count of ``scores``; a singleton group gets mean 0 and std 1 (GRPO's rule).

    Each group is shifted by its minimum before summing, so a group of equal scores has mean equal to that score and
    std exactly 0. Statistics are computed in fp64.

    Shape: scores (bs,), gidx (bs,) dense ids → three (num_groups,) tensors.

    Args:
        scores: one scalar per sample.
        gidx: dense group numbers from :func:`as_torch_index`.
        eps: floor on the variance (veRL's default 1e-6, i.e. std >= 1e-3; the estimators pass 0).
        device: where to compute (default: the device of ``scores``).
    """
    if scores.shape != gidx.shape or scores.dim() != 1:
        raise ValueError(f"scores {tuple(scores.shape)} and gidx {tuple(gidx.shape)} must be equal 1-D shapes")
    scores = scores.to(device=device or scores.device, dtype=torch.float64)
    gidx = gidx.to(device=scores.device, dtype=torch.long)
    k = int(gidx.max()) + 1 if gidx.numel() else 0
    mean, count = group_mean(scores, gidx, k)
    centered = scores - mean[gidx]
    var = group_sum(centered * centered, gidx, k) / (count - 1).clamp_min(1)
    std = var.clamp_min(eps).sqrt()
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean, std, count


def has_active_dropout(module: torch.nn.Module) -> bool:
    """Whether ``module`` in train mode is random: a dropout layer with p > 0, or a Hugging Face config dropout
    rate > 0 (``attention_dropout``, ``hidden_dropout_prob``, ``resid_pdrop``, ...), which models apply
    functionally."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules()):
        return True
    config = getattr(module, "config", None)
    settings = config.to_dict() if hasattr(config, "to_dict") else {}
    return any(
        ("dropout" in name or name.endswith("pdrop")) and isinstance(value, (int, float)) and value > 0
        for name, value in settings.items()
        if not isinstance(value, bool)
    )


# ----------------------------------------------------------------------------------------------------------------
# Learning-rate schedules (veRL's names; the multipliers are the engine's, verl.workers.engine.lr_schedule)
# ----------------------------------------------------------------------------------------------------------------
def get_constant_schedule_with_warmup(
    optimizer: torch.optim.Optimizer, num_warmup_steps: int, last_epoch: int = -1
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` rising linearly from 0 to the optimizer's lr over ``num_warmup_steps`` steps, then flat."""
    import functools

    from verl.workers.engine.lr_schedule import constant_schedule_with_warmup

    factor = functools.partial(constant_schedule_with_warmup, warmup_steps=num_warmup_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch=last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer: torch.optim.Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    init_lr_ratio: float | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR``: linear warmup over ``num_warmup_steps`` (from ``init_lr_ratio`` × lr, default 0), then a
    cosine decay to ``min_lr_ratio`` × lr at ``num_training_steps``."""
    from verl.workers.engine.lr_schedule import cosine_schedule_with_warmup

    start = float(init_lr_ratio or 0.0)

    def factor(step: int) -> float:
        value = cosine_schedule_with_warmup(
            step,
            warmup_steps=num_warmup_steps,
            total_steps=num_training_steps,
            min_lr_ratio=min_lr_ratio,
            num_cycles=num_cycles,
        )
        return start + (1.0 - start) * value if step < num_warmup_steps else value

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch=last_epoch)
