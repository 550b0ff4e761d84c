"""verl.workers.utils.padding on a hand-made batch of two rows.

Row 0: prompt [pad, 11, 12] (left-padded), response [13, 14]; row 1: prompt [21, 22, 23], response [24, pad].
"""

import pytest
import torch
from tensordict import TensorDict

from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import (
    build_attention_mask_from_nested,
    embeds_padding_2_no_padding,
    left_right_2_no_padding,
    no_padding_2_padding,
    response_from_nested,
    response_to_nested,
)


def _batch() -> TensorDict:
    input_ids = torch.tensor([[0, 11, 12, 13, 14], [21, 22, 23, 24, 0]])
    attention_mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    return TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": torch.tensor([[1, 1], [1, 0]]),
            "position_ids": torch.tensor([[0, 0, 1, 2, 3], [0, 1, 2, 3, 3]]),
            "prompts": input_ids[:, :3],
            "responses": input_ids[:, 3:],
            "old_log_probs": torch.zeros(2, 2),
        },
        batch_size=[2],
    )


def test_left_right_2_no_padding_keeps_valid_tokens_and_records_the_layout():
    data = left_right_2_no_padding(_batch())
    assert data["input_ids"].values().tolist() == [11, 12, 13, 14, 21, 22, 23, 24]
    assert data["input_ids"].offsets().tolist() == [0, 4, 8]
    assert data["position_ids"].values().tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert not data["old_log_probs"].is_nested and torch.equal(data["loss_mask"], data["response_mask"])
    assert tu.get_non_tensor_data(data, "max_seq_len", None) == 5
    assert tu.get_non_tensor_data(data, "max_response_len", None) == 2
    assert tu.get_non_tensor_data(data, "indices", None).tolist() == [1, 2, 3, 4, 5, 6, 7, 8]


def test_multi_axis_position_ids_become_ragged_on_the_last_dim():
    data = _batch()
    data["position_ids"] = torch.arange(5).expand(2, 3, 5).clone()  # (bs, 3 rope axes, seq)
    out = left_right_2_no_padding(data)
    assert out["position_ids"][0].tolist() == [[1, 2, 3, 4]] * 3
    assert out["position_ids"][1].tolist() == [[0, 1, 2, 3]] * 3


def test_no_padding_2_padding_takes_the_output_before_each_response_token():
    data = left_right_2_no_padding(_batch())
    # let the "model output" at each position be the token id there: the output scoring response token t is the
    # token before it, so row 0 → [12, 13], row 1 → [23, 0 (padding)]
    assert no_padding_2_padding(data["input_ids"], data).tolist() == [[12, 13], [23, 0]]
    with pytest.raises(ValueError, match="hold 8 tokens, the tensor 7"):
        no_padding_2_padding(torch.zeros(7), data)


def test_no_padding_2_padding_refuses_an_empty_prompt():
    values = torch.arange(3.0)
    # row 0: prompt [1], response [2]; row 1: no prompt, response [3]
    prompts = torch.nested.nested_tensor_from_jagged(torch.tensor([1]), offsets=torch.tensor([0, 1, 1]))
    responses = torch.nested.nested_tensor_from_jagged(torch.tensor([2, 3]), offsets=torch.tensor([0, 1, 2]))
    data = TensorDict({"prompts": prompts, "responses": responses})
    with pytest.raises(ValueError, match=r"rows \[1\] have no token before their response"):
        no_padding_2_padding(values, data)


def test_response_from_and_to_nested():
    seq = torch.nested.nested_tensor_from_jagged(torch.arange(7.0), offsets=torch.tensor([0, 3, 7]))
    mask = torch.nested.nested_tensor_from_jagged(torch.ones(3), offsets=torch.tensor([0, 1, 3]))
    # row 0 = [0, 1, 2], one response token → [1]; row 1 = [3, 4, 5, 6], two → [4, 5]
    picked = response_from_nested(seq, mask)
    assert [t.tolist() for t in picked.unbind()] == [[1.0], [4.0, 5.0]]
    padded = torch.tensor([[7.0, 8.0], [9.0, 10.0]])
    assert [t.tolist() for t in response_to_nested(padded, mask).unbind()] == [[7.0], [9.0, 10.0]]
    with pytest.raises(TypeError, match="must be a nested tensor"):
        response_to_nested(padded, torch.ones(2, 2))


def test_attention_mask_and_embeds():
    ids = torch.nested.nested_tensor_from_jagged(torch.arange(3), offsets=torch.tensor([0, 1, 3]))
    assert build_attention_mask_from_nested(ids).tolist() == [[1, 0], [1, 1]]
    assert build_attention_mask_from_nested(ids, max_seq_len=3).tolist() == [[1, 0, 0], [1, 1, 0]]
    embeds = torch.arange(12.0).reshape(2, 3, 2)
    data = TensorDict({"prompt_embeds": embeds, "prompt_embeds_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])})
    out = embeds_padding_2_no_padding(data)
    assert out["prompt_embeds"][0].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert out["prompt_embeds"][1].tolist() == [[6.0, 7.0]]
    assert out["prompt_embeds_mask"].offsets().tolist() == [0, 2, 3]
