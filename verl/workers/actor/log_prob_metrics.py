"""The metrics of the actor's old-log-prob pass, carried back to the driver in ``meta_info["metrics"]``."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.rollout_corr_helper import compute_rollout_corr_metrics_from_logprobs
from verl.protocol import DataProto
from verl.utils.torch_functional import masked_mean

__all__ = ["metrics_meta", "old_log_prob_metrics", "rollout_mismatch_metrics"]


def old_log_prob_metrics(data: DataProto, old_log_probs: torch.Tensor, entropys: torch.Tensor) -> dict[str, float]:
    """The old-log-prob pass's metrics: ``actor/entropy`` and, against ``rollout_log_probs``, the mismatch ones."""
    if "response_mask" not in data.batch.keys():
        return {}
    mask = data.batch["response_mask"]
    metrics = {"actor/entropy": float(masked_mean(entropys, mask))}
    if "rollout_log_probs" in data.batch.keys():
        metrics.update(rollout_mismatch_metrics(old_log_probs, data.batch["rollout_log_probs"], mask))
    return metrics


def metrics_meta(metrics: dict[str, Any]) -> dict[str, Any]:
    """meta_info carrying per-rank metrics (merged into lists by ``DataProto.concat``)."""
    return {"metrics": dict(metrics)}


def rollout_mismatch_metrics(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Train-vs-rollout mismatch on the same tokens: |p_train − p_rollout| stats plus ``rollout_corr/*``."""
    mask = response_mask.bool()
    if not bool(mask.any()):
        return {}
    diff = (old_log_probs.exp() - rollout_log_probs.exp()).abs()[mask]
    metrics = {
        "training/rollout_probs_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_std": float(diff.std()) if diff.numel() > 1 else 0.0,
    }
    metrics.update(compute_rollout_corr_metrics_from_logprobs(old_log_probs, rollout_log_probs, response_mask))
    return metrics
