"""``is_dtensor`` without importing ``torch.distributed.tensor`` (~0.4 s of a worker's start-up): a DTensor can only
exist once that package has been imported (by FSDP2's ``fully_shard``, by DCP), so before that the answer is no."""

from __future__ import annotations

import sys
from typing import Any


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a ``torch.distributed.tensor.DTensor``."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)
