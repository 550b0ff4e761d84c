"""veRL 0.10's ``verl.trainer.ppo.v1.utils``: `MetricsAggregator`, `compute_advantage_for_multi_trajectories`, and
the `compute_advantage` it falls back to (veRL's tests patch it here)."""

from verl.trainer.ppo.utils import compute_advantage
from verl.trainer.ppo.v1.metrics import MetricsAggregator
from verl.trainer.ppo.v1.multi_trajectory import compute_advantage_for_multi_trajectories

__all__ = ["MetricsAggregator", "compute_advantage", "compute_advantage_for_multi_trajectories"]
