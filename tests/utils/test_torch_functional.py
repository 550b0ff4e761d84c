"""verl.utils.torch_functional against direct computations."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import verl.utils.torch_functional as F


@st.composite
def masked_values(draw):
    bs, width = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    values = torch.randn(bs, width, generator=g, dtype=torch.float64)
    mask = (torch.rand(bs, width, generator=g) < 0.6).double()
    return values.masked_fill(mask == 0, float("nan")), mask  # padding holds NaN: it must never leak


@settings(max_examples=40, deadline=None)
@given(masked_values())
def test_masked_statistics_match_direct_computation(pair):
    values, mask = pair
    selected = values[mask > 0].tolist()
    assert float(F.masked_sum(values, mask)) == pytest.approx(math.fsum(selected), abs=1e-12)
    assert float(F.masked_mean(values, mask)) == pytest.approx(statistics.fmean(selected) if selected else 0.0)
    for row_values, row_mask, row_mean in zip(values, mask, F.masked_mean(values, mask, axis=-1)):
        row = row_values[row_mask > 0].tolist()
        assert float(row_mean) == pytest.approx(statistics.fmean(row) if row else 0.0)
    if len(selected) >= 2:
        assert float(F.masked_var(values, mask)) == pytest.approx(statistics.variance(selected))
        assert float(F.masked_var(values, mask, unbiased=False)) == pytest.approx(statistics.pvariance(selected))
        white = F.masked_whiten(values, mask)[mask > 0]
        mean, std = statistics.fmean(selected), math.sqrt(statistics.variance(selected) + 1e-8)
        torch.testing.assert_close(white, torch.tensor([(x - mean) / std for x in selected], dtype=torch.float64))
        unshifted = F.masked_whiten(values, mask, shift_mean=False)[mask > 0]
        torch.testing.assert_close(unshifted, white + mean)


def test_masked_var_needs_two_elements():
    x = torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="no element"):
        F.masked_var(x, torch.zeros(2))
    with pytest.raises(ValueError, match="single element"):
        F.masked_var(x, torch.tensor([1.0, 0.0]))


def test_distributed_masked_mean_without_process_group_is_local():
    x, m = torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0])
    assert float(F.distributed_masked_mean(x, m)) == 2.0
    assert float(F.distributed_masked_mean(x, torch.zeros(3))) == 0.0


def test_masked_sum_of_integers_with_a_float_mask():
    assert float(F.masked_sum(torch.tensor([3, 4, 5]), torch.tensor([1.0, 0.5, 0.0]))) == 5.0


def test_clip_by_value_with_tensor_bounds():
    x = torch.tensor([-2.0, 0.5, 3.0])
    assert F.clip_by_value(x, torch.tensor([-1.0, 0.0, 0.0]), torch.tensor([1.0, 0.25, 5.0])).tolist() == [-1, 0.25, 3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk_elements", [1 << 24, 7])
def test_logprobs_from_logits_forward_and_backward(monkeypatch, dtype, chunk_elements):
    monkeypatch.setattr(F, "LOGPROB_CHUNK_ELEMENTS", chunk_elements)  # 7: one row per chunk
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 4, 11, generator=g, dtype=dtype) * 5).requires_grad_(True)
    labels = torch.randint(0, 11, (3, 4), generator=g)
    out = F.logprobs_from_logits(logits, labels)
    expected = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(3, 4, generator=g, dtype=dtype)
    (grad,) = torch.autograd.grad((out * upstream).sum(), logits)
    (expected_grad,) = torch.autograd.grad((expected * upstream).sum(), logits)
    torch.testing.assert_close(grad, expected_grad)


def test_logprobs_from_logits_gradcheck():
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 5, (2, 3))
    assert torch.autograd.gradcheck(lambda x: F.logprobs_from_logits(x, labels), (logits,))


def test_logprobs_from_bf16_logits_are_fp32_and_accurate():
    logits = torch.randn(4, 1000) * 3
    labels = torch.randint(0, 1000, (4,))
    out = F.logprobs_from_logits(logits.bfloat16(), labels)
    expected = torch.log_softmax(logits.bfloat16().float(), -1).gather(-1, labels[:, None]).squeeze(-1)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="labels shape"):
        F.logprobs_from_logits(logits, labels[:2])


def test_entropy_and_sum_pi_squared():
    logits = torch.randn(6, 9, dtype=torch.float64) * 4
    p = torch.softmax(logits, -1)
    entropy = -(p * torch.log(p)).sum(-1)
    torch.testing.assert_close(F.entropy_from_logits(logits), entropy)
    torch.testing.assert_close(F.entropy_from_logits_with_chunking(logits, chunk_size=4), entropy)
    torch.testing.assert_close(F.sum_pi_squared_from_logits(logits), (p**2).sum(-1))
    assert F.entropy_from_logits(logits.bfloat16()).dtype == torch.float32
    with pytest.raises(ValueError, match="chunk_size"):
        F.entropy_from_logits_with_chunking(logits, chunk_size=0)
    with pytest.raises(ValueError, match="rows, vocab"):
        F.entropy_from_logits_with_chunking(logits[None])


def test_response_mask_covers_tokens_up_to_the_first_eos():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 9, 9, 9, 9], [2, 0, 0, 0, 0], [4, 3, 8, 1, 0]])
    assert F.get_response_mask(ids, eos_token=2).tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1],
    ]
    assert F.get_response_mask(ids, eos_token=[2, 3])[3].tolist() == [1, 1, 0, 0, 0]
    assert F.get_response_mask(ids, dtype=torch.bool).dtype == torch.bool


def test_positions_and_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert F.compute_position_id_with_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]
    x = torch.tensor([[1, 2]])
    assert F.pad_sequence_to_length(x, 4, 0).tolist() == [[1, 2, 0, 0]]
    assert F.pad_sequence_to_length(x, 4, 9, left_pad=True).tolist() == [[9, 9, 1, 2]]
    assert F.pad_sequence_to_length(x, 1, 0) is x
    assert F.pad_2d_list_to_length([[1], [2, 3]], 0).tolist() == [[1, 0], [2, 3]]
    assert F.pad_2d_list_to_length([[1], [2, 3]], 0, max_length=3).tolist() == [[1, 0, 0], [2, 3, 0]]


def test_as_torch_index_groups_equal_ids_together():
    cases = [
        np.array(["b", "a", "b", None, None], dtype=object),
        ["b", "a", "b", "c", "c"],
        np.array([10, -1, 10, 7, 7]),
        torch.tensor([10, -1, 10, 7, 7]),
        np.array([0.5, 1.5, 0.5, 2.0, 2.0]),
    ]
    for index in cases:
        dense = F.as_torch_index(index)
        assert dense.dtype == torch.long and dense.shape == (5,)
        assert dense[0] == dense[2] and dense[3] == dense[4] and len(set(dense.tolist())) == 3
        assert sorted(set(dense.tolist())) == [0, 1, 2]
    with pytest.raises(ValueError, match="1-D"):
        F.as_torch_index(np.zeros((2, 2)))


def test_group_mean_std():
    scores = torch.tensor([1.0, 5.0, 3.0, 0.1, 0.1, 0.1, 7.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    mean, std, count = F.group_mean_std(scores, groups, eps=0.0)
    assert count.tolist() == [3, 3, 1]
    assert mean[0] == pytest.approx(3.0) and std[0] == pytest.approx(statistics.stdev([1, 5, 3]))
    assert float(mean[1]) == float(torch.tensor(0.1).double()) and float(std[1]) == 0.0  # exact for equal scores
    assert (float(mean[2]), float(std[2])) == (0.0, 1.0)  # singleton
    _, floored, _ = F.group_mean_std(scores, groups, eps=0.25)
    assert float(floored[1]) == 0.5
    assert float(F.group_mean_std(scores, groups)[1][1]) == pytest.approx(1e-3)  # veRL's default floor, eps=1e-6
    with pytest.raises(ValueError, match="equal 1-D shapes"):
        F.group_mean_std(scores, groups[:3])
    assert F.group_sum(torch.ones(3, 2), torch.tensor([1, 1, 0])).tolist() == [[1, 1], [2, 2]]
    weighted, total = F.group_mean(
        torch.tensor([1.0, 4.0, 9.0]), torch.tensor([0, 0, 1]), 3, torch.tensor([1.0, 3.0, 0.0])
    )
    assert weighted.tolist() == [3.25, 0.0, 0.0] and total.tolist() == [4.0, 0.0, 0.0]  # zero weight → mean 0
