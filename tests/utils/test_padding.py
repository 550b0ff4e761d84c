"""verl.utils.padding: packing round trips, that packed sequences never attend to each other, and that the trimmed
layout reads the same response outputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.utils import padding
from verl.utils.padding import (
    block_causal_mask,
    forward_without_padding,
    pack_forward,
    packed_attention_mask,
    packs_sequences,
    pad_input,
    positions_mark_boundaries,
    response_slots,
    trim_padding,
    unpad_input,
)
from verl.utils.tiny_model import build_tiny_qwen2

# Packed vs one-sequence-at-a-time logits in float32 differ only by summation order: measured ≤ 5e-7.
ATOL = 1e-5


@st.composite
def padded_batches(draw):
    bs, width = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    mask = torch.zeros(bs, width, dtype=torch.long)
    for row in range(bs):
        length = draw(st.integers(0, width))
        start = draw(st.integers(0, width - length))  # left and right padding both
        mask[row, start : start + length] = 1
    ids = torch.arange(1, bs * width + 1).reshape(bs, width)
    return ids, mask


@settings(max_examples=60, deadline=None)
@given(padded_batches())
def test_unpad_then_pad_is_the_identity_on_valid_tokens(batch):
    ids, mask = batch
    packed = unpad_input(ids, mask)
    assert packed.input_ids.shape == (1, int(mask.sum()))
    assert packed.cu_seqlens.tolist() == [0, *mask.sum(-1).cumsum(0).tolist()]
    assert packed.max_seqlen == int(mask.sum(-1).max())
    torch.testing.assert_close(pad_input(packed.input_ids[0], packed.indices, *ids.shape), ids * mask)
    # default position ids restart at 0 in every sequence
    for row in range(ids.shape[0]):
        start, end = packed.cu_seqlens[row].item(), packed.cu_seqlens[row + 1].item()
        assert packed.position_ids[0, start:end].tolist() == list(range(end - start))
    assert positions_mark_boundaries(packed)


def test_response_slots_map_to_the_padded_response_slice():
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    ids = torch.arange(12).reshape(2, 6)
    packed = unpad_input(ids, mask)
    keep, slot = response_slots(packed, response_length=3)
    # the padded path reads columns 2..4 (`[:, -3 - 1 : -1]`); row 0's column 5 is padding, so never kept
    got = pad_input(packed.input_ids[0][keep], slot, 2, 3)
    assert got.tolist() == [[2, 3, 4], [8, 9, 10]]


@pytest.mark.parametrize(
    ("positions", "isolated"),
    [
        ([[0, 1, 9], [0, 1, 2]], True),  # the usual ids (row 0 ends in padding)
        ([[2, 3, 9], [2, 3, 4]], True),  # one common first value other than 0
        ([[0, 1, 9], [3, 4, 5]], False),  # steps break at the boundary, but flash attention would see one sequence
        ([[0, 1, 9], [2, 3, 4]], False),  # the 2nd sequence continues the 1st: no rule sees the boundary
        ([[0, 2, 9], [0, 1, 2]], False),  # a gap inside a sequence
    ],
)
def test_positions_mark_boundaries(positions, isolated):
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    packed = unpad_input(torch.ones(2, 3, dtype=torch.long), mask, torch.tensor(positions))
    assert positions_mark_boundaries(packed) == isolated


def test_block_causal_mask_by_hand():
    packed = unpad_input(torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 0], [1, 1, 1]]))
    allowed = block_causal_mask(packed, torch.float32)[0, 0] == 0
    expected = [  # sequence A = tokens 0, 1; sequence B = tokens 2, 3, 4
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    assert allowed.int().tolist() == expected


def one_at_a_time(model, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> list[torch.Tensor]:
    """Each sequence's logits from a forward of that sequence alone (no padding, no neighbours)."""
    out = []
    with torch.no_grad():
        for row in range(ids.shape[0]):
            keep = mask[row].bool()
            out.append(model(input_ids=ids[row, keep][None], position_ids=positions[row, keep][None]).logits[0])
    return out


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("restart", [True, False])
def test_packed_forward_isolates_sequences(backend, restart):
    model = build_tiny_qwen2(seed=0, attn_implementation=backend).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 256, (3, 7), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 0]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    if not restart:  # the 2nd sequence's positions continue the 1st's: transformers would see one sequence
        positions[1] += 5
    with torch.no_grad():
        output, packed = pack_forward(model, ids, mask, positions)
    assert positions_mark_boundaries(packed) == restart
    expected = torch.cat(one_at_a_time(model, ids, mask, positions))
    torch.testing.assert_close(output.logits[0], expected, rtol=0, atol=ATOL)
    assert not torch.allclose(output.logits[0], expected + 1e-4, rtol=0, atol=ATOL)  # the tolerance can fail
    # and the test could see a leak: without the explicit mask the continued positions merge the sequences
    if not restart:
        with torch.no_grad():
            leaky = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits[0]
        assert (leaky - expected).abs().max() > 1e-2


