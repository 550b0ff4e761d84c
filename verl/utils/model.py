"""veRL's ``verl.utils.model`` helpers that recipes import."""

from __future__ import annotations

import torch

__all__ = ["compute_position_id_with_mask"]


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a (left- or right-padded) attention mask: 0 at the first real token, counting real tokens,
    and 0 on the left padding."""
    return torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0)
