"""On-policy distillation losses (veRL 0.10's ``verl.trainer.distillation.losses``, which is this module): the
student's own samples, scored token by token against a teacher.

A registered loss has veRL's contract::

    loss_fn(config, distillation_config, model_output, data) -> (per_token_losses (bs, T), metrics)

``config`` is the actor config (its ``loss_agg_mode``), ``distillation_config`` the ``distillation`` section (its
``distillation_loss``), ``model_output`` the student's forward (``log_probs``; for top-k losses also what
:func:`compute_forward_kl_topk` made of the logits), ``data`` the micro-batch (``response_mask``,
``teacher_logprobs``, ``teacher_ids``, ``old_log_probs``). Register your own with
``@register_distillation_loss(DistillationLossSettings(names=[...], use_estimator=True))`` (the teacher sends the
sampled token's log-prob) or ``use_topk=True`` (the teacher sends its top-k).

With p_s the student, p_t the teacher, Δ = log p_s(y_t) − log p_t(y_t) on the sampled token y_t:

* ``kl``/``k1``: Δ; ``abs``: |Δ|; ``mse``/``k2``: ½Δ²; ``low_var_kl``/``k3``: e^{−Δ} + Δ − 1 (clamped to ±10): the
  single-sample estimators of the reverse KL(p_s ‖ p_t) (:func:`verl.algorithms.kl.kl_penalty`);
* ``forward_kl_topk``: Σ_{v ∈ top-k of p_t} p_t(v) (log p_t(v) − log p_s(v)), the forward KL over the teacher's top-k
  (clamped at 0: over a part of the vocabulary it can be negative).

:func:`distillation_loss` reduces them: ``loss_max_clamp`` bounds each token's loss to ±clamp, then either the loss is
back-propagated directly (``agg_loss`` with the actor's ``loss_agg_mode``; ``k1`` is refused there: its gradient does
not depend on the teacher) or, with ``use_policy_gradient``, −loss (detached) is the advantage of a PPO clipped loss
against ``old_log_probs`` (``clip_ratio_low`` / ``clip_ratio_high`` of the distillation section).
:func:`distillation_ppo_loss` adds it to the task's policy loss: ``task + distillation_loss_coef × distillation``, or
the distillation loss alone without ``use_task_rewards``.
``log_prob_min_clamp`` bounds both sides' log-probs from below before any loss (veRL applies it to the top-k loss
only; here the estimators get it too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from verl.algorithms.agg import agg_loss
from verl.algorithms.kl import kl_penalty
from verl.algorithms.policy_losses import compute_policy_loss_vanilla

__all__ = [
    "DISTILLATION_LOSS_REGISTRY",
    "DistillationLossSettings",
    "compute_forward_kl_topk",
    "distillation_loss",
    "distillation_ppo_loss",
    "get_distillation_loss_fn",
    "get_distillation_loss_settings",
    "is_distillation_enabled",
    "register_distillation_loss",
]

DistillationLossFn = Callable[[Any, Any, Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]], tuple]
ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


@dataclass(frozen=True)
class DistillationLossSettings:
    """How a registered loss reads the teacher: ``use_estimator`` (the sampled token's log-prob, ``teacher_logprobs``
    of shape (bs, T) or (bs, T, 1)) or ``use_topk`` (the teacher's top-k ``teacher_ids`` / ``teacher_logprobs``,
    (bs, T, k)); exactly one."""

    names: tuple[str, ...] | list[str] | str = ()
    use_topk: bool = False
    use_estimator: bool = False

    def __post_init__(self) -> None:
        names = (self.names,) if isinstance(self.names, str) else tuple(self.names)
        object.__setattr__(self, "names", names)
        if not names:
            raise ValueError("DistillationLossSettings: name the loss (names=[...])")
        if self.use_topk == self.use_estimator:
            raise ValueError(
                f"DistillationLossSettings{list(names)}: set exactly one of use_topk, use_estimator "
                f"(got use_topk={self.use_topk}, use_estimator={self.use_estimator})"
            )


DISTILLATION_LOSS_REGISTRY: dict[str, DistillationLossFn] = {}
DISTILLATION_SETTINGS_REGISTRY: dict[str, DistillationLossSettings] = {}


def register_distillation_loss(settings: DistillationLossSettings) -> Callable[[DistillationLossFn], Any]:
    """Register a loss under each of ``settings.names`` (a name registered twice is an error)."""

    def decorator(fn: DistillationLossFn) -> DistillationLossFn:
        taken = [name for name in settings.names if name in DISTILLATION_LOSS_REGISTRY]
        if taken:
            raise ValueError(f"distillation loss {taken} is already registered")
        for name in settings.names:
            DISTILLATION_LOSS_REGISTRY[name] = fn
            DISTILLATION_SETTINGS_REGISTRY[name] = settings
        return fn

    return decorator


def _known(loss_mode: str) -> None:
    if loss_mode not in DISTILLATION_LOSS_REGISTRY:
        raise ValueError(
            f"distillation.distillation_loss.loss_mode={loss_mode!r} is not a registered distillation loss; "
            f"registered: {sorted(DISTILLATION_LOSS_REGISTRY)}"
        )


def get_distillation_loss_fn(loss_mode: str) -> DistillationLossFn:
    """The loss registered as ``loss_mode``."""
    _known(loss_mode)
    return DISTILLATION_LOSS_REGISTRY[loss_mode]


def get_distillation_loss_settings(loss_mode: str) -> DistillationLossSettings:
    """The settings registered with ``loss_mode``."""
    _known(loss_mode)
    return DISTILLATION_SETTINGS_REGISTRY[loss_mode]


def is_distillation_enabled(config: Any) -> bool:
    """Whether ``config`` (the ``distillation`` section, or None) turns distillation on."""
    return bool(config is not None and _get(config, "enabled", False))


def _get(section: Any, key: str, default: Any = None) -> Any:
    if isinstance(section, Mapping) or hasattr(section, "get"):
        return section.get(key, default)
    return getattr(section, key, default)


def _loss_section(distillation_config: Any) -> Any:
    return _get(distillation_config, "distillation_loss") or {}


def _clamp_min(log_probs: torch.Tensor, bound: float | None) -> torch.Tensor:
    return log_probs if bound is None else log_probs.clamp_min(float(bound))


# ---------------------------------------------------------------------------------------------- top-k (logits side)
def _topk_log_probs(logits: torch.Tensor, ids: torch.Tensor, chunk_size: int | None) -> torch.Tensor:
    """``log_softmax(logits).gather(-1, ids)`` in float32; with ``chunk_size``, ``chunk_size`` positions at a time
    (never the whole (bs, T, V) log-softmax at once)."""
    if chunk_size is None:
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids)
    flat, flat_ids = logits.reshape(-1, logits.shape[-1]), ids.reshape(-1, ids.shape[-1])
    parts = []
    for start in range(0, flat.shape[0], chunk_size):
        chunk = flat[start : start + chunk_size].float()
        parts.append(chunk.gather(-1, flat_ids[start : start + chunk_size]) - chunk.logsumexp(-1, keepdim=True))
    out = torch.cat(parts) if parts else flat.new_zeros((0, ids.shape[-1]), dtype=torch.float32)
    return out.reshape(ids.shape)


def compute_forward_kl_topk(
    student_logits: torch.Tensor,
    teacher_topk_log_probs: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    distillation_config: Any,
) -> dict[str, torch.Tensor]:
    """The per-position pieces of ``forward_kl_topk`` from the student's logits (bs, T, V) and the teacher's top-k
    (bs, T, k): ``distillation_losses`` (the forward KL over the teacher's top-k), ``student_mass`` /
    ``teacher_mass`` (the probability each puts on the teacher's top-k), ``overlap_count`` (how many of the teacher's
    top-k are in the student's) and ``overlap_token_advantage`` (the mean of −p_t (log p_t − log p_s) over those),
    each (bs, T). Gradients flow into ``student_logits`` through ``distillation_losses`` and ``student_mass``."""
    loss_config = _loss_section(distillation_config)
    if teacher_topk_ids.shape != teacher_topk_log_probs.shape or teacher_topk_ids.shape[:2] != student_logits.shape[:2]:
        raise ValueError(
            f"forward_kl_topk: student logits {tuple(student_logits.shape)}, teacher ids "
            f"{tuple(teacher_topk_ids.shape)} and log-probs {tuple(teacher_topk_log_probs.shape)} must agree on "
            "(batch, positions), the teacher's two on k"
        )
    k, vocab = teacher_topk_ids.shape[-1], student_logits.shape[-1]
    if teacher_topk_ids.numel() and not 0 <= int(teacher_topk_ids.min()) <= int(teacher_topk_ids.max()) < vocab:
        raise ValueError(
            f"forward_kl_topk: the teacher's token ids span [{int(teacher_topk_ids.min())}, "
            f"{int(teacher_topk_ids.max())}], outside the student's vocabulary of {vocab}: teacher and student must "
            "share a tokenizer"
        )
    chunk = int(_get(loss_config, "chunked_topk_chunk_size", 4096)) if _get(loss_config, "use_chunked_topk") else None
    student = _topk_log_probs(student_logits, teacher_topk_ids.long(), chunk)
    teacher = teacher_topk_log_probs.float()
    student_mass, teacher_mass = student.exp().sum(-1), teacher.exp().sum(-1)
    floor = _get(loss_config, "log_prob_min_clamp")
    student, teacher = _clamp_min(student, floor), _clamp_min(teacher, floor)
    token_kl = teacher.exp() * (teacher - student)
    with torch.no_grad():
        student_top = student_logits.topk(k, dim=-1).indices
        overlap = (teacher_topk_ids.unsqueeze(-1) == student_top.unsqueeze(-2)).any(-1)
        overlap_count = overlap.sum(-1)
        advantage = (-token_kl * overlap).sum(-1) / overlap_count.clamp_min(1)
    return {
        "distillation_losses": token_kl.sum(-1),
        "student_mass": student_mass,
        "teacher_mass": teacher_mass,
        "overlap_count": overlap_count,
        "overlap_token_advantage": torch.where(overlap_count > 0, advantage, torch.zeros_like(advantage)),
    }


# ---------------------------------------------------------------------------------------------- the registered losses
def _valid(data: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return data["response_mask"].bool()


def _min_mean_max(name: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    return {name: float(values.mean()), f"{name}_min": float(values.min()), f"{name}_max": float(values.max())}


@register_distillation_loss(DistillationLossSettings(names=["forward_kl_topk"], use_topk=True))
def forward_kl_topk(config: Any, distillation_config: Any, model_output: Mapping, data: Mapping):
    """Forward KL over the teacher's top-k (made by :func:`compute_forward_kl_topk` in the student's forward),
    clamped at 0; metrics ``distillation/{student,teacher}_mass{,_min,_max}``, ``distillation/overlap_ratio`` (the
    share of the teacher's top-k the student's top-k holds) and ``distillation/overlap_token_advantage``."""
    valid = _valid(data)
    k = int(data["teacher_ids"].shape[-1])
    metrics = {
        **_min_mean_max("distillation/student_mass", model_output["student_mass"][valid].detach()),
        **_min_mean_max("distillation/teacher_mass", model_output["teacher_mass"][valid].detach()),
    }
    if valid.any():
        counts = model_output["overlap_count"]
        metrics["distillation/overlap_ratio"] = float(counts[valid].float().mean() / k)
        overlapping = valid & (counts > 0)
        advantage = model_output["overlap_token_advantage"][overlapping]
        metrics["distillation/overlap_token_advantage"] = float(advantage.mean()) if advantage.numel() else 0.0
    return model_output["distillation_losses"].clamp_min(0.0), metrics


@register_distillation_loss(DistillationLossSettings(names=list(ESTIMATORS), use_estimator=True))
def reverse_kl_estimator(config: Any, distillation_config: Any, model_output: Mapping, data: Mapping):
    """A single-sample estimator of the reverse KL on the sampled token (the ``loss_mode`` names which); metric
    ``distillation/abs_loss`` (the mean |loss|: k1 can be negative)."""
    loss_config = _loss_section(distillation_config)
    student = model_output["log_probs"]
    teacher = data["teacher_logprobs"]
    if teacher.dim() == student.dim() + 1:
        teacher = teacher.squeeze(-1)
    if teacher.shape != student.shape:
        raise ValueError(
            f"{_get(loss_config, 'loss_mode')}: teacher log-probs {tuple(data['teacher_logprobs'].shape)} do not "
            f"match the student's {tuple(student.shape)} (an estimator needs the sampled token's: k=1)"
        )
    floor = _get(loss_config, "log_prob_min_clamp")
    losses = kl_penalty(_clamp_min(student, floor), _clamp_min(teacher.to(student.dtype), floor), _mode(loss_config))
    valid = _valid(data)
    metrics = {"distillation/abs_loss": float(losses[valid].detach().abs().mean())} if valid.any() else {}
    return losses, metrics


def _mode(loss_config: Any) -> str:
    return str(_get(loss_config, "loss_mode", "k3"))


# ---------------------------------------------------------------------------------------------- reduction
def distillation_loss(
    config: Any, distillation_config: Any, model_output: Mapping, data: Mapping
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation loss of a micro-batch (see the module docstring) and its metrics: the registered loss's,
    ``distillation/loss_min`` / ``_max`` (per token, before the clamp) and, with ``use_policy_gradient``, the PPO
    loss's metrics as ``distillation/pg_clipfrac`` etc. ``config`` is the actor config (``loss_agg_mode``,
    ``global_batch_info``)."""
    loss_config = _loss_section(distillation_config)
    mode = _mode(loss_config)
    use_pg = bool(_get(loss_config, "use_policy_gradient", False))
    if not use_pg and mode in ("kl", "k1"):
        raise ValueError(
            f"distillation.distillation_loss.loss_mode={mode} with use_policy_gradient=false: the gradient of k1 "
            "does not depend on the teacher; use k3 / forward_kl_topk, or use_policy_gradient=true"
        )
    losses, metrics = get_distillation_loss_fn(mode)(config, distillation_config, model_output, data)
    mask = data["response_mask"]
    valid = mask.bool()
    if valid.any():
        metrics["distillation/loss_min"] = float(losses[valid].detach().min())
        metrics["distillation/loss_max"] = float(losses[valid].detach().max())
    bound = _get(loss_config, "loss_max_clamp")
    if bound is not None:
        losses = losses.clamp(-float(bound), float(bound))
    agg_mode = _get(config, "loss_agg_mode", "token-mean")
    batch_info = dict(_get(config, "global_batch_info", None) or {})
    if not use_pg:
        return agg_loss(losses, mask, agg_mode, **batch_info), metrics
    policy_mode = _get(loss_config, "policy_loss_mode", "vanilla")
    if policy_mode != "vanilla":
        raise ValueError(f"distillation.distillation_loss.policy_loss_mode={policy_mode!r}: only 'vanilla' is built")
    clip = float(_get(loss_config, "clip_ratio", 0.2))
    pg_config = {
        "clip_ratio": clip,
        "clip_ratio_low": _get(loss_config, "clip_ratio_low", clip),
        "clip_ratio_high": _get(loss_config, "clip_ratio_high", clip),
        "global_batch_info": batch_info,
    }
    loss, pg_metrics = compute_policy_loss_vanilla(
        old_log_prob=data["old_log_probs"],
        log_prob=model_output["log_probs"],
        advantages=-losses.detach(),
        response_mask=mask,
        loss_agg_mode=agg_mode,
        config=pg_config,
        rollout_is_weights=data.get("rollout_is_weights"),
    )
    metrics.update({f"distillation/{key.removeprefix('actor/')}": value for key, value in pg_metrics.items()})
    return loss, metrics


def distillation_ppo_loss(
    policy_loss: torch.Tensor | float,
    config: Any,
    distillation_config: Any,
    model_output: Mapping,
    data: Mapping,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor's loss with distillation: ``policy_loss + distillation_loss_coef × distillation`` with
    ``use_task_rewards``, the distillation loss alone without; metrics as :func:`distillation_loss` plus
    ``distillation/loss``."""
    loss_config = _loss_section(distillation_config)
    distill, metrics = distillation_loss(config, distillation_config, model_output, data)
    metrics["distillation/loss"] = float(distill.detach())
    if _get(loss_config, "use_task_rewards", True):
        return policy_loss + float(_get(loss_config, "distillation_loss_coef", 1.0)) * distill, metrics
    return distill, metrics
