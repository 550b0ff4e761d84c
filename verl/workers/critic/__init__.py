"""Value critics: `DataParallelPPOCritic` (FSDP)."""

from verl.workers.critic.dp_critic import DataParallelPPOCritic

__all__ = ["DataParallelPPOCritic"]
