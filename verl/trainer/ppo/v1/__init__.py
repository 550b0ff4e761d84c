"""veRL 0.10's V1 trainer package, at its import path.

``PPOTrainer`` is the one trainer (:class:`~verl.trainer.ppo.ray_trainer.RayPPOTrainer`) with veRL's hooks
(:mod:`verl.trainer.ppo.v1.trainer_base`); ``trainer.v1.trainer_mode`` (``sync``, ``colocate_async``,
``separate_async``, or a mode added with ``@register_trainer``) picks the class through ``get_trainer_cls``. Also
here: the pieces of the V1 step that stand alone (`MetricsAggregator`, `compute_advantage_for_multi_trajectories`).
:mod:`verl.trainer.ppo.v1.replay_buffer` holds veRL's replay-buffer semantics (``ReplayBuffer``,
``ReplayBufferAsync``) as a component the modes do not sample from yet; the transfer-queue agent loops are not
built.

The heavier names load on first use, so the driver's config validation (which reads the mode registry) stays light.
"""

import importlib
from typing import Any

from verl.trainer.ppo.v1.trainer_base import (
    HOOKS,
    TrainerHooks,
    get_trainer_cls,
    register_trainer,
    registered_trainers,
)

_LAZY = {
    "PPOTrainer": ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer"),
    "MetricsAggregator": ("verl.trainer.ppo.v1.metrics", "MetricsAggregator"),
    "compute_advantage_for_multi_trajectories": (
        "verl.trainer.ppo.v1.multi_trajectory",
        "compute_advantage_for_multi_trajectories",
    ),
}

__all__ = [
    "HOOKS",
    "MetricsAggregator",
    "PPOTrainer",
    "TrainerHooks",
    "compute_advantage_for_multi_trajectories",
    "get_trainer_cls",
    "register_trainer",
    "registered_trainers",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
