"""Read a Megatron engine checkpoint (`verl.workers.engine.megatron_engine`) as a full Hugging Face state dict.

The checkpoint folder holds one file per rank, ``mp_rank_<tp:02d>_<pp:03d>_<dp:03d>.pt``, each with that rank's
Megatron state dict under ``"model"``, and ``huggingface/`` with the model's config. Data-parallel ranks hold the same
weights, so the files of dp rank 0 are read: for each pipeline stage its tensor-parallel shards are put back
together (`verl.models.mcore.weight_converter.mcore_to_hf`, exact), stage after stage.
"""

from __future__ import annotations

import logging
import os
import re

import torch

from verl.models.mcore.weight_converter import layout_of, mcore_to_hf

__all__ = ["check_megatron_checkpoint_files", "is_megatron_checkpoint", "load_megatron_state_dict"]

logger = logging.getLogger(__name__)

SHARD = re.compile(r"^mp_rank_(\d{2})_(\d{3})_(\d{3})\.pt$")


def _shards(local_dir: str) -> dict[tuple[int, int], str]:
    """``{(tp_rank, pp_rank): file}`` of data-parallel rank 0."""
    found = {}
    for name in os.listdir(local_dir) if os.path.isdir(local_dir) else ():
        match = SHARD.match(name)
        if match and int(match.group(3)) == 0:
            found[(int(match.group(1)), int(match.group(2)))] = os.path.join(local_dir, name)
    return found


def is_megatron_checkpoint(local_dir: str) -> bool:
    """Whether ``local_dir`` holds a Megatron engine checkpoint."""
    return bool(_shards(local_dir))


def check_megatron_checkpoint_files(local_dir: str) -> tuple[int, int]:
    """The checkpoint's ``(tp, pp)`` sizes; raises FileNotFoundError when the folder, or one of its shards, is
    missing."""
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"checkpoint folder {local_dir} does not exist")
    shards = _shards(local_dir)
    if not shards:
        raise FileNotFoundError(f"{local_dir} holds no Megatron checkpoint (mp_rank_<tp>_<pp>_000.pt files)")
    tp = 1 + max(t for t, _ in shards)
    pp = 1 + max(p for _, p in shards)
    missing = [f"mp_rank_{t:02d}_{p:03d}_000.pt" for t in range(tp) for p in range(pp) if (t, p) not in shards]
    if missing:
        raise FileNotFoundError(f"the Megatron checkpoint {local_dir} lacks {missing} (tp={tp}, pp={pp})")
    return tp, pp


def load_megatron_state_dict(local_dir: str, config_dir: str, is_value_model: bool = False) -> dict[str, torch.Tensor]:
    """The full Hugging Face state dict of the Megatron checkpoint at ``local_dir`` (the model's config in
    ``config_dir``). Raises FileNotFoundError naming a missing shard."""
    from transformers import AutoConfig

    tp, pp = check_megatron_checkpoint_files(local_dir)
    shards = _shards(local_dir)
    layout = layout_of(AutoConfig.from_pretrained(config_dir), tp, pp, value_model=is_value_model)
    state: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        models = [torch.load(shards[(t, stage)], map_location="cpu", weights_only=False)["model"] for t in range(tp)]
        state.update(mcore_to_hf(models, layout, stage))
    logger.info("read the Megatron checkpoint %s (tp=%d, pp=%d): %d tensors", local_dir, tp, pp, len(state))
    return state
