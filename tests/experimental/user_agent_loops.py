"""Agent loops written the way a veRL user writes them (veRL's imports, constructor and ``run``), plugged in by YAML.

- ``TwoTurnAgentLoop``: generate, append a fixed observation (not generated: mask 0), generate again on the same
  conversation (its second turn goes to the same server).
- ``ShortFirstAgentLoop``: one turn; a sample whose ``short`` column is true stops after one token, the others run
  to the end, so the short one is scored while the others still generate. It records when each generation ended.
- ``FlakyAgentLoop``: one turn, then raises for the samples whose ``fail`` column is true.
- ``SelfScoredAgentLoop``: one turn on the tokenizer's own ``apply_chat_template(tokenize=True)`` result (a
  ``BatchEncoding``), and the loop's own ``reward_score`` (the reward function is not called).
- ``DraftsAgentLoop``: veRL 0.10's multi-output session: a short draft on the prompt, then the answer on the prompt
  followed by the draft (its last ``prompt_length`` tokens); ``run`` returns both outputs, the answer last.
"""

from __future__ import annotations

import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput


class TwoTurnAgentLoop(AgentLoopBase):
    def __init__(self, trainer_config, server_manager, tokenizer, processor, dataset_cls, dataset_config, **kwargs):
        self.observation = kwargs.pop("observation", " ok")
        super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, dataset_config, **kwargs)
        self.response_length = self.config.actor_rollout_ref.rollout.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = await self.apply_chat_template(kwargs["raw_prompt"])
        request_id = uuid4().hex
        first_budget = self.response_length // 2
        first = await self.server_manager.generate(
            request_id, prompt_ids=prompt_ids, sampling_params={**sampling_params, "max_tokens": first_budget}
        )
        observation = self.tokenizer.encode(self.observation, add_special_tokens=False)
        response = list(first.token_ids) + observation
        mask = [1] * len(first.token_ids) + [0] * len(observation)
        logprobs = list(first.log_probs) + [0.0] * len(observation)
        budget = self.response_length - len(response)
        if budget > 0:
            second = await self.server_manager.generate(
                request_id, prompt_ids=prompt_ids + response, sampling_params={**sampling_params, "max_tokens": budget}
            )
            response += second.token_ids
            mask += [1] * len(second.token_ids)
            logprobs += second.log_probs
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response,
            response_mask=mask,
            response_logprobs=logprobs,
            num_turns=3,
            metrics={"generate_sequences": 0.0},
            extra_fields={"observation_at": len(first.token_ids)},
        )


class ShortFirstAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = list(kwargs["raw_prompt_ids"])
        short = bool(kwargs["short"])
        params = {**sampling_params, "max_tokens": 1} if short else {**sampling_params, "ignore_eos": True}
        output = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt_ids, sampling_params=params)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=output.token_ids,
            response_mask=[1] * len(output.token_ids),
            response_logprobs=output.log_probs,
            num_turns=2,
            extra_fields={"generated_at": time.time()},
        )


class FlakyAgentLoop(AgentLoopBase):
    """One turn; a sample whose ``fail`` column is true raises after its generation (a tool or parser bug)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = list(kwargs["raw_prompt_ids"])
        output = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt_ids, sampling_params=sampling_params)
        if kwargs["fail"]:
            raise RuntimeError(f"flaky: gave up on prompt {kwargs['index']}")
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=output.token_ids,
            response_mask=[1] * len(output.token_ids),
            response_logprobs=output.log_probs,
            num_turns=2,
        )


class SelfScoredAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        # as veRL-era loops do: the tokenizer's own call (transformers 5 returns a BatchEncoding, passed on as is)
        prompt_ids = self.tokenizer.apply_chat_template(kwargs["raw_prompt"], add_generation_prompt=True, tokenize=True)
        output = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt_ids, sampling_params=sampling_params)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=output.token_ids,
            response_mask=[1] * len(output.token_ids),
            response_logprobs=output.log_probs,
            reward_score=0.25,
            num_turns=2,
        )


class DraftsAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        rollout = self.config.actor_rollout_ref.rollout
        prompt_ids, request_id = list(kwargs["raw_prompt_ids"]), uuid4().hex
        params = {**sampling_params, "max_tokens": 4}
        draft = await self.server_manager.generate(request_id, prompt_ids=prompt_ids, sampling_params=params)
        answer_prompt = (prompt_ids + list(draft.token_ids))[-rollout.prompt_length :]
        answer = await self.server_manager.generate(request_id, prompt_ids=answer_prompt, sampling_params=params)
        return [
            AgentLoopOutput(
                prompt_ids=ids,
                response_ids=out.token_ids,
                response_mask=[1] * len(out.token_ids),
                response_logprobs=out.log_probs,
                num_turns=2,
            )
            for ids, out in ((prompt_ids, draft), (answer_prompt, answer))
        ]


class RecordingManager:
    """A veRL-style agent-loop manager of a user's own (``rollout.agent.agent_loop_manager_class``)."""

    def __init__(self, config, worker_group=None):
        self.config, self.worker_group = config, worker_group

    def generate_sequences(self, prompts):
        return prompts
