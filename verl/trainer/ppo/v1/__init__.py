"""veRL 0.10's V1 trainer package, at its import path.

Here: the pieces of its step that stand alone (`MetricsAggregator`, `compute_advantage_for_multi_trajectories`).
The trainer modes themselves are ``trainer.v1.trainer_mode`` (``sync``, ``colocate_async``, ``separate_async``) of
the one trainer, `verl.trainer.ppo.ray_trainer.RayPPOTrainer`; veRL 0.10's ``PPOTrainer`` class hierarchy, its
replay buffer and the transfer-queue agent loops are not built yet.
"""

from verl.trainer.ppo.v1.utils import MetricsAggregator, compute_advantage_for_multi_trajectories

__all__ = ["MetricsAggregator", "compute_advantage_for_multi_trajectories"]
