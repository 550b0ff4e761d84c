"""Config schemas of the trainer's Hydra groups (and `CheckpointConfig` at veRL's path, for ``_target_`` keys)."""

from verl.trainer.config.algorithm import (
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
