"""Config schemas of the trainer's Hydra groups, at veRL's paths (for ``_target_`` keys): the ``algorithm.*``
schemas live in :mod:`verl.algorithms.config`, `CheckpointConfig` in :mod:`verl.workers.config.checkpoint`."""

from verl.algorithms.config import (
    AlgoConfig,
    FilterGroupsConfig,
    KLControlConfig,
    PFPPOConfig,
    RolloutCorrectionConfig,
)
from verl.workers.config.checkpoint import CheckpointConfig

__all__ = [
    "AlgoConfig",
    "CheckpointConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "PFPPOConfig",
    "RolloutCorrectionConfig",
]
