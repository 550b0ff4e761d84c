"""DataParallelPPOCritic in one process on a real tiny Qwen2 value model."""

from __future__ import annotations

import copy

import pytest
import torch

from verl.protocol import DataProto
from verl.utils.tiny_model import build_tiny_qwen2
from verl.workers.critic import DataParallelPPOCritic

PROMPT, RESPONSE, BATCH = 4, 5, 6


def make_batch() -> DataProto:
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, 256, (BATCH, PROMPT + RESPONSE), generator=g)
    attention_mask = torch.ones_like(input_ids)
    response_mask = torch.ones(BATCH, RESPONSE, dtype=torch.long)
    response_mask[2, 2:] = 0
    attention_mask[2, PROMPT + 2 :] = 0
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, PROMPT:],
            "response_mask": response_mask,
            "values": torch.randn(BATCH, RESPONSE, generator=g) * 0.1,
            "returns": torch.randn(BATCH, RESPONSE, generator=g),
        }
    )


def make_critic(**overrides) -> DataParallelPPOCritic:
    cfg = {
        "ppo_mini_batch_size_per_rank": BATCH,
        "ppo_micro_batch_size_per_gpu": BATCH,
        "cliprange_value": 0.5,
        "grad_clip": 1e9,
        "loss_agg_mode": "token-mean",
    } | overrides
    model = build_tiny_qwen2(seed=3, value_head=True)
    return DataParallelPPOCritic(cfg, model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_compute_values_reads_the_position_before_each_response_token():
    critic = make_critic()
    data = make_batch()
    data.meta_info["micro_batch_size"] = 4
    values = critic.compute_values(data)
    with torch.no_grad():
        b = data.batch
        full = critic.critic_module(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits.squeeze(-1)
    expected = full[:, PROMPT - 1 : -1] * b["response_mask"]
    torch.testing.assert_close(values, expected, rtol=0, atol=1e-6)
    assert values.shape == (BATCH, RESPONSE) and bool((values[2, 2:] == 0).all())


def test_update_critic_matches_the_clipped_value_loss_by_hand():
    critic = make_critic(ppo_micro_batch_size_per_gpu=4)
    reference = copy.deepcopy(critic.critic_module)
    data = make_batch()
    metrics = critic.update_critic(data)
    b = data.batch
    vpred = reference(
        input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
    ).logits.squeeze(-1)[:, PROMPT - 1 : -1]
    clipped = b["values"] + (vpred - b["values"]).clamp(-0.5, 0.5)
    mask = b["response_mask"].float()
    per_token = torch.maximum((vpred - b["returns"]) ** 2, (clipped - b["returns"]) ** 2)
    loss = 0.5 * (per_token * mask).sum() / mask.sum()
    loss.backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    assert metrics["critic/vf_loss"][0] == pytest.approx(loss.item(), rel=1e-5)
    for (name, p), q in zip(critic.critic_module.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert set(metrics) == {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"}


def test_update_critic_errors():
    data = make_batch()
    data.pop(batch_keys=["returns"])
    with pytest.raises(KeyError, match="returns"):
        make_critic().update_critic(data)
    with pytest.raises(ValueError, match="not a multiple of its mini-batch of 4"):
        make_critic(ppo_mini_batch_size_per_rank=4).update_critic(make_batch())
    with pytest.raises(RuntimeError, match="needs an optimizer"):
        DataParallelPPOCritic({}, build_tiny_qwen2(value_head=True)).update_critic(make_batch())
