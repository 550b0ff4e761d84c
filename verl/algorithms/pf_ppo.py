"""Policy Filtration PPO (Zhang et al. 2024, arXiv:2409.06957): resample the batch with replacement, weighting each
sample by its score, so the update concentrates on samples whose reward is reliable."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

__all__ = ["compute_pf_ppo_reweight_data", "compute_pf_ppo_weights"]


def compute_pf_ppo_weights(scores: torch.Tensor, reweight_method: str = "pow", weight_pow: float = 2.0) -> torch.Tensor:
    """Sampling weights from per-sample scores: "pow" |s|^p; "max_min" 1 for the best and worst scores, else 0;
    "max_random" 0.4 for the best, else 0.1. A floor of 1e-8 keeps every weight positive.

    Shape: (bs,) → (bs,).
    """
    if reweight_method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif reweight_method == "max_min":
        weights = ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    elif reweight_method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={reweight_method!r}; use 'pow', 'max_min' or 'max_random'")
    return torch.clamp(weights + 1e-8, min=1e-8)


@torch.no_grad()
def compute_pf_ppo_reweight_data(
    data: Any, reweight_method: str = "pow", weight_pow: float = 2.0, generator: torch.Generator | None = None
) -> Any:
    """A copy of ``data`` (a DataProto) resampled with replacement by :func:`compute_pf_ppo_weights` of the summed
    ``token_level_scores``; tensors, non-tensor arrays and per-sample ``meta_info`` lists are all reindexed.

    Args:
        data: batch with ``batch["token_level_scores"]`` (bs, response_length), ``non_tensor_batch`` and ``meta_info``.
        reweight_method: see :func:`compute_pf_ppo_weights`.
        weight_pow: exponent of "pow".
        generator: RNG for the draw (default: torch's global RNG).
    """
    scores = data.batch["token_level_scores"].sum(dim=-1)
    batch_size = scores.shape[0]
    weights = compute_pf_ppo_weights(scores.double(), reweight_method, weight_pow)
    sample = torch.multinomial(weights.cpu(), batch_size, replacement=True, generator=generator)
    sample_np = sample.numpy()

    resampled = copy.copy(data)
    resampled.batch = data.batch[sample.to(scores.device)]
    resampled.non_tensor_batch = {
        key: value[sample_np] if isinstance(value, np.ndarray) else [value[i] for i in sample_np]
        for key, value in data.non_tensor_batch.items()
    }
    resampled.meta_info = {
        key: [value[i] for i in sample_np] if isinstance(value, list) and len(value) == batch_size else value
        for key, value in data.meta_info.items()
    }
    return resampled
