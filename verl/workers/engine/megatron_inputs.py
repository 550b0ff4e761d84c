"""A padded batch as Megatron's local attention takes it, and the model's outputs back in the batch's layout.

Megatron's rotary embedding numbers the positions 0 … s−1 along the sequence and ignores ``position_ids``, and its
local attention (the one that runs without Transformer Engine) takes padded batches with an explicit mask, not packed
sequences. Our batches are left-padded prompts followed by right-padded responses, with ``position_ids`` counting
from each row's first real token. Rolling each row left by its number of leading pads puts its first token at
position 0, so Megatron's positions are the batch's; a causal mask that also hides padded keys keeps the padding out
of every real token's attention. Under sequence parallelism the length is padded to a multiple of the
tensor-parallel size. :meth:`McoreInputs.restore` undoes both on the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["McoreInputs"]


@dataclass
class McoreInputs:
    """The model's inputs of one micro-batch (``input_ids``, ``position_ids``, ``attention_mask``: what
    ``GPTModel.forward`` takes) and what :meth:`restore` needs."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor  # (bs, 1, s, s) bool, True where attention is not allowed
    unroll: torch.Tensor  # (bs, s) gather index back to the batch's layout
    length: int  # the batch's sequence length (before padding to a multiple of the tp size)

    @classmethod
    def from_batch(
        cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, multiple_of: int = 1
    ) -> McoreInputs:
        """Raises ValueError when a row's attention mask is not one run of ones (its positions would differ)."""
        bs, length = input_ids.shape
        mask = attention_mask.bool()
        lead = (mask.long().cumsum(-1) == 0).sum(-1)  # leading pads of each row
        arange = torch.arange(length, device=input_ids.device)
        roll = (arange[None] + lead[:, None]) % length
        ids, rolled_mask = input_ids.gather(1, roll), mask.gather(1, roll)
        real = rolled_mask.sum(-1)
        if not torch.equal(rolled_mask, arange[None] < real[:, None]):
            rows = torch.nonzero((rolled_mask != (arange[None] < real[:, None])).any(-1)).flatten().tolist()
            raise ValueError(
                f"rows {rows[:8]} of the batch have an attention_mask with holes: the Megatron engine takes each "
                "row's tokens as one run (left padding, then tokens, then right padding)"
            )
        expected = torch.where(rolled_mask, arange[None].expand(bs, -1), 0)
        if not torch.equal(torch.where(rolled_mask, position_ids.gather(1, roll), 0), expected):
            raise ValueError(
                "position_ids do not count 0, 1, 2, ... from each row's first token: Megatron's rotary embedding "
                "numbers positions along the sequence (multimodal or custom position ids are not supported)"
            )
        padded = -(-length // multiple_of) * multiple_of
        if padded != length:
            ids = torch.nn.functional.pad(ids, (0, padded - length))
            rolled_mask = torch.nn.functional.pad(rolled_mask, (0, padded - length))
        positions = torch.arange(padded, device=input_ids.device)
        causal = positions[None, :] <= positions[:, None]  # (query, key)
        allowed = causal[None] & rolled_mask[:, None, :]
        unroll = (arange[None] - lead[:, None]) % length
        return cls(ids, positions[None].expand(bs, -1), ~allowed[:, None], unroll, length)

    def restore(self, output: torch.Tensor) -> torch.Tensor:
        """A (bs, s_padded, ...) output of the model back in the batch's layout, (bs, s, ...)."""
        output = output[:, : self.length]
        index = self.unroll.view(*self.unroll.shape, *([1] * (output.dim() - 2))).expand_as(output)
        return output.gather(1, index)
