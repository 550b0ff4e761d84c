"""``single_turn_agent``: one prompt, one ``generate`` call — how training and validation generate by default."""

from __future__ import annotations

import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.utils.rollout_trace import rollout_trace_op

__all__ = ["SingleTurnAgentLoop"]


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """Generate one response to the sample's prompt.

    The prompt is the dataset's token ids (``raw_prompt_ids``: exactly the tokens the trainer holds) when the sample
    has them, else ``raw_prompt`` through the chat template (veRL's behaviour).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        rollout = self.rollout_config
        self.prompt_length, self.response_length = self.cached(
            "single_turn_lengths", lambda: (rollout.prompt_length, rollout.response_length)
        )

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = kwargs.get("raw_prompt_ids")
        if prompt_ids is None:
            if "raw_prompt" not in kwargs:
                raise ValueError("single_turn_agent: the sample has neither raw_prompt_ids nor raw_prompt")
            prompt_ids = await self.apply_chat_template(list(kwargs["raw_prompt"]))
        start = time.perf_counter()
        output = await self.server_manager.generate(
            request_id=uuid4().hex, prompt_ids=list(prompt_ids), sampling_params=sampling_params
        )
        seconds = time.perf_counter() - start
        response = list(output.token_ids[: self.response_length])
        log_probs = None if output.log_probs is None else list(output.log_probs[: len(response)])
        return AgentLoopOutput(
            prompt_ids=list(prompt_ids),
            response_ids=response,
            response_mask=[1] * len(response),
            response_logprobs=log_probs,
            routed_experts=output.routed_experts,
            num_turns=2,
            metrics={"generate_sequences": seconds, "num_preempted": int(output.num_preempted or 0)},
            extra_fields={"turn_scores": [], "tool_rewards": [], **output.extra_fields},  # columns of every loop
        )
