"""Policy losses with one contract::

    loss_fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
        -> (loss, {"actor/pg_clipfrac": float, "actor/ppo_kl": float, "actor/pg_clipfrac_lower": float, ...})

(``dro`` returns only ``actor/ppo_kl``, as veRL's does.) ``config`` is the actor config (an ``ActorConfig``, a
DictConfig or a dict; missing keys take veRL's defaults).
Only ``loss`` carries a gradient. Entries where ``response_mask`` is 0 never reach the loss or its gradient, even if
they hold NaN or inf. ``rollout_is_weights`` (rollout-correction IS weights, no gradient) multiply the per-token loss.
The loss is reduced with ``agg_loss`` and ``config.global_batch_info``. Clip-Cov and KL-Cov live in ``cov_losses``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from verl.algorithms._common import cfg_get, check_same_shape, clip_bounds, global_batch_kwargs, sanitize
from verl.algorithms.agg import agg_loss
from verl.algorithms.registry import register_policy_loss
from verl.utils.torch_functional import masked_mean

__all__ = [
    "apply_is_weights",
    "compute_policy_loss",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "prepare_policy_inputs",
    "pg_metrics",
]

# |log π − log π_old| is clamped to this before exponentiating into a ratio.
LOG_RATIO_BOUND = 20.0


def prepare_policy_inputs(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check shapes and zero the masked entries: (old_log_prob, log_prob, advantages, mask, valid)."""
    check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
    )
    valid = response_mask != 0
    dtype = torch.promote_types(log_prob.dtype, torch.float32)
    mask = response_mask.to(dtype)
    return (
        sanitize(old_log_prob.to(dtype), valid),
        sanitize(log_prob.to(dtype), valid),
        sanitize(advantages.to(dtype), valid),
        mask,
        valid,
    )


def pg_metrics(clipfrac: torch.Tensor | float, ppo_kl: torch.Tensor | float, clipfrac_lower: torch.Tensor | float):
    """The three standard actor metrics as detached Python floats."""
    return {
        "actor/pg_clipfrac": float(clipfrac),
        "actor/ppo_kl": float(ppo_kl),
        "actor/pg_clipfrac_lower": float(clipfrac_lower),
    }


