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
        "ppo_mini_batch_size": BATCH,
        "ppo_micro_batch_size_per_gpu": BATCH,
        "cliprange_value": 0.5,
        "grad_clip": 1e9,
        "loss_agg_mode": "token-mean",
        "model": {"use_remove_padding": False},  # the padded path (veRL 0.10's default is packed)
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
    partial = make_critic(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4).update_critic(make_batch())
    assert len(partial["critic/vf_loss"]) == -(-len(make_batch()) // 4)  # a last partial mini-batch trains, as veRL
    with pytest.raises(RuntimeError, match="needs an optimizer"):
        DataParallelPPOCritic({}, build_tiny_qwen2(value_head=True)).update_critic(make_batch())


# ---------------------------------------------------------------------------------------------------------------
# use_remove_padding and use_dynamic_bsz give the padded, fixed-micro-batch results
# ---------------------------------------------------------------------------------------------------------------
# float32, summation order only. Measured: values ≤ 1e-7, parameters after a step ≤ 3e-8. Tolerance 1e-5, absolute.
TOL = 1e-5


def make_ragged_batch() -> DataProto:
    """Left-padded prompts and right-padded responses of assorted lengths."""
    data = make_batch()
    b = data.batch
    b["attention_mask"].zero_()
    b["response_mask"].zero_()
    for row, (p, r) in enumerate(zip([4, 1, 3, 2, 4, 2], [5, 2, 1, 5, 3, 4])):
        b["attention_mask"][row, PROMPT - p : PROMPT + r] = 1
        b["response_mask"][row, :r] = 1
    b["position_ids"] = (b["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return data


@pytest.mark.parametrize("dynamic", [False, True])
def test_remove_padding_and_dynamic_bsz_values_equal_the_padded_path(dynamic):
    data = make_ragged_batch()
    data.meta_info["micro_batch_size"] = 4
    expected = make_critic().compute_values(data)
    if dynamic:
        data.meta_info.update(use_dynamic_bsz=True, max_token_len=10)  # 36 tokens → 4 micro-batches, reordered
    values = make_critic(model={"use_remove_padding": True}).compute_values(data)
    torch.testing.assert_close(values, expected, rtol=0, atol=TOL)
    assert not torch.allclose(values + 1e-4 * data.batch["response_mask"], expected, rtol=0, atol=TOL)


@pytest.mark.parametrize(
    "overrides",
    [
        {"model": {"use_remove_padding": True}},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 10},
        {"model": {"use_remove_padding": True}, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 10},
    ],
    ids=["remove_padding", "dynamic_bsz", "both"],
)
def test_update_critic_equals_the_padded_fixed_micro_batch_update(overrides):
    reference, critic = make_critic(ppo_micro_batch_size_per_gpu=4), make_critic(**overrides)
    assert critic.use_remove_padding == ("use_remove_padding" in str(overrides))
    expected = reference.update_critic(make_ragged_batch())
    metrics = critic.update_critic(make_ragged_batch())
    moved = False
    for (name, p), q, r in zip(
        critic.critic_module.named_parameters(),
        reference.critic_module.parameters(),
        build_tiny_qwen2(seed=3, value_head=True).parameters(),
    ):
        torch.testing.assert_close(p, q, rtol=0, atol=TOL, msg=name)
        moved |= bool((p - r).abs().max() > 1e-3)
    assert moved
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key


def test_compute_values_dynamic_bsz_needs_a_budget():
    data = make_ragged_batch()
    data.meta_info["use_dynamic_bsz"] = True
    with pytest.raises(ValueError, match="use_dynamic_bsz needs a token budget"):
        make_critic().compute_values(data)
