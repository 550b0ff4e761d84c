"""Rollout correction: the rollout engine (vLLM in bf16, an older checkpoint, …) samples with π_rollout while the
trainer computes π_train; this module measures and corrects the mismatch (``algorithm.rollout_correction.*``).

* Importance weights w = π_train/π_rollout per token or per sequence (product), truncated at an upper bound (TIS,
  Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"), or zeroed outside
  [lower, upper] (masked IS, IcePop-style).
* Rejection sampling: tokens or whole sequences whose ratio (k1) or divergence estimate (k2, k3) leaves its bounds
  are removed from the response mask (Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from
  the Training-Inference Mismatch").
* Bypass mode: the rollout log-probs stand in for the old log-probs.
* Mismatch metrics (``rollout_corr/*``): |Δ log p|, KL estimates, perplexities and their ratio, χ².

All tensor functions take (bs, response_length) tensors; log-ratios are clamped to ±20 before exponentiating.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from verl.algorithms._common import cfg_get, check_same_shape
from verl.algorithms.config import (
    SUPPORTED_ROLLOUT_RS_OPTIONS,
    parse_rollout_is_threshold,
    parse_rollout_rs_thresholds,
)
from verl.utils.torch_functional import distributed_masked_mean, masked_mean, masked_sum

__all__ = [
    "SAFETY_BOUND",
    "SUPPORTED_ROLLOUT_RS_OPTIONS",
    "apply_bypass_mode",
    "bypass_policy_loss_config",
    "compute_offpolicy_metrics",
    "compute_rollout_corr_metrics_from_logprobs",
    "compute_rollout_correction_and_add_to_batch",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
]

SAFETY_BOUND = 20.0


def _masked_extreme(values: torch.Tensor, valid: torch.Tensor, largest: bool) -> float:
    if not bool(valid.any()):
        return 0.0
    fill = float("-inf") if largest else float("inf")
    filled = values.masked_fill(~valid, fill)
    return float(filled.max() if largest else filled.min())


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights π_train/π_rollout from ``log_ratio`` = log π_train − log π_rollout.

    "token": w_t = exp(log_ratio_t); "sequence": w_t = exp(Σ_t' log_ratio_t') on every token of the sequence. Then
    a single bound truncates (w ← min(w, upper)); a "lower_upper" bound zeroes weights outside [lower, upper].
    ``rollout_is_batch_normalize`` rescales to mean 1 (over tokens, or over sequences; across ranks when a process
    group is up). Weights are 0 on padding and carry no gradient.

    Shape: (bs, response_length) → weights (bs, response_length), metrics (without the ``rollout_corr/`` prefix).
    """
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"rollout_is={rollout_is!r}; use 'token' or 'sequence'")
    check_same_shape(log_ratio=log_ratio, response_mask=response_mask)
    lower, upper = parse_rollout_is_threshold(rollout_is_threshold)
    log_ratio = log_ratio.detach().to(torch.promote_types(log_ratio.dtype, torch.float32))
    valid = response_mask != 0
    mask = valid.to(log_ratio.dtype)
    log_ratio = torch.where(valid, log_ratio, torch.zeros_like(log_ratio))
    if rollout_is == "token":
        log_w = log_ratio
    else:
        log_w = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    raw = torch.exp(torch.clamp(log_w, -SAFETY_BOUND, SAFETY_BOUND)) * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))

    seq_valid = valid.any(dim=-1)
    low_bound = 1.0 / upper if lower is None else lower
    # Fractions of ratios outside the bounds: per token, or per (non-empty) sequence for sequence weights.
    unit_log_w, unit_mask = (log_w, mask) if rollout_is == "token" else (log_w[:, 0], seq_valid.to(mask.dtype))
    metrics = {
        "rollout_is_mean": float(masked_mean(weights, mask)),
        "rollout_is_max": _masked_extreme(raw, valid, largest=True),
        "rollout_is_min": _masked_extreme(raw, valid, largest=False),
        "rollout_is_std": float(masked_mean((weights - masked_mean(weights, mask)) ** 2, mask).sqrt()),
        "rollout_is_ratio_fraction_high": float(masked_mean((unit_log_w > math.log(upper)).to(mask.dtype), unit_mask)),
        "rollout_is_ratio_fraction_low": float(
            masked_mean((unit_log_w < math.log(low_bound)).to(mask.dtype), unit_mask)
        ),
    }
    mean_w = masked_mean(weights, mask)
    second_moment = masked_mean((weights / mean_w.clamp_min(1e-8)) ** 2, mask)
    metrics["rollout_is_eff_sample_size"] = float(1.0 / second_moment.clamp_min(1e-8)) if bool(valid.any()) else 0.0
    seq_weights = masked_mean(weights, mask, axis=-1)[seq_valid]
    if seq_weights.numel():
        metrics.update(
            rollout_is_seq_mean=float(seq_weights.mean()),
            rollout_is_seq_max=float(seq_weights.max()),
            rollout_is_seq_min=float(seq_weights.min()),
        )
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = float(masked_mean(((raw < lower) | (raw > upper)).to(mask.dtype), mask))

    if rollout_is_batch_normalize:
        if rollout_is == "token":
            norm = distributed_masked_mean(weights, mask)
        else:
            # every valid token of a sequence carries its weight and padding carries 0, so the row max is it
            norm = distributed_masked_mean(weights.amax(dim=-1), seq_valid.to(weights.dtype))
        norm_value = float(norm)
        if norm_value > 1e-8:
            weights = weights / norm_value
        metrics["rollout_is_batch_norm_factor"] = norm_value if norm_value > 1e-8 else 1.0
    return weights, metrics


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Remove from ``response_mask`` the tokens (``token_*``) or whole sequences (``seq_*``) that fail any of the
    comma-separated ``rollout_rs`` criteria.

    With ℓ = log π_train − log π_rollout: k1 options keep lower ≤ exp(ℓ) ≤ upper (token ratio; ``seq_sum``: the
    sequence's product ratio; ``seq_mean``: its geometric mean); k2 (½ℓ²) and k3 (e^ℓ − 1 − ℓ) options keep the
    token value, or its sequence sum/mean/max, ≤ upper.

    Shape: (bs, response_length) → (mask of ``response_mask``'s dtype, metrics without the ``rollout_corr/`` prefix).
    """
    check_same_shape(log_ratio=log_ratio, response_mask=response_mask)
    bounds = parse_rollout_rs_thresholds(rollout_rs, rollout_rs_threshold)
    valid = response_mask != 0
    mask = valid.to(torch.promote_types(log_ratio.dtype, torch.float32))
    ell = torch.where(valid, torch.clamp(log_ratio.detach(), -SAFETY_BOUND, SAFETY_BOUND), torch.zeros_like(mask))
    per_token = {"k1": ell, "k2": 0.5 * ell**2, "k3": torch.exp(ell) - 1.0 - ell}
    keep = valid.clone()
    seq_valid = valid.any(dim=-1)
    metrics: dict[str, float] = {}
    for option, (lower, upper) in bounds.items():
        level, estimator = option.rsplit("_", 1)
        values = per_token[estimator]
        if level == "token":
            stat = values
        elif level == "seq_sum":
            stat = masked_sum(values, mask, axis=-1)
        elif level == "seq_mean":
            stat = masked_mean(values, mask, axis=-1)
        else:  # seq_max
            stat = values.masked_fill(~valid, float("-inf")).max(dim=-1).values
            stat = torch.where(seq_valid, stat, torch.zeros_like(stat))
        if estimator == "k1":
            passed = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            passed = stat <= upper
        stat_valid = valid if level == "token" else seq_valid
        if level != "token":
            passed = passed.unsqueeze(-1).expand_as(valid)
        option_keep = passed | ~valid
        keep &= option_keep
        prefix = f"rollout_rs_{option}"
        metrics[f"{prefix}_mean"] = float(stat[stat_valid].mean()) if bool(stat_valid.any()) else 0.0
        metrics[f"{prefix}_max"] = _masked_extreme(stat, stat_valid, largest=True)
        metrics[f"{prefix}_min"] = _masked_extreme(stat, stat_valid, largest=False)
        metrics[f"{prefix}_masked_fraction"] = float(masked_mean((~option_keep).to(mask.dtype), mask))
        seq_rejected = (~option_keep & valid).any(dim=-1)
        metrics[f"{prefix}_seq_masked_fraction"] = (
            float(seq_rejected[seq_valid].float().mean()) if seq_valid.any() else 0.0
        )
    metrics["rollout_rs_masked_fraction"] = float(masked_mean((~keep).to(mask.dtype), mask))
    seq_rejected = (~keep & valid).any(dim=-1)
    metrics["rollout_rs_seq_masked_fraction"] = (
        float(seq_rejected[seq_valid].float().mean()) if seq_valid.any() else 0.0
    )
    return (response_mask * keep.to(response_mask.dtype)).to(response_mask.dtype), metrics


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """Mismatch diagnostics between the training policy (``old_log_prob``) and the rollout policy.

    ``training_ppl`` / ``rollout_ppl``: mean over sequences of exp(−mean_t log p) (and their ``*_log_ppl``);
    ``log_ppl_diff`` (mean, ``_abs``, ``_max``, ``_min``) and ``ppl_ratio`` = mean exp(log_ppl_diff): per-sequence
    log(PPL_train/PPL_rollout); ``kl`` (k1) and ``k3_kl``: KL(π_rollout‖π_train) estimates; ``chi2_token`` /
    ``chi2_seq``: E[w²] − 1 for token / sequence weights; ``log_prob_abs_diff_mean`` / ``_max``: |Δ log p| over tokens.
    Sequences without a valid token are left out.

    Shape: (bs, response_length) inputs → metrics without the ``rollout_corr/`` prefix.
    """
    check_same_shape(old_log_prob=old_log_prob, rollout_log_prob=rollout_log_prob, response_mask=response_mask)
    valid = response_mask != 0
    dtype = torch.promote_types(old_log_prob.dtype, torch.float32)
    mask = valid.to(dtype)
    seq_valid = valid.any(dim=-1)
    if not bool(seq_valid.any()):
        return {}
    train = torch.where(valid, old_log_prob.detach().to(dtype), torch.zeros_like(mask))
    train_seq = masked_mean(train, mask, axis=-1)[seq_valid]
    metrics = {"training_ppl": float(torch.exp(-train_seq).mean()), "training_log_ppl": float(-train_seq.mean())}
    if rollout_log_prob is None:
        return metrics
    rollout = torch.where(valid, rollout_log_prob.detach().to(dtype), torch.zeros_like(mask))
    rollout_seq = masked_mean(rollout, mask, axis=-1)[seq_valid]
    log_ratio = train - rollout
    log_ppl_diff = rollout_seq - train_seq
    safe = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    seq_log_ratio = torch.clamp(masked_sum(log_ratio, mask, axis=-1)[seq_valid], -SAFETY_BOUND, SAFETY_BOUND)
    metrics.update(
        rollout_ppl=float(torch.exp(-rollout_seq).mean()),
        rollout_log_ppl=float(-rollout_seq.mean()),
        kl=float(masked_mean(-log_ratio, mask)),
        k3_kl=float(masked_mean(torch.exp(safe) - safe - 1.0, mask)),
        log_ppl_diff=float(log_ppl_diff.mean()),
        log_ppl_abs_diff=float(log_ppl_diff.abs().mean()),
        log_ppl_diff_max=float(log_ppl_diff.max()),
        log_ppl_diff_min=float(log_ppl_diff.min()),
        ppl_ratio=float(torch.exp(log_ppl_diff).mean()),
        chi2_token=float(masked_mean(torch.exp(2 * safe), mask) - 1.0),
        chi2_seq=float(torch.exp(2 * seq_log_ratio).mean() - 1.0),
        log_prob_abs_diff_mean=float(masked_mean(log_ratio.abs(), mask)),
        log_prob_abs_diff_max=_masked_extreme(log_ratio.abs(), valid, largest=True),
    )
    return metrics


def _prefixed(metrics: dict[str, float]) -> dict[str, float]:
    return {f"rollout_corr/{key}": value for key, value in metrics.items()}


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights (when ``rollout_is`` is set), the rejection-sampled mask (when ``rollout_rs`` is set) and every
    metric, prefixed ``rollout_corr/``.

    Unlike veRL, which wraps the weights in a DataProto, this returns the weights tensor itself.

    Shape: (bs, response_length) inputs → (weights or None, mask, metrics).
    """
    check_same_shape(old_log_prob=old_log_prob, rollout_log_prob=rollout_log_prob, response_mask=response_mask)
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if rollout_rs is not None:
        mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, _prefixed(metrics)


def compute_rollout_correction_and_add_to_batch(batch: Any, rollout_corr_config: Any) -> tuple[Any, dict[str, float]]:
    """Apply ``algorithm.rollout_correction`` to a DataProto in place: ``response_mask`` loses the rejected entries
    and, when ``rollout_is`` is set, ``rollout_is_weights`` is added. Needs ``old_log_probs``, ``rollout_log_probs``
    and ``response_mask`` in ``batch.batch``. Returns ``(batch, metrics)``.
    """
    for key in ("old_log_probs", "rollout_log_probs", "response_mask"):
        if key not in batch.batch.keys():
            raise ValueError(f"rollout correction needs batch['{key}'] (rollout.calculate_log_probs=True for rollout)")
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=batch.batch["old_log_probs"],
        rollout_log_prob=batch.batch["rollout_log_probs"],
        response_mask=batch.batch["response_mask"],
        rollout_is=cfg_get(rollout_corr_config, "rollout_is", None),
        rollout_is_threshold=cfg_get(rollout_corr_config, "rollout_is_threshold", 2.0),
        rollout_is_batch_normalize=bool(cfg_get(rollout_corr_config, "rollout_is_batch_normalize", False)),
        rollout_rs=cfg_get(rollout_corr_config, "rollout_rs", None),
        rollout_rs_threshold=cfg_get(rollout_corr_config, "rollout_rs_threshold", None),
    )
    batch.batch["response_mask"] = mask
    if weights is not None:
        batch.batch["rollout_is_weights"] = weights
    return batch, metrics


def compute_rollout_corr_metrics_from_logprobs(
    log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """:func:`compute_offpolicy_metrics` of the current policy against the rollout policy, prefixed ``rollout_corr/``
    (the actor logs it during the update to follow the gap)."""
    return _prefixed(compute_offpolicy_metrics(log_prob, rollout_log_prob, response_mask))


def apply_bypass_mode(batch: Any, rollout_corr_config: Any = None, policy_loss_config: Any = None) -> None:
    """Bypass mode: ``batch["old_log_probs"] := batch["rollout_log_probs"]`` (no old-policy forward pass).

    Configs are frozen here, so unlike veRL this does not rewrite ``policy_loss_config``; build it once with
    :func:`bypass_policy_loss_config`. When ``policy_loss_config`` is given it is checked to select the
    "bypass_mode" loss with a rollout-correction config.
    """
    if "rollout_log_probs" not in batch.batch.keys():
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode=True needs batch['rollout_log_probs']; set "
            "actor_rollout_ref.rollout.calculate_log_probs=True"
        )
    if policy_loss_config is not None and (
        cfg_get(policy_loss_config, "loss_mode", None) != "bypass_mode"
        or cfg_get(policy_loss_config, "rollout_correction", None) is None
    ):
        raise ValueError(
            "bypass mode needs actor.policy_loss.loss_mode='bypass_mode' and actor.policy_loss.rollout_correction; "
            "build the actor's policy_loss with bypass_policy_loss_config()"
        )
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]


def bypass_policy_loss_config(policy_loss_config: Any, rollout_corr_config: Any) -> Any:
    """A copy of the ``PolicyLossConfig`` that selects the "bypass_mode" loss with ``rollout_corr_config``."""
    if not cfg_get(rollout_corr_config, "bypass_mode", False):
        raise ValueError("bypass_policy_loss_config needs algorithm.rollout_correction.bypass_mode=True")
    return dataclasses.replace(policy_loss_config, loss_mode="bypass_mode", rollout_correction=rollout_corr_config)
