"""Learning-rate schedules of ``optim.lr_scheduler_type``, as multipliers of the peak ``optim.lr``.

Every schedule starts with a linear warmup: the multiplier is ``step / warmup_steps`` for ``step < warmup_steps``
(so the first optimizer step runs at lr 0 when there is a warmup), then follows its shape:

* ``constant``: 1.
* ``cosine``: ``m + (1 − m) · ½(1 + cos(2π · num_cycles · progress))`` with ``m = min_lr_ratio`` and
  ``progress = (step − warmup) / (total − warmup)`` clipped to [0, 1]; ``num_cycles = 0.5`` decays from 1 to ``m``
  over the remaining steps (Loshchilov & Hutter 2017, "SGDR", arXiv:1608.03983, Eq. 5 without restarts).

``step`` counts scheduler steps already taken (``LambdaLR``'s ``last_epoch``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

from verl.workers.config.optimizer import FSDPOptimizerConfig

__all__ = [
    "LR_SCHEDULES",
    "build_lr_scheduler",
    "constant_schedule_with_warmup",
    "cosine_schedule_with_warmup",
    "resolve_warmup_steps",
]


def constant_schedule_with_warmup(step: int, *, warmup_steps: int) -> float:
    """Multiplier of the constant schedule: ``step / warmup_steps`` during warmup, then 1."""
    if step < warmup_steps:
        return step / warmup_steps
    return 1.0


def cosine_schedule_with_warmup(
    step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0, num_cycles: float = 0.5
) -> float:
    """Multiplier of the cosine schedule (see the module docstring); reaches ``min_lr_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return step / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    cosine = 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * cosine


def _constant_factory(optim: FSDPOptimizerConfig, warmup_steps: int) -> Callable[[int], float]:
    return functools.partial(constant_schedule_with_warmup, warmup_steps=warmup_steps)


def _cosine_factory(optim: FSDPOptimizerConfig, warmup_steps: int) -> Callable[[int], float]:
    if optim.total_training_steps < 1:
        raise ValueError(
            "optim.lr_scheduler_type='cosine' needs optim.total_training_steps (got "
            f"{optim.total_training_steps}); the trainer sets it from the data size and epochs"
        )
    return functools.partial(
        cosine_schedule_with_warmup,
        warmup_steps=warmup_steps,
        total_steps=optim.total_training_steps,
        min_lr_ratio=optim.min_lr_ratio or 0.0,
        num_cycles=optim.num_cycles,
    )


# optim.lr_scheduler_type → factory(optim config, resolved warmup steps) → multiplier of the step. The keys are
# verl.workers.config.optimizer.LR_SCHEDULER_TYPES (the config rejects other names).
LR_SCHEDULES: dict[str, Callable[[FSDPOptimizerConfig, int], Callable[[int], float]]] = {
    "constant": _constant_factory,
    "cosine": _cosine_factory,
}


def resolve_warmup_steps(optim: FSDPOptimizerConfig) -> int:
    """``optim.lr_warmup_steps`` when >= 0, else ``int(lr_warmup_steps_ratio · total_training_steps)``."""
    if optim.lr_warmup_steps is not None and optim.lr_warmup_steps >= 0:
        return optim.lr_warmup_steps
    if optim.lr_warmup_steps_ratio == 0.0:
        return 0
    if optim.total_training_steps < 1:
        raise ValueError(
            f"optim.lr_warmup_steps_ratio={optim.lr_warmup_steps_ratio} needs optim.total_training_steps (got "
            f"{optim.total_training_steps}); set optim.lr_warmup_steps instead, or let the trainer set the total"
        )
    return int(optim.lr_warmup_steps_ratio * optim.total_training_steps)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim: FSDPOptimizerConfig) -> LambdaLR:
    """A ``LambdaLR`` over ``optimizer`` following ``optim.lr_scheduler_type`` (the optimizer's lr is the peak)."""
    factory = LR_SCHEDULES[optim.lr_scheduler_type]
    return LambdaLR(optimizer, lr_lambda=factory(optim, resolve_warmup_steps(optim)))
