"""veRL's ``verl.utils.attention_utils``: flash-attn's ``bert_padding`` helpers, in plain torch.

Forks write ``ids_rmpad, indices, cu_seqlens, *_ = unpad_input(input_ids.unsqueeze(-1), attention_mask)`` and
``index_first_axis(rearrange(position_ids.unsqueeze(-1), "b s ... -> (b s) ..."), indices)``; these functions keep
flash-attn's signatures and results on any device, with no flash-attn. :func:`pad_input` is
:func:`verl.utils.padding.pad_input` (the same contract), and :func:`unpad_input` takes its indices and
``cu_seqlens`` from :func:`verl.utils.padding.unpad_input`. :func:`rearrange` is ``einops.rearrange`` when einops
is installed; without it, only the flatten ``"b s ... -> (b s) ..."`` and its inverse ``"(b s) ... -> b s ..."``
(with ``b=`` or ``s=``) are understood, and any other pattern raises ``ImportError`` naming einops.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from verl.utils.padding import pad_input
from verl.utils.padding import unpad_input as _pack

__all__ = ["index_first_axis", "pad_input", "rearrange", "unpad_input"]

_FLATTEN = "b s ... -> (b s) ..."
_UNFLATTEN = "(b s) ... -> b s ..."


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:  # noqa: A002 - flash-attn's name
    """The rows ``indices`` of ``input``. Shape: (N, ...) with (k,) → (k, ...)."""
    return input[indices]


def unpad_input(
    hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Keep the tokens where ``attention_mask`` (or ``unused_mask``) is set, row by row (flash-attn ≥ 2.7's result).

    Shape: ``hidden_states`` (b, s, ...), masks (b, s) → ``(hidden (total, ...), indices (total,), cu_seqlens
    (b + 1,) int32, max_seqlen, seqused (b,) int32)``. ``seqused`` counts the ``attention_mask`` tokens only;
    ``unused_mask`` marks tokens that are kept but not attended (flash-attn's meaning).
    """
    if hidden_states.shape[:2] != attention_mask.shape:
        raise ValueError(
            f"unpad_input: hidden_states {tuple(hidden_states.shape)} must start with the mask's shape "
            f"{tuple(attention_mask.shape)}"
        )
    kept = attention_mask.bool() if unused_mask is None else attention_mask.bool() | unused_mask.bool()
    packed = _pack(kept.long(), kept.long())
    seqused = attention_mask.bool().sum(-1, dtype=torch.int32)
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, packed.indices), packed.indices, packed.cu_seqlens, packed.max_seqlen, seqused


def rearrange(tensor: torch.Tensor, pattern: str, **axes_lengths: Any) -> torch.Tensor:
    """``einops.rearrange`` (or the flatten / unflatten of the first two axes without einops; see the module doc)."""
    if importlib.util.find_spec("einops") is not None:
        import einops

        return einops.rearrange(tensor, pattern, **axes_lengths)
    normalized = " ".join(pattern.split())
    if normalized == _FLATTEN and not axes_lengths:
        return tensor.reshape(-1, *tensor.shape[2:])
    if normalized == _UNFLATTEN and set(axes_lengths) in ({"b"}, {"s"}, {"b", "s"}):
        first = tensor.shape[0]
        b = axes_lengths.get("b", first // axes_lengths["s"] if "s" in axes_lengths else None)
        s = axes_lengths.get("s", first // b)
        if b * s != first:
            raise ValueError(f"rearrange {pattern!r}: {first} rows are not b={b} × s={s}")
        return tensor.reshape(b, s, *tensor.shape[1:])
    raise ImportError(
        f"rearrange({pattern!r}, {axes_lengths}) needs einops (pip install einops); without it only "
        f"{_FLATTEN!r} and {_UNFLATTEN!r} (with b= or s=) are supported"
    )
