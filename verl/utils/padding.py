"""Remove padding: run a HF model on the valid tokens of a padded batch packed into one row, and scatter back.

A padded batch (bs, seqlen) with ``attention_mask`` becomes one row of ``total`` valid tokens, each sequence keeping
its own position ids. Attention must not cross sequences. transformers (5.x) recovers the sequences of a packed row
from its position ids when ``attention_mask`` is None: ``masking_utils`` (eager, sdpa, flex) splits wherever
consecutive positions do not step by one, and the flash-attention path starts a sequence wherever the position equals
the row's minimum. Both rules find the right boundaries when every sequence counts up by one from the same first
position (0 for the usual ``cumsum(attention_mask) - 1`` ids), so then no mask is passed. Otherwise (e.g. a
sequence whose positions continue the previous one's) :func:`packed_attention_mask` builds an explicit
block-diagonal causal mask (eager and sdpa backends) or refuses.

Packing pays where attention runs per sequence (the flash-attention backends' variable-length kernels). eager and
sdpa attend over the whole packed row under a block mask, quadratic in the *total* token count, so for them
:func:`forward_without_padding` trims instead: it drops the columns that are padding in every row (the common
left padding of the prompts, the common right padding of the responses) and forwards the rest as a padded batch
(:func:`trim_padding`). Either way the outputs land in the same (bs, response_length) layout through
:func:`response_slots` and :func:`pad_input`, 0 where the token that predicts a response token is padding.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from verl.utils.model import compute_position_id_with_mask

__all__ = [
    "PackedSequences",
    "TrimmedBatch",
    "block_causal_mask",
    "forward_without_padding",
    "pack_forward",
    "packs_sequences",
    "packed_attention_mask",
    "pad_input",
    "positions_mark_boundaries",
    "response_slots",
    "takes_logits_to_keep",
    "trim_padding",
    "unpad_input",
]

# attention backends that take an explicit 4-D additive mask
_EXPLICIT_MASK_BACKENDS = ("eager", "sdpa")


@dataclass(frozen=True)
class PackedSequences:
    """The valid tokens of a padded batch, end to end in one row.

    Attributes:
        input_ids: (1, total) token ids.
        position_ids: (1, total) each token's position id from the padded batch.
        indices: (total,) flat index of each token in the padded (bs × seqlen) layout.
        cu_seqlens: (bs + 1,) int32 cumulative valid-token counts; sequence i is ``[cu[i], cu[i+1])``.
        max_seqlen: the longest sequence's valid-token count.
        batch_size, seqlen: the padded shape.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    batch_size: int
    seqlen: int


def unpad_input(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
) -> PackedSequences:
    """Pack the tokens where ``attention_mask`` is 1, row by row.

    Shape: ``input_ids``, ``attention_mask``, ``position_ids`` (bs, seqlen) → ``PackedSequences`` of total tokens.
    Without ``position_ids`` each sequence's valid tokens get 0, 1, 2, ...

    Raises:
        ValueError: the tensors are not 2-D of one shape (multi-axis rope position ids are not supported).
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"unpad_input needs 2-D input_ids and attention_mask of one shape, got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    if position_ids is None:
        position_ids = compute_position_id_with_mask(attention_mask.long())
    elif position_ids.shape != input_ids.shape:
        raise ValueError(
            f"unpad_input: position_ids {tuple(position_ids.shape)} must match input_ids {tuple(input_ids.shape)} "
            "(multi-axis rope position ids are not supported with use_remove_padding)"
        )
    bs, seqlen = input_ids.shape
    valid = attention_mask.reshape(-1).bool()
    indices = valid.nonzero(as_tuple=False).squeeze(-1)
    lengths = attention_mask.bool().sum(-1)
    cu_seqlens = torch.zeros(bs + 1, dtype=torch.int32, device=input_ids.device)
    cu_seqlens[1:] = lengths.cumsum(0)
    return PackedSequences(
        input_ids=input_ids.reshape(-1)[indices].unsqueeze(0),
        position_ids=position_ids.reshape(-1)[indices].unsqueeze(0),
        indices=indices,
        cu_seqlens=cu_seqlens,
        max_seqlen=int(lengths.max()) if bs else 0,
        batch_size=bs,
        seqlen=seqlen,
    )


def pad_input(values: torch.Tensor, indices: torch.Tensor, batch_size: int, seqlen: int) -> torch.Tensor:
    """Scatter packed per-token values back into the padded layout, 0 at padding.

    Shape: ``values`` (total, ...) with ``indices`` (total,) → (batch_size, seqlen, ...).

    Raises:
        ValueError: ``values`` and ``indices`` disagree on the token count.
    """
    if values.shape[0] != indices.numel():
        raise ValueError(f"pad_input: {values.shape[0]} values for {indices.numel()} indices")
    out = values.new_zeros((batch_size * seqlen, *values.shape[1:]))
    out[indices] = values
    return out.reshape(batch_size, seqlen, *values.shape[1:])


def _sequence_ids(packed: PackedSequences) -> torch.Tensor:
    """(total,) index of the sequence each packed token belongs to, counting only non-empty sequences."""
    rows = packed.indices // packed.seqlen
    return torch.unique_consecutive(rows, return_inverse=True)[1]


def positions_mark_boundaries(packed: PackedSequences) -> bool:
    """Whether transformers can recover the sequences from the packed position ids alone: each sequence starts at
    the row's smallest position (and no other token has it) and steps by one inside."""
    positions = packed.position_ids[0]
    if positions.numel() == 0:
        return True
    seq = _sequence_ids(packed)
    starts = torch.ones_like(seq, dtype=torch.bool)
    starts[1:] = seq[1:] != seq[:-1]
    steps = torch.diff(positions, prepend=positions[:1] - 1)
    return bool(torch.equal(positions == positions.min(), starts) and (steps[~starts] == 1).all())


def block_causal_mask(packed: PackedSequences, dtype: torch.dtype) -> torch.Tensor:
    """An additive mask letting each packed token attend to earlier tokens of its own sequence only.

    Shape: (1, 1, total, total); 0 where attention is allowed, the dtype's minimum elsewhere.
    """
    seq = _sequence_ids(packed)
    total = seq.numel()
    causal = torch.ones(total, total, dtype=torch.bool, device=seq.device).tril()
    allowed = causal & (seq[:, None] == seq[None, :])
    mask = torch.zeros(total, total, dtype=dtype, device=seq.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def packed_attention_mask(module: torch.nn.Module, packed: PackedSequences) -> torch.Tensor | None:
    """The ``attention_mask`` to pass with packed inputs: None when the position ids already isolate the sequences,
    else an explicit block-diagonal causal mask.

    Raises:
        ValueError: the positions do not mark the sequence boundaries and the model's attention backend takes no
            explicit 4-D mask (e.g. flash attention).
    """
    if positions_mark_boundaries(packed):
        return None
    backend = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if backend not in _EXPLICIT_MASK_BACKENDS:
        raise ValueError(
            f"use_remove_padding: the position ids do not count up from 0 in every sequence, and attention backend "
            f"{backend!r} takes no explicit mask; use one of {list(_EXPLICIT_MASK_BACKENDS)} or position ids that "
            "restart at 0 per sequence"
        )
    dtype = next(module.parameters()).dtype
    if not dtype.is_floating_point:
        dtype = torch.float32
    return block_causal_mask(packed, dtype)


def pack_forward(
    module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> tuple[Any, PackedSequences]:
    """Run ``module`` on the packed valid tokens of a padded batch.

    Shape: inputs (bs, seqlen) → the model's output over (1, total) tokens, and the packing to scatter it back.
    """
    packed = unpad_input(input_ids, attention_mask, position_ids)
    output = module(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=packed_attention_mask(module, packed),
        use_cache=False,
    )
    return output, packed


@dataclass(frozen=True)
class TrimmedBatch:
    """A padded batch without the columns that are padding in every row.

    Attributes:
        input_ids, attention_mask, position_ids: (bs, kept) the kept columns ``[start, stop)``.
        indices: (bs × kept,) flat index of each kept token in the padded (bs × seqlen) layout.
        valid: (bs × kept,) whether each kept token is a real token (not padding).
        batch_size, seqlen: the padded shape.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    indices: torch.Tensor
    valid: torch.Tensor
    batch_size: int
    seqlen: int


def trim_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int = 0
) -> TrimmedBatch:
    """Drop the leading and trailing columns where ``attention_mask`` is 0 in every row; the last
    ``response_length + 1`` columns' start is never cut into, so the token that predicts the first response token
    stays (it is the last prompt token, present in every row of a left-padded batch)."""
    bs, seqlen = attention_mask.shape
    used = attention_mask.bool().any(0).nonzero()
    start, stop = (int(used[0]), int(used[-1]) + 1) if used.numel() else (0, seqlen)
    start = min(start, max(seqlen - response_length - 1, 0))
    cols = torch.arange(start, stop, device=attention_mask.device)
    rows = torch.arange(bs, device=attention_mask.device)
    mask = attention_mask[:, start:stop]
    return TrimmedBatch(
        input_ids=input_ids[:, start:stop],
        attention_mask=mask,
        position_ids=position_ids[:, start:stop],
        indices=(rows[:, None] * seqlen + cols[None, :]).reshape(-1),
        valid=mask.reshape(-1).bool(),
        batch_size=bs,
        seqlen=seqlen,
    )


def packs_sequences(module: torch.nn.Module) -> bool:
    """Whether ``use_remove_padding`` packs for this model (a flash-attention backend, whose variable-length
    kernels attend per sequence) rather than trims (eager, sdpa and the rest)."""
    backend = getattr(getattr(module, "config", None), "_attn_implementation", None) or ""
    return "flash" in backend


def forward_without_padding(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    response_logits_only: bool = False,
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Run ``module`` without pad tokens: packed into one row (flash attention) or trimmed (other backends).

    Returns ``(output, keep, slot)``: the model's outputs at the tokens that predict response tokens are
    ``output.logits.flatten(0, 1)[keep]``, and their places in a (bs, response_length) tensor ``slot`` (see
    :func:`pad_input`). With ``response_logits_only`` (a causal LM whose forward takes ``logits_to_keep``) the LM
    head runs on those positions only (trimmed: the last columns from the first reading one) instead of every token.
    """
    packs = packs_sequences(module)
    if packs:
        layout: PackedSequences | TrimmedBatch = unpad_input(input_ids, attention_mask, position_ids)
        inputs = {"attention_mask": packed_attention_mask(module, layout)}
    else:
        layout = trim_padding(input_ids, attention_mask, position_ids, response_length)
        inputs = {"attention_mask": layout.attention_mask}
    keep, slot = response_slots(layout, response_length)
    if response_logits_only:
        if packs:  # the packed row's reading tokens, by index
            inputs["logits_to_keep"] = keep.nonzero().squeeze(1)
            keep = torch.ones(int(keep.sum()), dtype=torch.bool, device=keep.device)
        else:  # every reading column of the trimmed rows lies in its last ``width`` columns
            columns = layout.input_ids.shape[1]
            width = columns - (layout.seqlen - response_length - 1 - int(layout.indices[0]))
            inputs["logits_to_keep"] = width
            keep = keep.view(-1, columns)[:, columns - width :].reshape(-1)
    output = module(input_ids=layout.input_ids, position_ids=layout.position_ids, use_cache=False, **inputs)
    return output, keep, slot


def takes_logits_to_keep(module: torch.nn.Module) -> bool:
    """Whether the model's forward can compute the LM head on some positions only (``logits_to_keep``)."""
    return "logits_to_keep" in inspect.signature(module.forward).parameters


def response_slots(packed: PackedSequences | TrimmedBatch, response_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of the model's tokens (flattened) predict response tokens, and where their outputs go in a
    (bs, response_length) tensor.

    The output at padded column ``c`` predicts token ``c + 1``, so response token ``j`` is read at column
    ``seqlen - response_length - 1 + j`` (as ``logits[:, -response_length - 1 : -1]`` does in the padded layout);
    a trimmed batch's padding tokens are left out (their outputs stay 0, as in a packed row, which has none).

    Returns:
        ``(keep, slot)``: ``keep`` (tokens,) bool selects the tokens; ``slot`` (kept,) is each one's flat index
        into (bs × response_length), for :func:`pad_input`.
    """
    rows = packed.indices // packed.seqlen
    cols = packed.indices % packed.seqlen - (packed.seqlen - response_length - 1)
    keep = (cols >= 0) & (cols < response_length)
    if isinstance(packed, TrimmedBatch):
        keep &= packed.valid
    return keep, rows[keep] * response_length + cols[keep]