def test_changing_one_sequence_leaves_the_others_alone():
    model = build_tiny_qwen2(seed=1).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 256, (3, 6), generator=g)
    mask = torch.ones_like(ids)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    edited = ids.clone()
    edited[0] = torch.randint(3, 256, (6,), generator=g)
    with torch.no_grad():
        before = pack_forward(model, ids, mask, positions)[0].logits[0]
        after = pack_forward(model, edited, mask, positions)[0].logits[0]
    assert (before[:6] - after[:6]).abs().max() > 1e-2  # the edited sequence changed ...
    torch.testing.assert_close(after[6:], before[6:], rtol=0, atol=ATOL)  # ... its neighbours did not


def test_errors():
    with pytest.raises(ValueError, match="2-D input_ids and attention_mask of one shape"):
        unpad_input(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="multi-axis rope"):
        unpad_input(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3, 2, 3))
    with pytest.raises(ValueError, match="3 values for 2 indices"):
        pad_input(torch.zeros(3), torch.tensor([0, 1]), 1, 2)
    packed = unpad_input(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2), torch.tensor([[0, 1], [2, 3]]))
    flash = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    with pytest.raises(ValueError, match="'flash_attention_2' takes no explicit mask"):
        packed_attention_mask(flash, packed)


def test_trim_padding_drops_only_columns_padded_in_every_row():
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 0, 0]])
    ids = torch.arange(24).reshape(3, 8)
    trimmed = trim_padding(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), response_length=3)
    assert torch.equal(trimmed.input_ids, ids[:, 2:7])  # columns 0-1 and 7 are padding everywhere
    assert torch.equal(trimmed.attention_mask, mask[:, 2:7])
    assert trimmed.indices.tolist() == [r * 8 + c for r in range(3) for c in range(2, 7)]
    assert trimmed.valid.tolist() == mask[:, 2:7].reshape(-1).bool().tolist()
    # the column that predicts the first response token is kept even when some row pads it
    late = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]])
    assert trim_padding(late, late, late, response_length=2).input_ids.shape[1] == 3
    assert trim_padding(late, late, late, response_length=4).input_ids.shape[1] == 5


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_trimmed_and_packed_forwards_read_the_same_response_outputs(backend):
    """Both layouts of use_remove_padding put the same outputs in the (bs, response_length) slots, 0 where the
    predicting token is padding; eager and sdpa trim, flash backends (not on CPU) pack."""
    model = build_tiny_qwen2(seed=0, attn_implementation=backend).eval()
    assert not packs_sequences(model)
    g = torch.Generator().manual_seed(1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 0, 0, 0]])
    ids = torch.randint(3, 256, mask.shape, generator=g) * mask
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    response_length = 4
    read = {}
    with torch.no_grad():
        output, packed = pack_forward(model, ids, mask, positions)
        keep, slot = response_slots(packed, response_length)
        read["pack"] = pad_input(output.logits[0, keep], slot, 3, response_length)
        for only in (False, True):  # the LM head on every token, or on the reading positions only
            output, keep, slot = forward_without_padding(model, ids, mask, positions, response_length, only)
            read[f"trim {only}"] = pad_input(output.logits.flatten(0, 1)[keep], slot, 3, response_length)
        padding.packs_sequences = lambda module: True  # the flash backends' layout, on sdpa
        try:
            output, keep, slot = forward_without_padding(model, ids, mask, positions, response_length, True)
        finally:
            padding.packs_sequences = packs_sequences
        read["pack, reading positions only"] = pad_input(output.logits.flatten(0, 1)[keep], slot, 3, response_length)
    assert output.logits.shape[1] == int(mask[:, -response_length - 1 : -1].sum())  # the head ran on those only
    for name in ("trim False", "trim True", "pack, reading positions only"):
        torch.testing.assert_close(read[name], read["pack"], rtol=0, atol=ATOL, msg=name)
    read["trim"] = read["trim True"]
    predicting = mask[:, -response_length - 1 : -1].bool()
    assert bool((read["trim"][~predicting] == 0).all()) and bool((read["trim"][predicting] != 0).any(-1).all())