def apply_is_weights(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None, valid: torch.Tensor):
    """``pg_losses`` times the (detached) rollout IS weights, which count only on ``valid`` entries."""
    if rollout_is_weights is None:
        return pg_losses
    return pg_losses * sanitize(rollout_is_weights.detach().to(pg_losses.dtype), valid)


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, Eq. 7) with clip-higher and dual clip.

    r = exp(log π − log π_old) (log-ratio clamped to ±20); L = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)), with
    ε_low/ε_high = ``clip_ratio_low/high`` (DAPO's decoupled clip, arXiv:2503.14476). For A < 0 the loss is
    also capped at −A·c, c = ``clip_ratio_c`` (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729).

    Metrics: ``pg_clipfrac`` (clipped tokens), ``ppo_kl`` (mean log π_old − log π), ``pg_clipfrac_lower`` (tokens
    where the dual clip binds).

    Shape: log-probs, advantages, response_mask (bs, response_length) → scalar loss.
    """
    old_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    clip_low, clip_high = clip_bounds(config)
    clip_c = float(cfg_get(config, "clip_ratio_c", 3.0))
    if clip_c <= 1.0:
        raise ValueError(f"actor.clip_ratio_c={clip_c} must be > 1 (the dual-clip bound)")
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_c
    pg_losses = torch.where(advantages < 0, torch.minimum(clip_loss, dual_bound), clip_loss)
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights, valid)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, **global_batch_kwargs(config))
    with torch.no_grad():
        metrics = pg_metrics(
            masked_mean((clipped > unclipped).to(mask.dtype), mask),
            masked_mean(-log_ratio, mask),
            masked_mean(((clip_loss > dual_bound) & (advantages < 0)).to(mask.dtype), mask),
        )
    return loss, metrics


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071, the GSPO-token variant).

    The sequence ratio s_i = exp(mean_t(log π − log π_old)) is made token-level with a stop-gradient,
    log s_it = sg[log s_i] + log π_t − sg[log π_t] (value s_i, gradient s_i·∇log π_t), clamped at log s ≤ 10, then
    clipped as in PPO with ``clip_ratio_low/high``. Always aggregated with "seq-mean-token-mean" (``loss_agg_mode``
    is ignored).

    Shape: (bs, response_length) inputs → scalar loss.
    """
    old_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    clip_low, clip_high = clip_bounds(config)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=10.0))
    unclipped = -advantages * seq_ratio
    clipped = -advantages * torch.clamp(seq_ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = apply_is_weights(torch.maximum(unclipped, clipped), rollout_is_weights, valid)
    loss = agg_loss(pg_losses, mask, "seq-mean-token-mean", **global_batch_kwargs(config))
    with torch.no_grad():
        metrics = pg_metrics(
            masked_mean((clipped > unclipped).to(mask.dtype), mask), masked_mean(-log_ratio, mask), 0.0
        )
    return loss, metrics


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv:2511.20347): a smooth gate replaces the
    hard clip, f(r) = σ(τ(r − 1))·4/τ with τ = ``tau_pos`` if A > 0 else ``tau_neg``; L = −f(r)·A.

    Always aggregated with "seq-mean-token-mean"; the clip fractions are 0 (there is no clip).

    Shape: (bs, response_length) inputs → scalar loss.
    """
    old_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    tau_pos, tau_neg = float(cfg_get(config, "tau_pos", 1.0)), float(cfg_get(config, "tau_neg", 1.05))
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"actor.tau_pos={tau_pos} and actor.tau_neg={tau_neg} must be > 0")
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    tau = torch.full_like(ratio, tau_neg).masked_fill(advantages > 0, tau_pos)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = apply_is_weights(-gate * advantages, rollout_is_weights, valid)
    loss = agg_loss(pg_losses, mask, "seq-mean-token-mean", **global_batch_kwargs(config))
    with torch.no_grad():
        metrics = pg_metrics(0.0, masked_mean(-log_ratio, mask), 0.0)
    return loss, metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546): plain policy gradient L = −log π·A, no ratio —
    the REINFORCE loss of :func:`compute_policy_loss_reinforce` (optional IS weights included).

    Shape: (bs, response_length) inputs → scalar loss.
    """
    return compute_policy_loss_reinforce(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585): L = −sg(clip(r, 1 − ε_low,
    1 + ε_high))·A·log π. The clipped weight is a constant, so every token keeps a gradient A·w·∇log π.

    Metrics: ``pg_clipfrac`` is the fraction of tokens whose weight was clipped.

    Shape: (bs, response_length) inputs → scalar loss.
    """
    old_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    clip_low, clip_high = clip_bounds(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio).detach()
    weight = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = apply_is_weights(-weight * advantages * log_prob, rollout_is_weights, valid)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, **global_batch_kwargs(config))
    with torch.no_grad():
        metrics = pg_metrics(masked_mean((weight != ratio).to(mask.dtype), mask), masked_mean(-log_ratio, mask), 0.0)
    return loss, metrics


def _dppo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
    divergence: str,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO-Binary with the ``divergence`` ("tv" or "kl") trust region; see :func:`compute_policy_loss_dppo_tv`."""
    old_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    delta_low, delta_high = clip_bounds(config)
    clip_c = float(cfg_get(config, "clip_ratio_c", 20.0))
    if not clip_c > 0:
        raise ValueError(f"actor.clip_ratio_c={clip_c} must be > 0 (DPPO truncates the ratio at it)")
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio).detach()
    with torch.no_grad():  # the trust-region mask is a constant of the loss
        prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
        if divergence == "tv":
            gain = prob - old_prob
            inside = torch.where(advantages > 0, gain <= delta_high, gain >= -delta_low)
        else:
            # KL(Bernoulli(π_old) ‖ Bernoulli(π)) of the sampled token; 1e-8 keeps π → 1 finite.
            binary_kl = old_prob * (old_log_prob - log_prob) + (1.0 - old_prob) * torch.log(
                (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
            )
            inside = torch.where(
                advantages > 0,
                (binary_kl <= delta_high) | (prob <= old_prob),
                (binary_kl <= delta_low) | (prob >= old_prob),
            )
        weight = torch.clamp(ratio, max=clip_c) * inside.to(mask.dtype)
    pg_losses = apply_is_weights(-advantages * weight * log_prob, rollout_is_weights, valid)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, **global_batch_kwargs(config))
    with torch.no_grad():
        metrics = pg_metrics(
            masked_mean((~inside).to(mask.dtype), mask),
            masked_mean(-log_ratio, mask),
            masked_mean(((ratio > clip_c) & inside).to(mask.dtype), mask),
        )
    return loss, metrics


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
    arXiv:2602.04879): a trust region on the sampled token's probability instead of PPO's ratio clip.

    L_t = −A·sg(min(r, c))·log π·M_t with r = π/π_old (log-ratio clamped to ±20) and c = ``clip_ratio_c`` (the
    truncated-IS bound; 20 when the config has no such key). The mask M keeps the tokens whose update stays inside
    the total-variation trust region of the binary distribution {token, rest}, |π − π_old|, on the side the
    advantage pushes: M = [π − π_old ≤ δ_high] if A > 0, else [π − π_old ≥ −δ_low], δ_low/δ_high =
    ``clip_ratio_low/high`` (falling back to ``clip_ratio``; here they are probability differences, not ratio
    offsets). A masked-out token has no loss and no gradient.

    Metrics: ``pg_clipfrac`` (tokens outside the trust region), ``ppo_kl`` (mean log π_old − log π),
    ``pg_clipfrac_lower`` (tokens inside it whose ratio was truncated at c).

    Shape: (bs, response_length) inputs → scalar loss.
    """
    return _dppo(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, divergence="tv"
    )


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO-Binary-KL (Qi et al. 2026, arXiv:2602.04879): :func:`compute_policy_loss_dppo_tv` with the binary KL
    divergence as the trust region.

    D = π_old·log(π_old/π) + (1 − π_old)·log((1 − π_old + 10⁻⁸)/(1 − π + 10⁻⁸)), the KL between the Bernoulli
    distributions {sampled token, rest} of the old and the current policy. A token is kept when D is within the
    bound, or when the update moves π against the advantage's push (such a step leaves no trust region):
    M = [D ≤ δ_high or π ≤ π_old] if A > 0, else [D ≤ δ_low or π ≥ π_old].

    Metrics as for ``dppo_tv``.

    Shape: (bs, response_length) inputs → scalar loss.
    """
    return _dppo(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, divergence="kl"
    )


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    dro_beta: float | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Direct Reward Optimisation's policy loss (Richemond et al. 2024, "Offline Regularised Reinforcement Learning
    for Large Language Models Alignment", arXiv:2405.19107; in this per-token form with the old policy as the anchor,
    Kimi Team 2025, "Kimi k1.5", arXiv:2501.12599):

        L_t = −(log π_t·A_t − ½·β·(log π_t − log π_old,t)²).

    Its gradient, (−A + β·(log π − log π_old))·∇log π, is 1/β times the policy gradient of DRO's squared residual
    ½·(A − β·log(π/π_old))² (with A = r − V): a soft, quadratic pull back to the old policy instead of a clip. So a
    token with A = 0 still has a gradient.

    β = ``dro_beta``, else ``config.policy_loss.dro_beta`` (``actor.policy_loss.dro_beta``); it must be > 0.
    No clamping: the quadratic term is the regulariser. Metric: ``actor/ppo_kl`` only (mean log π_old − log π).

    Shape: (bs, response_length) inputs → scalar loss.

    Raises:
        ValueError: β missing, not a number, or not > 0.
    """
    beta = dro_beta if dro_beta is not None else cfg_get(cfg_get(config, "policy_loss", None), "dro_beta", None)
    if isinstance(beta, bool) or not isinstance(beta, int | float) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"actor.policy_loss.dro_beta={beta!r} must be a number > 0 for loss_mode='dro'")
    old_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * float(beta) * log_ratio.square())
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights, valid)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, **global_batch_kwargs(config))
    with torch.no_grad():
        metrics = {"actor/ppo_kl": float(masked_mean(-log_ratio, mask))}
    return loss, metrics


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673): the sequence ratio is the
    geometric mean of the token ratios, each clipped sign-aware in log space (−ε_low ≤ Δ ≤ ε_high binds only on
    the side that would increase the objective); L_i = −Ā_i·exp(mean_t Δ̃_t), averaged over sequences.

    ``loss_agg_mode`` and ``global_batch_info`` are not used (as in veRL): the loss is the plain mean over the
    micro-batch's sequences. Token IS weights enter as their geometric mean per sequence. The sequence log-ratio
    is capped at 20 before exponentiating.

    Metrics: ``pg_clipfrac`` / ``pg_clipfrac_lower``: tokens clipped with A > 0 / A < 0.

    Shape: (bs, response_length) inputs → scalar loss.
    """
    old_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    clip_low, clip_high = clip_bounds(config)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    log_ratio_clipped = torch.clamp(log_ratio, -clip_low, clip_high)
    log_ratio_used = sign * torch.minimum(sign * log_ratio, sign * log_ratio_clipped)
    lengths = mask.sum(-1)
    seq_log_ratio = (log_ratio_used * mask).sum(-1) / (lengths + 1e-8)
    seq_advantage = (advantages * mask).sum(-1) / (lengths + 1e-8)
    pg_losses = -seq_advantage * torch.exp(torch.clamp(seq_log_ratio, max=LOG_RATIO_BOUND))
    if rollout_is_weights is not None:
        log_w = torch.log(sanitize(rollout_is_weights.detach().to(mask.dtype), valid, 1.0) + 1e-10)
        pg_losses = pg_losses * torch.exp((log_w * mask).sum(-1) / (lengths + 1e-8))
    loss = pg_losses.mean()
    with torch.no_grad():
        is_clipped = (log_ratio != log_ratio_clipped).to(mask.dtype)
        metrics = pg_metrics(
            masked_mean(is_clipped * (advantages > 0), mask),
            masked_mean(-log_ratio, mask),
            masked_mean(is_clipped * (advantages < 0), mask),
        )
    return loss, metrics


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """REINFORCE (Williams 1992, Machine Learning 8) with optional importance weights: L = −w·A·log π, with
    w = ``rollout_is_weights`` (π/π_rollout, truncated; no gradient). Used by bypass mode, ``loss_type="reinforce"``.

    Shape: (bs, response_length) inputs → scalar loss.
    """
    rollout_log_prob, log_prob, advantages, mask, valid = prepare_policy_inputs(
        rollout_log_prob, log_prob, advantages, response_mask, rollout_is_weights
    )
    pg_losses = apply_is_weights(-advantages * log_prob, rollout_is_weights, valid)
    loss = agg_loss(pg_losses, mask, loss_agg_mode, **global_batch_kwargs(config))
    with torch.no_grad():
        metrics = pg_metrics(0.0, masked_mean(rollout_log_prob - log_prob, mask), 0.0)
    return loss, metrics


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Bypass mode: ``old_log_prob`` holds the rollout engine's log-probs (no separate old-policy pass).

    Reads ``config.policy_loss.rollout_correction``. IS weights (π/π_rollout from the current, detached policy) and
    the rejection mask come from ``rollout_corr_helper``; then ``loss_type`` "ppo_clip" is the vanilla loss against
    the rollout policy (the ratio already is the IS ratio, so no extra weights) and "reinforce" is
    :func:`compute_policy_loss_reinforce` with the IS weights. The ``rollout_is_weights`` argument is ignored.
    Returns the loss metrics plus the ``rollout_corr/*`` metrics.

    Shape: (bs, response_length) inputs → scalar loss.
    """
    from verl.algorithms.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    rc = cfg_get(cfg_get(config, "policy_loss", None), "rollout_correction", None)
    if rc is None:
        raise ValueError(
            "policy loss 'bypass_mode' needs actor.policy_loss.rollout_correction (the algorithm.rollout_correction "
            "settings)"
        )
    with torch.no_grad():
        is_weights, kept_mask, rc_metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=log_prob.detach(),
            rollout_log_prob=old_log_prob,
            response_mask=response_mask,
            rollout_is=cfg_get(rc, "rollout_is", None),
            rollout_is_threshold=cfg_get(rc, "rollout_is_threshold", 2.0),
            rollout_is_batch_normalize=bool(cfg_get(rc, "rollout_is_batch_normalize", False)),
            rollout_rs=cfg_get(rc, "rollout_rs", None),
            rollout_rs_threshold=cfg_get(rc, "rollout_rs_threshold", None),
        )
    loss_type = cfg_get(rc, "loss_type", "ppo_clip")
    if loss_type == "reinforce":
        loss, metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config, is_weights
        )
    elif loss_type == "ppo_clip":
        loss, metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config
        )
    else:
        raise ValueError(f"rollout_correction.loss_type={loss_type!r}; use 'ppo_clip' or 'reinforce'")
    return loss, {**metrics, **rc_metrics}


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deprecated 4-tuple API of the vanilla loss: (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower).

    Use :func:`compute_policy_loss_vanilla`; this builds its config and calls it.
    """
    warnings.warn(
        "compute_policy_loss is deprecated; use compute_policy_loss_vanilla(..., config=actor_config)",
        DeprecationWarning,
        stacklevel=2,
    )
    if cliprange is None and (cliprange_low is None or cliprange_high is None):
        raise ValueError("compute_policy_loss needs cliprange, or both cliprange_low and cliprange_high")
    config = {
        "clip_ratio": cliprange if cliprange is not None else 0.2,
        "clip_ratio_low": cliprange_low,
        "clip_ratio_high": cliprange_high,
        "clip_ratio_c": clip_ratio_c,
    }
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config
    )
    keys = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
    clipfrac, ppo_kl, clipfrac_lower = (torch.tensor(metrics[k], device=loss.device) for k in keys)
    return loss, clipfrac, ppo_kl, clipfrac_lower
