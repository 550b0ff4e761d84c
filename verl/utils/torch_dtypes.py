"""The one table of floating-point dtype names: every config key that names a dtype (``fsdp_config.dtype``,
``mixed_precision.*``, ``rollout.dtype``, the checkpoint engine's and the model merger's) reads it here.

Importing this module does not import torch (the driver process never loads it); ``to_torch_dtype`` does, when
called. ``PrecisionType`` keeps veRL's helper names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPE_NAMES", "PrecisionType", "canonical_dtype_name", "to_torch_dtype"]

# Accepted spellings → the ``torch`` attribute name.
DTYPE_NAMES: dict[str, str] = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "32": "float32",
    "16": "float16",
}


def canonical_dtype_name(name: Any) -> str:
    """``"bf16"`` → ``"bfloat16"``, ``torch.float16`` → ``"float16"``, ``32`` → ``"float32"``; raises ValueError
    listing the accepted names."""
    key = str(name).removeprefix("torch.") if not isinstance(name, int | str) else str(name)
    if key not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; use one of {list(DTYPE_NAMES)}")
    return DTYPE_NAMES[key]


def to_torch_dtype(name: Any) -> torch.dtype:
    """The ``torch.dtype`` of an accepted name (or of a ``torch.dtype`` itself, which must be a listed one)."""
    import torch

    return getattr(torch, canonical_dtype_name(name))


class PrecisionType:
    """veRL's dtype helpers (``verl.utils.torch_dtypes.PrecisionType``), over :data:`DTYPE_NAMES`."""

    @staticmethod
    def supported_type(precision: Any) -> bool:
        try:
            canonical_dtype_name(precision)
        except ValueError:
            return False
        return True

    @staticmethod
    def to_dtype(precision: Any) -> torch.dtype:
        return to_torch_dtype(precision)

    @staticmethod
    def to_str(precision: Any) -> str:
        return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[canonical_dtype_name(precision)]

    @staticmethod
    def is_fp16(precision: Any) -> bool:
        return PrecisionType.supported_type(precision) and canonical_dtype_name(precision) == "float16"

    @staticmethod
    def is_fp32(precision: Any) -> bool:
        return PrecisionType.supported_type(precision) and canonical_dtype_name(precision) == "float32"

    @staticmethod
    def is_bf16(precision: Any) -> bool:
        return PrecisionType.supported_type(precision) and canonical_dtype_name(precision) == "bfloat16"
