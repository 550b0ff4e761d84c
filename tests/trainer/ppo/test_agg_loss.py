"""agg_loss: each mode against the reference, and invariance to splitting a mini-batch over dp ranks × micro-batches."""

from __future__ import annotations

import algo_reference as ref
import pytest
import torch
from algo_reference import assert_tight
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.algorithms.config import LOSS_AGG_MODES
from verl.trainer.ppo.core_algos import agg_loss

MODES = list(LOSS_AGG_MODES)


@st.composite
def split_batches(draw):
    """A mini-batch of dp_size × n_micro × micro_size sequences, some fully masked, with a random loss matrix."""
    dp_size, n_micro, micro_size = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    width = draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    bs = dp_size * n_micro * micro_size
    loss = torch.randn(bs, width, generator=g, dtype=torch.float64)
    mask = (torch.rand(bs, width, generator=g) < 0.6).double()
    return loss, mask, dp_size, n_micro


@settings(max_examples=40, deadline=None)
@given(split_batches(), st.sampled_from(MODES), st.sampled_from([None, 7.0]))
def test_split_over_ranks_and_micro_batches_equals_full_batch(batch, mode, scale):
    loss, mask, dp_size, n_micro = batch
    full = agg_loss(loss, mask, mode, loss_scale_factor=scale)
    assert_tight(full, ref.agg(loss, mask, mode, loss_scale_factor=scale))
    # What the actor does: every rank passes the global counts; gradients add up over micro-batches and the
    # data-parallel reduction averages over ranks.
    global_info = {
        "dp_size": dp_size,
        "batch_num_tokens": mask.sum(),
        "global_batch_size": (mask.sum(-1) > 0).sum(),
        "loss_scale_factor": scale,
    }
    per_rank = zip(loss.chunk(dp_size), mask.chunk(dp_size))
    total = sum(
        agg_loss(micro_loss, micro_mask, mode, **global_info)
        for rank_loss, rank_mask in per_rank
        for micro_loss, micro_mask in zip(rank_loss.chunk(n_micro), rank_mask.chunk(n_micro))
    )
    assert_tight(total / dp_size, full)


def test_hand_worked_modes():
    # Two sequences: losses [1, 2, (pad)] and [3, (pad), (pad)].
    loss = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(agg_loss(loss, mask, "token-mean")) == pytest.approx(6 / 3)  # all tokens equal weight
    assert float(agg_loss(loss, mask, "seq-mean-token-sum")) == pytest.approx((3 + 3) / 2)
    assert float(agg_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx((1.5 + 3) / 2)
    assert float(agg_loss(loss, mask, "seq-mean-token-sum-norm")) == pytest.approx((3 + 3) / 2 / 3)  # ÷ width 3
    assert float(agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=4)) == pytest.approx(6 / 2 / 4)


@pytest.mark.parametrize("mode", MODES)
def test_fully_masked_input_gives_zero_not_nan(mode):
    loss = torch.full((2, 3), float("nan"))
    out = agg_loss(loss, torch.zeros(2, 3), mode)
    assert float(out) == 0.0


def test_bf16_loss_is_aggregated_in_fp32():
    loss = torch.ones(1, 1000, dtype=torch.bfloat16)
    out = agg_loss(loss, torch.ones(1, 1000), "token-mean")
    assert out.dtype == torch.float32 and float(out) == 1.0


def test_errors():
    x = torch.ones(2, 2)
    with pytest.raises(ValueError, match="loss_agg_mode='token-sum-mean'"):
        agg_loss(x, x, "token-sum-mean")
    with pytest.raises(ValueError, match="batch_num_tokens"):
        agg_loss(x, x, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        agg_loss(x, x, "seq-mean-token-mean", dp_size=2)
    with pytest.raises(ValueError, match="must match"):
        agg_loss(x, torch.ones(2, 3), "token-mean")
    with pytest.raises(ValueError, match="dp_size"):
        agg_loss(x, x, "token-mean", dp_size=0)
