"""Fixtures for the reward-manager tests: the demo tokenizer and a builder of rollout batches."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.utils.demo import build_demo_tokenizer

PROMPT_LEN, RESPONSE_LEN = 16, 8


@pytest.fixture(scope="session")
def tokenizer():
    return build_demo_tokenizer()


@pytest.fixture(scope="session")
def make_batch(tokenizer) -> Callable[..., DataProto]:
    """``make_batch([(question, response_text, ended, ground_truth), ...])`` → a rollout DataProto.

    Prompts are chat-templated and left-padded to 16 tokens; responses are the text's tokens plus EOS when
    ``ended``, right-padded to 8 tokens.
    """

    def build(samples, data_source="verl/arithmetic", response_mask=True, extra_infos=None) -> DataProto:
        pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        prompts, responses, attention = [], [], []
        for question, text, ended, _ in samples:
            messages = [{"role": "user", "content": question}]
            p_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            p_ids = tokenizer(p_ids, add_special_tokens=False)["input_ids"][-PROMPT_LEN:]
            r_ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos] if ended else []))[:RESPONSE_LEN]
            prompts.append([pad] * (PROMPT_LEN - len(p_ids)) + p_ids)
            responses.append(r_ids + [pad] * (RESPONSE_LEN - len(r_ids)))
            attention.append(
                [0] * (PROMPT_LEN - len(p_ids))
                + [1] * len(p_ids)
                + [1] * len(r_ids)
                + [0] * (RESPONSE_LEN - len(r_ids))
            )
        tensors = {
            "prompts": torch.tensor(prompts),
            "responses": torch.tensor(responses),
            "attention_mask": torch.tensor(attention),
        }
        tensors["input_ids"] = torch.cat([tensors["prompts"], tensors["responses"]], dim=1)
        if response_mask:
            tensors["response_mask"] = tensors["attention_mask"][:, PROMPT_LEN:]
        n = len(samples)
        non_tensors = {
            "data_source": np.array([data_source] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": s[3], "style": "rule"} for s in samples], dtype=object),
            "extra_info": np.array(
                extra_infos if extra_infos is not None else [{"index": i} for i in range(n)], dtype=object
            ),
        }
        return DataProto.from_dict(tensors, non_tensors)

    return build
