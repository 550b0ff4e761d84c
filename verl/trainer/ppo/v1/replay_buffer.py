"""veRL 0.10's ``verl.trainer.ppo.v1.replay_buffer``. Here so far: the name of its filtered-reward-count table.

veRL 0.10's ``ReplayBuffer`` / ``ReplayBufferAsync`` (staleness-bounded sampling with eviction and refill, the
``trainer.v1.sampler.*`` keys) are not built yet; those keys are refused at start-up by name.
"""

from verl.trainer.ppo.v1.metrics import DAPO_FILTERED_REWARD_COUNTS_KEY

__all__ = ["DAPO_FILTERED_REWARD_COUNTS_KEY"]
