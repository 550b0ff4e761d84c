"""A discriminative reward model's score as the reward (veRL 0.10's rule for ``reward.reward_model.enable`` without a
custom reward function).

Each sample becomes a chat — its ``raw_prompt`` messages and the response (decoded with the policy's tokenizer, its
EOS text removed) as the assistant's turn — rendered with the reward model's chat template (no generation prompt,
a leading BOS dropped: the router's tokenizer adds it back) and sent to the router's ``/classify`` without an
activation; the reward is the last output of the last sequence, as veRL reads it from vLLM.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.protocol import DataProto

__all__ = ["DiscriminativeRewardManager"]


class DiscriminativeRewardManager(RewardManagerBase):
    """Scores each sample with the served discriminative reward model (see the module docstring)."""

    def chat_text(self, data: DataProto) -> str:
        """The sample's chat, rendered for the reward model."""
        row = data[len(data) - 1]
        if "raw_prompt" not in row.non_tensor_batch:
            raise KeyError(
                "a discriminative reward model scores the prompt's messages and the response: the rows need the "
                "'raw_prompt' column (data.return_raw_chat=true)"
            )
        responses = row.batch["responses"]
        valid = int(row.batch["attention_mask"][-responses.shape[-1] :].sum())
        response = self.tokenizer.decode(responses[:valid].tolist())
        if self.tokenizer.eos_token:
            response = response.replace(self.tokenizer.eos_token, "")
        chat = [*list(row.non_tensor_batch["raw_prompt"]), {"role": "assistant", "content": response}]
        tokenizer = self.reward_model_tokenizer
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
        bos = getattr(tokenizer, "bos_token", None)
        return text[len(bos) :] if bos and text.startswith(bos) else text

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        """The reward model's score of the sample's chat."""
        import aiohttp

        body = {"input": self.chat_text(data), "use_activation": False}
        url = f"http://{self.reward_router_address}/classify"
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as reply:
            answer = await reply.json()
            if reply.status != 200:
                raise RuntimeError(f"reward model /classify answered {reply.status}: {answer.get('error')}")
        return {"reward_score": float(answer["data"][-1]["probs"][-1]), "reward_extra_info": {}}
