"""The base of ``naive``, ``dapo`` and ``gdpo`` at veRL 0.10's reward-loop names (each in its module of veRL's
name), for code that imports or subclasses them.

Each is the batch manager of the same name (`verl.workers.reward_manager`: one place for each scoring rule, with
its scoring processes, time limits and failure counts) scoring one sample per ``run_single``. A run that names
``naive`` / ``dapo`` / ``gdpo`` gets the batch managers themselves (the agent loops then score the samples that
finish together in one call); these classes are what a user's reward-loop manager subclasses.
"""

from __future__ import annotations

import threading
from typing import Any

from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.protocol import DataProto

__all__ = ["BatchBackedRewardManager"]


class BatchBackedRewardManager(RewardManagerBase):
    """``run_single`` over the batch manager registered as :attr:`batch_name`."""

    batch_name = "naive"

    def setup(self) -> None:
        """Build the batch manager (with the run's reward kwargs and the served reward model's address)."""
        from verl.workers.reward_manager import get_reward_manager_cls
        from verl.workers.reward_manager.build import build_batch_manager

        reward = self.reward_section()
        config = self.config if self.config is not None else {}
        self.batch_manager = build_batch_manager(
            get_reward_manager_cls(self.batch_name),
            self.tokenizer,
            self.compute_score,
            reward=reward,
            data=config.get("data") or {},
            trainer=config.get("trainer") or {},
            reward_router_address=self.reward_router_address,
            reward_model_tokenizer=self.reward_model_tokenizer,
            **dict(reward.get("reward_kwargs") or {}),
        )
        self._one_at_a_time = threading.Lock()  # the batch manager's scoring pool serves one caller at a time

    def _score(self, row: DataProto) -> dict[str, Any]:
        with self._one_at_a_time:
            result = self.batch_manager(row, return_dict=True)
        extra = {key: values[0] for key, values in result["reward_extra_info"].items()}
        return {"reward_score": float(result["reward_tensor"].sum()), "reward_extra_info": extra}

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        """Score the last row with the batch manager (in a thread)."""
        row = data[len(data) - 1 :]
        return await self.loop.run_in_executor(None, self._score, row)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_one_at_a_time", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._one_at_a_time = threading.Lock()
