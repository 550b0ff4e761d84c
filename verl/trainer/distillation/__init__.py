"""veRL 0.10's path of on-policy distillation's losses; the implementation is :mod:`verl.algorithms.distillation`
(below the workers, which compute the loss)."""

from verl.algorithms.distillation import (
    DistillationLossSettings,
    get_distillation_loss_fn,
    get_distillation_loss_settings,
    is_distillation_enabled,
    register_distillation_loss,
)

__all__ = [
    "DistillationLossSettings",
    "get_distillation_loss_fn",
    "get_distillation_loss_settings",
    "is_distillation_enabled",
    "register_distillation_loss",
]
