"""Padded batches ⇄ "no padding" (jagged nested tensors) in a TensorDict, veRL's ``verl.workers.utils.padding``.

A left/right-padded batch keeps its prompts left-padded to one width and its responses right-padded to another;
``attention_mask`` (bs, max_seq_len) marks the valid tokens. In the no-padding form each row holds only its valid
tokens, prompt then response, as one jagged nested tensor (``torch.jagged`` layout): ``values()`` is every valid
token end to end and ``offsets()`` (bs + 1,) where each row starts.

The model's per-token outputs (log-probs, values) at position t score token t + 1, so the outputs for a row's
response tokens are the ``response_len`` positions that end one before the row's end: :func:`no_padding_2_padding`
and :func:`response_from_nested` take exactly those. Tensors already laid out per response token (``old_log_probs``,
``advantages``, ...) stay padded; :func:`response_to_nested` cuts them to each row's response length when needed.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from verl.utils import tensordict_utils as tu

__all__ = [
    "build_attention_mask_from_nested",
    "embeds_padding_2_no_padding",
    "left_right_2_no_padding",
    "no_padding_2_padding",
    "response_from_nested",
    "response_to_nested",
]

_REQUIRED = ("input_ids", "attention_mask", "response_mask", "position_ids")


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    """(bs + 1,) int64 row starts of rows with ``lengths`` (bs,)."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.long, device=lengths.device)
    torch.cumsum(lengths.long(), dim=0, out=offsets[1:])
    return offsets


def _jagged_rows(padded: torch.Tensor, valid: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The valid tokens of ``padded`` (bs, seq, ...) under the bool mask ``valid`` (bs, seq), as a jagged nested
    tensor (bs, j, ...) with the given row ``offsets``."""
    return torch.nested.nested_tensor_from_jagged(padded[valid], offsets=offsets)


def left_right_2_no_padding(data: TensorDict) -> TensorDict:
    """Turn a left/right-padded batch into the no-padding form, in place; returns ``data``.

    ``input_ids`` and ``position_ids`` (bs, seq) or multi-axis rope ids (bs, axes, seq) become jagged nested
    tensors of each row's valid tokens, as do ``routed_experts`` and ``teacher_logprobs``/``teacher_ids`` (bs, seq,
    ...) when present. ``loss_mask`` is added as ``response_mask``; ``attention_mask``, ``response_mask`` and
    per-response tensors (``old_log_probs``, ``advantages``, ...) stay padded. Non-tensor entries ``max_seq_len``,
    ``max_response_len`` and ``indices`` (flat positions of the valid tokens in the (bs × seq) layout) record
    what the padded layout was.

    Raises:
        KeyError: one of ``input_ids``, ``attention_mask``, ``response_mask``, ``position_ids`` is missing.
    """
    missing = [key for key in _REQUIRED if key not in data.keys()]
    if missing:
        raise KeyError(f"left_right_2_no_padding needs {list(_REQUIRED)}; missing {missing}")
    input_ids = data["input_ids"]
    valid = data["attention_mask"].bool()
    position_ids = data["position_ids"]
    offsets = _offsets(valid.sum(dim=1))

    tu.assign_non_tensor_data(data, "max_seq_len", input_ids.shape[1])
    tu.assign_non_tensor_data(data, "max_response_len", data["response_mask"].shape[1])
    tu.assign_non_tensor_data(data, "indices", valid.reshape(-1).nonzero(as_tuple=False).squeeze(-1))

    data["input_ids"] = _jagged_rows(input_ids, valid, offsets)
    if position_ids.dim() == 2:
        data["position_ids"] = _jagged_rows(position_ids, valid, offsets)
    else:  # (bs, axes, seq): the ragged dimension is the last one
        rows = [position_ids[i][:, valid[i]] for i in range(valid.shape[0])]
        data["position_ids"] = tu.nested_tensor_from_tensor_list(rows)
    data["loss_mask"] = data["response_mask"]

    routed_experts = data.get("routed_experts", None)
    if isinstance(routed_experts, torch.Tensor) and not routed_experts.is_nested:
        data["routed_experts"] = _jagged_rows(routed_experts, valid, offsets)
    teacher_logprobs, teacher_ids = data.get("teacher_logprobs", None), data.get("teacher_ids", None)
    if isinstance(teacher_logprobs, torch.Tensor) and isinstance(teacher_ids, torch.Tensor):
        data["teacher_logprobs"] = _jagged_rows(teacher_logprobs, valid, offsets)
        data["teacher_ids"] = _jagged_rows(teacher_ids, valid, offsets)
    return data


def _prompt_and_response_lengths(data: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row prompt and response token counts: from nested ``prompts``/``responses``, or from the padded
    ``attention_mask`` split at the (padded) prompt width."""
    prompts, responses = data["prompts"], data["responses"]
    if prompts.is_nested:
        return prompts.offsets().diff(), responses.offsets().diff()
    attention_mask = data["attention_mask"]
    width = prompts.shape[1]
    return attention_mask[:, :width].sum(dim=1).long(), attention_mask[:, width:].sum(dim=1).long()


