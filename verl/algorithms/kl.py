"""KL estimators between the policy and a reference, the KL coefficient controllers, and the legacy KL reward."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms._common import cfg_get
from verl.algorithms.config import validate_kl_penalty_type

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "compute_rewards",
    "get_kl_controller",
    "kl_penalty",
    "kl_penalty_forward",
]


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimate from the sampled tokens' log-probs (Schulman 2020, "Approximating KL
    divergence", http://joschu.net/blog/kl-approx.html), with Δ = log π − log π_ref:

    * "kl"/"k1": Δ;  "abs": |Δ|;  "mse"/"k2": ½Δ²;
    * "low_var_kl"/"k3": e^{−Δ} + Δ − 1, with −Δ clamped to ±20 and the result to [−10, 10].

    Shape: (bs, response_length) → same.
    """
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    if kl_penalty == "full":
        raise NotImplementedError("kl_penalty='full' needs the whole vocabulary distribution and is not implemented")
    validate_kl_penalty_type("kl_penalty", kl_penalty)
    raise ValueError(f"kl_penalty={kl_penalty!r} has a '+' suffix; call kl_penalty(), not kl_penalty_forward()")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """:func:`kl_penalty_forward`; with a "+" suffix (e.g. "k3+"), that forward value with the gradient of k2.

    k1 and k3 are unbiased for the KL value but their expected gradients are not the KL gradient; k2's is (to first
    order), so the "+" variants use a straight-through estimator: k2 − sg(k2) + sg(forward).

    Shape: (bs, response_length) → same.
    """
    if not isinstance(kl_penalty, str):
        raise ValueError(f"kl_penalty={kl_penalty!r} must be a string")
    base = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward = kl_penalty_forward(logprob, ref_logprob, base)
    if not kl_penalty.endswith("+") or base in ("mse", "k2"):
        return forward
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + forward.detach()


class FixedKLController:
    """A constant KL coefficient β = ``kl_coef``."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""


class AdaptiveKLController:
    """Proportional KL controller (Ziegler et al. 2019, arXiv:1909.08593):
    e = clip(KL/target − 1, −0.2, 0.2); β ← β·(1 + e·n_steps/horizon).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKLController needs target_kl > 0 and horizon > 0, got {target_kl}, {horizon}")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β toward the value that keeps ``current_kl`` at the target; ``n_steps`` samples were seen."""
        proportional_error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + proportional_error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """The controller ``kl_ctrl.type`` names ("fixed" or "adaptive"), from a KLControlConfig, DictConfig or dict."""
    kind = cfg_get(kl_ctrl, "type", "fixed")
    if kind == "fixed":
        return FixedKLController(kl_coef=cfg_get(kl_ctrl, "kl_coef", 0.001))
    if kind == "adaptive":
        horizon = cfg_get(kl_ctrl, "horizon", 10000)
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon={horizon} must be > 0 for the adaptive controller")
        return AdaptiveKLController(
            init_kl_coef=cfg_get(kl_ctrl, "kl_coef", 0.001),
            target_kl=cfg_get(kl_ctrl, "target_kl", 0.1),
            horizon=horizon,
        )
    raise ValueError(f"algorithm.kl_ctrl.type={kind!r}; use 'fixed' or 'adaptive'")


def compute_rewards(
    token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_ratio: float
) -> torch.Tensor:
    """Legacy KL-shaped reward: scores − β·(log π_old − log π_ref). Shape: (bs, response_length) → same."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio
