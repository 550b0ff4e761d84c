"""Config schemas of the trainer's Hydra groups."""

from verl.trainer.config.algorithm import (
    AlgoConfig,
    FilterGroupsConfig,
    KLControlConfig,
    PFPPOConfig,
    RolloutCorrectionConfig,
)

__all__ = ["AlgoConfig", "FilterGroupsConfig", "KLControlConfig", "PFPPOConfig", "RolloutCorrectionConfig"]