def _predicting_positions(row_ends: torch.Tensor, response_lens: torch.Tensor) -> torch.Tensor:
    """Flat positions, row by row, of the outputs that score each response token: the ``response_len`` positions
    ending one before each row's end (``row_ends`` (bs,), exclusive)."""
    starts = row_ends - response_lens - 1
    first = torch.repeat_interleave(starts, response_lens)
    within = torch.arange(int(response_lens.sum()), device=row_ends.device) - torch.repeat_interleave(
        _offsets(response_lens)[:-1], response_lens
    )
    return first + within


def _check_room(sequence_lens: torch.Tensor, response_lens: torch.Tensor, what: str) -> None:
    """Each row needs a token before its response (the one that scores the first response token)."""
    short = (sequence_lens <= response_lens).nonzero(as_tuple=False).flatten().tolist()
    if short:
        raise ValueError(
            f"{what}: rows {short[:8]} have no token before their response (sequence lengths "
            f"{sequence_lens[short[:8]].tolist()}, response lengths {response_lens[short[:8]].tolist()}); the "
            "output scoring a response's first token comes from the token before it"
        )


def no_padding_2_padding(tensor: torch.Tensor, data: TensorDict) -> torch.Tensor:
    """Per-token model outputs over the no-padding batch → their response part, right-padded with 0.

    Shape: ``tensor`` nested (bs, j, ...) or flat (total, ...) → (bs, max_response_len, ...). Row i's entry t is
    the output at the position just before its response token t. ``data`` gives the lengths: ``prompts`` and
    ``responses`` (nested, or padded with ``attention_mask``); ``max_response_len`` from the non-tensor entry,
    else the padded ``responses`` width, else the longest response.

    Raises:
        ValueError: the lengths do not add up to ``tensor``'s token count, a row has an empty prompt, or a
            response is longer than ``max_response_len``.
    """
    values = tensor.values() if tensor.is_nested else tensor
    prompt_lens, response_lens = _prompt_and_response_lengths(data)
    prompt_lens, response_lens = prompt_lens.to(values.device), response_lens.to(values.device)
    if data["responses"].is_nested:
        default = int(response_lens.max()) if response_lens.numel() else 0
        max_response_len = tu.get_non_tensor_data(data, "max_response_len", default)
    else:
        max_response_len = data["responses"].shape[1]
    row_ends = _offsets(prompt_lens + response_lens)[1:]
    if row_ends.numel() and int(row_ends[-1]) != values.shape[0]:
        raise ValueError(
            f"no_padding_2_padding: prompts + responses hold {int(row_ends[-1])} tokens, the tensor {values.shape[0]}"
        )
    _check_room(prompt_lens + response_lens, response_lens, "no_padding_2_padding")
    if response_lens.numel() and int(response_lens.max()) > max_response_len:
        raise ValueError(
            f"no_padding_2_padding: a response of {int(response_lens.max())} tokens exceeds "
            f"max_response_len={max_response_len}"
        )
    bs = response_lens.numel()
    rows = torch.repeat_interleave(torch.arange(bs, device=values.device), response_lens)
    cols = torch.arange(rows.numel(), device=values.device) - torch.repeat_interleave(
        _offsets(response_lens)[:-1], response_lens
    )
    out = values.new_zeros((bs, max_response_len, *values.shape[1:]))
    out[rows, cols] = values[_predicting_positions(row_ends, response_lens)]
    return out


