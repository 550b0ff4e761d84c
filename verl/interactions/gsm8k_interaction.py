"""``Gsm8kInteraction``: a simulated user that checks the model's last answer against the ground truth.

A right answer ends the conversation (``"Your response is correct!"``, turn score 1.0); a wrong one asks the model to
reflect and try again (turn score 0.0), until ``multi_turn.max_user_turns``. The answer is the last number of the
model's last turn (GSM8K's flexible extraction, ``#### `` prefix optional), so it also fits the built-in arithmetic
task. Its ``interaction_kwargs``: ``name`` (the entry's name), ``ground_truth``.
"""

from __future__ import annotations

from typing import Any

from verl.interactions.base import BaseInteraction
from verl.utils.reward_score import gsm8k

__all__ = ["Gsm8kInteraction"]

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
    """Feedback on the model's answer to a math word problem (see the module docstring)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any
    ) -> str:
        instance_id = await super().start_interaction(instance_id)
        if ground_truth is None:
            raise ValueError(f"interaction {self.name!r}: interaction_kwargs has no 'ground_truth'")
        self._instances[instance_id] = {"response": "", "ground_truth": str(ground_truth), "reward": 0.0}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        answer = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        self._instances[instance_id]["response"] = answer if answer.startswith("#### ") else f"#### {answer}"
        reward = await self.calculate_score(instance_id)
        if reward == 1.0:
            return True, CORRECT, 1.0, {}
        return False, INCORRECT, reward, {}

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        state = self._instances[instance_id]
        state["reward"] = gsm8k.compute_score(
            state["response"], state["ground_truth"], method="flexible", format_score=0.0, score=1.0
        )
        return state["reward"]

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
