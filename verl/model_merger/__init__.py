"""Merging sharded training checkpoints into Hugging Face model folders (``python -m verl.model_merger``).

The names below are imported lazily, so ``verl.model_merger.hf_export`` (used by the FSDP engine) can be imported
without the DCP reader, and the reader without the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BaseModelMerger": "verl.model_merger.base_model_merger",
    "ModelMergerConfig": "verl.model_merger.base_model_merger",
    "validate_hf_model_output": "verl.model_merger.output_validation",
    "build_hf_model": "verl.model_merger.hf_export",
    "compare_state_dicts": "verl.model_merger.hf_export",
    "save_hf_model": "verl.model_merger.hf_export",
    "compare_fsdp_checkpoint": "verl.model_merger.fsdp",
    "load_fsdp_model_state_dict": "verl.model_merger.fsdp",
    "merge_fsdp_checkpoint": "verl.model_merger.fsdp",
    "load_checkpoint_state_dict": "verl.model_merger.fsdp",
    "is_verl_fsdp_checkpoint": "verl.model_merger.verl_fsdp",
    "load_verl_fsdp_state_dict": "verl.model_merger.verl_fsdp",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