def build_attention_mask_from_nested(input_ids: torch.Tensor, max_seq_len: int | None = None) -> torch.Tensor:
    """A right-padded (bs, max_seq_len) int32 mask, 1 on each row's tokens of the nested ``input_ids``;
    ``max_seq_len`` defaults to the longest row.

    Raises:
        TypeError: ``input_ids`` is not a nested tensor.
    """
    if not getattr(input_ids, "is_nested", False):
        raise TypeError("build_attention_mask_from_nested: input_ids must be a nested tensor")
    lengths = input_ids.offsets().diff().to(input_ids.values().device)
    if max_seq_len is None:
        max_seq_len = int(lengths.max()) if lengths.numel() else 0
    positions = torch.arange(max_seq_len, device=lengths.device)
    return (positions.unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int32)


def embeds_padding_2_no_padding(data: TensorDict) -> TensorDict:
    """Strip the padding of prompt embeddings, in place; returns ``data``.

    ``prompt_embeds`` (bs, seq, dim) under ``prompt_embeds_mask`` (bs, seq) become nested (bs, j, dim) of each
    row's masked positions, and the mask a nested all-True bool tensor of the same lengths; likewise
    ``negative_prompt_embeds`` / ``negative_prompt_embeds_mask`` when present."""
    pairs = [("prompt_embeds", "prompt_embeds_mask")]
    if isinstance(data.get("negative_prompt_embeds", None), torch.Tensor):
        pairs.append(("negative_prompt_embeds", "negative_prompt_embeds_mask"))
    for embeds_key, mask_key in pairs:
        valid = data[mask_key].bool()
        offsets = _offsets(valid.sum(dim=1))
        data[embeds_key] = _jagged_rows(data[embeds_key], valid, offsets)
        data[mask_key] = torch.nested.nested_tensor_from_jagged(valid[valid], offsets=offsets)
    return data


def response_from_nested(tensor: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token outputs over whole sequences → the outputs scoring each response token.

    Shape: ``tensor`` nested (bs, prompt_len + response_len), ``response_mask`` nested (bs, response_len) → nested
    (bs, response_len); row i's entry t is the output at the position just before its response token t.

    Raises:
        ValueError: a row has no token before its response.
    """
    values, offsets = tensor.values(), tensor.offsets()
    response_lens = response_mask.offsets().diff().to(offsets.device)
    _check_room(offsets.diff(), response_lens, "response_from_nested")
    picked = values[_predicting_positions(offsets[1:], response_lens)]
    return torch.nested.nested_tensor_from_jagged(picked, offsets=_offsets(response_lens))


def response_to_nested(tensor: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A right-padded per-response-token tensor cut to each row's response length.

    Shape: ``tensor`` (bs, max_response_len, ...), ``response_mask`` nested (bs, response_len) → nested
    (bs, response_len, ...).

    Raises:
        TypeError: ``response_mask`` is not a nested tensor.
    """
    if not getattr(response_mask, "is_nested", False):
        raise TypeError("response_to_nested: response_mask must be a nested tensor")
    response_lens = response_mask.offsets().diff().to(tensor.device)
    valid = torch.arange(tensor.shape[1], device=tensor.device).unsqueeze(0) < response_lens.unsqueeze(1)
    return _jagged_rows(tensor, valid, _offsets(response_lens))
