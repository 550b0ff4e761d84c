"""Merging the sharded DCP checkpoint of an ``FSDPEngine`` into a Hugging Face folder, in one process.

``FSDPEngine.save_checkpoint(path)`` writes ``{"model": <module state dict>, "optimizer": ...}`` with
torch.distributed.checkpoint, so the model's tensors are stored under ``model.<HF name>``. Only those entries are
read (their global shapes and dtypes are in ``.metadata``); the optimizer state is never loaded.

A folder in veRL's own FSDP layout (``model_world_size_{W}_rank_{R}.pt`` files, ``fsdp_config.json``) is read by
``verl.model_merger.verl_fsdp`` instead; ``merge_fsdp_checkpoint`` and ``compare_fsdp_checkpoint`` take either.
"""

from __future__ import annotations

import logging
import os
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from verl.model_merger import verl_fsdp
from verl.model_merger.hf_export import (
    build_hf_model,
    compare_state_dicts,
    describe,
    load_reference_state_dict,
    save_hf_model,
)
from verl.utils.torch_dtypes import to_torch_dtype
from verl.workers.engine.checkpoint import METADATA_FILE, check_checkpoint_files
from verl.workers.engine.lora import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_FOLDER,
    is_adapter_name,
    merged_state_dict,
    read_adapter_config,
    sync_name,
)

__all__ = [
    "HF_CONFIG_FOLDER",
    "MODEL_PREFIX",
    "check_model_checkpoint_files",
    "compare_fsdp_checkpoint",
    "load_checkpoint_state_dict",
    "load_fsdp_model_state_dict",
    "merge_fsdp_checkpoint",
    "resolve_config_dir",
]

logger = logging.getLogger(__name__)

# Top-level entry of the DCP state dict holding the model (the other one is "optimizer").
MODEL_PREFIX = "model."
# Sub-folder of a checkpoint where the engine writes the Hugging Face config (and tokenizer, and maybe weights).
HF_CONFIG_FOLDER = "huggingface"


def _torch_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``dtype`` as a torch dtype: the names of `verl.utils.torch_dtypes` (float32/fp32, bfloat16/bf16, ...)."""
    return None if dtype is None else to_torch_dtype(dtype)


def load_fsdp_model_state_dict(local_dir: str, dtype: torch.dtype | str | None = None) -> dict[str, torch.Tensor]:
    """The full model state dict (Hugging Face names, CPU tensors) of the DCP checkpoint at ``local_dir``.

    Works without a process group: empty tensors are built from the global shapes and dtypes in ``.metadata`` and
    filled by ``torch.distributed.checkpoint.load(..., no_dist=True)``, which reads only their byte ranges of the
    ``.distcp`` files (written by any number of ranks). Tensors keep the checkpoint's dtype unless ``dtype`` is
    given. Raises FileNotFoundError / ValueError naming a missing, truncated or corrupt file, or a checkpoint with
    no model state.
    """
    check_checkpoint_files(local_dir)
    metadata = FileSystemReader(local_dir).read_metadata()
    state_dict: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not key.startswith(MODEL_PREFIX):
            continue
        if not isinstance(meta, TensorStorageMetadata):
            raise ValueError(f"{os.path.join(local_dir, METADATA_FILE)}: model entry {key} is not a tensor")
        state_dict[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not state_dict:
        raise ValueError(
            f"{os.path.join(local_dir, METADATA_FILE)} indexes no model state ('{MODEL_PREFIX}*' entries): "
            "not a checkpoint of FSDPEngine.save_checkpoint"
        )
    try:
        with warnings.catch_warnings():  # no_dist always warns that it assumes a single process: that is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state_dict, checkpoint_id=local_dir, no_dist=True)
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        raise ValueError(f"cannot read the model state of the checkpoint {local_dir}: {type(e).__name__}: {e}") from e
    cast = _torch_dtype(dtype)
    merged = {}
    for key, tensor in state_dict.items():
        if cast is not None and tensor.is_floating_point():
            tensor = tensor.to(cast)
        merged[key[len(MODEL_PREFIX) :]] = tensor
    logger.info("read %s from %s", describe(merged), local_dir)
    return merged


def check_model_checkpoint_files(local_dir: str) -> None:
    """Check the files of either layout at ``local_dir`` (DCP, or veRL's ``model_world_size_*_rank_*.pt``); raises
    FileNotFoundError / ValueError naming the missing or damaged file."""
    if verl_fsdp.is_verl_fsdp_checkpoint(local_dir):
        verl_fsdp.check_verl_checkpoint_files(local_dir)
        return
    if os.path.isdir(local_dir) and not any(
        name == METADATA_FILE or name.endswith(".distcp") for name in os.listdir(local_dir)
    ):
        raise FileNotFoundError(
            f"{local_dir} holds no model checkpoint: neither a DCP checkpoint ({METADATA_FILE}, *.distcp) nor veRL's "
            "FSDP rank files (model_world_size_<W>_rank_<R>.pt)"
        )
    check_checkpoint_files(local_dir)


def load_checkpoint_state_dict(local_dir: str, dtype: torch.dtype | str | None = None) -> dict[str, torch.Tensor]:
    """The full model state dict of the checkpoint at ``local_dir``, in either layout (see the module docstring).

    A LoRA checkpoint (peft-wrapped parameters) comes back merged: each adapted weight is ``W + alpha/r · B @ A``
    under its Hugging Face name, with ``alpha`` and ``r`` read from ``<local_dir>/lora_adapter/adapter_config.json``.
    """
    if verl_fsdp.is_verl_fsdp_checkpoint(local_dir):
        state_dict = verl_fsdp.load_verl_fsdp_state_dict(local_dir)
    else:
        state_dict = load_fsdp_model_state_dict(local_dir)
    if any(is_adapter_name(sync_name(key) or "") for key in state_dict):
        state_dict = _merge_lora(local_dir, state_dict)
    cast = _torch_dtype(dtype)
    if cast is None:
        return state_dict
    return {k: v.to(cast) if v.is_floating_point() else v for k, v in state_dict.items()}


def _merge_lora(local_dir: str, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` (peft keys) with its LoRA adapters merged into plain Hugging Face weights."""
    folder = os.path.join(local_dir, ADAPTER_FOLDER)
    try:
        config = read_adapter_config(folder)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{local_dir} holds LoRA weights, but {folder}/{ADAPTER_CONFIG_FILE} (their rank and alpha) is missing"
        ) from e
    merged = merged_state_dict(state_dict, float(config["lora_alpha"]) / int(config["r"]))
    logger.info("merged the LoRA adapters (rank %s, alpha %s) of %s", config["r"], config["lora_alpha"], local_dir)
    return merged


def resolve_config_dir(local_dir: str, hf_model_config_path: str | None) -> str:
    """``hf_model_config_path`` or ``<local_dir>/huggingface``; raises FileNotFoundError when it has no
    ``config.json``."""
    config_dir = hf_model_config_path or os.path.join(local_dir, HF_CONFIG_FOLDER)
    config_file = os.path.join(config_dir, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"{config_file} does not exist: pass --hf_model_config_path (hf_model_config_path=), a folder with the "
            "config.json of the trained model (e.g. the model the training started from)"
        )
    return config_dir


def _checkpoint_state_dict(
    local_dir: str, config_dir: str, backend: str, dtype: torch.dtype | str | None, is_value_model: bool
) -> dict[str, torch.Tensor]:
    """The full HF state dict of an ``fsdp`` or ``megatron`` checkpoint, cast to ``dtype`` if given."""
    if backend == "megatron":
        from verl.model_merger.megatron import load_megatron_state_dict

        state_dict = load_megatron_state_dict(local_dir, config_dir, is_value_model=is_value_model)
        cast = _torch_dtype(dtype)
        return {k: v.to(cast) if cast is not None and v.is_floating_point() else v for k, v in state_dict.items()}
    return load_checkpoint_state_dict(local_dir, dtype=dtype)


def _check_files(local_dir: str, backend: str) -> None:
    if backend == "megatron":
        from verl.model_merger.megatron import check_megatron_checkpoint_files

        check_megatron_checkpoint_files(local_dir)
    else:
        check_model_checkpoint_files(local_dir)


def merge_fsdp_checkpoint(
    local_dir: str,
    target_dir: str,
    *,
    hf_model_config_path: str | None = None,
    is_value_model: bool = False,
    trust_remote_code: bool = False,
    dtype: torch.dtype | str | None = None,
    backend: str = "fsdp",
) -> str:
    """Write the checkpoint at ``local_dir`` (FSDP: DCP or veRL's layout; ``backend="megatron"``: the Megatron
    engine's rank files) as a Hugging Face folder at ``target_dir``; returns ``target_dir``.

    The model config (and tokenizer files) come from ``hf_model_config_path`` (default ``<local_dir>/huggingface``).
    ``is_value_model`` builds a token-classification model with one label (a critic). Weights keep the checkpoint's
    dtype unless ``dtype`` is given. Errors name the missing/corrupt file or the keys that do not fit.
    """
    _check_files(local_dir, backend)
    config_dir = resolve_config_dir(local_dir, hf_model_config_path)
    state_dict = _checkpoint_state_dict(local_dir, config_dir, backend, dtype, is_value_model)
    return save_hf_model(
        state_dict, config_dir, target_dir, is_value_model=is_value_model, trust_remote_code=trust_remote_code
    )


def compare_fsdp_checkpoint(
    local_dir: str,
    test_hf_dir: str,
    *,
    hf_model_config_path: str | None = None,
    is_value_model: bool = False,
    trust_remote_code: bool = False,
    dtype: torch.dtype | str | None = None,
    atol: float = 0.0,
    backend: str = "fsdp",
) -> tuple[int, list[str]]:
    """Compare the model that merging ``local_dir`` would write with the Hugging Face folder ``test_hf_dir``.

    Returns ``(number of tensors compared, differences)``; each difference names a tensor (see
    ``compare_state_dicts``), and the list is empty when names, shapes, dtypes and values (within ``atol``) agree.
    """
    _check_files(local_dir, backend)
    config_dir = resolve_config_dir(local_dir, hf_model_config_path)
    if not os.path.isdir(test_hf_dir):
        raise FileNotFoundError(f"reference folder {test_hf_dir} does not exist")
    state_dict = _checkpoint_state_dict(local_dir, config_dir, backend, dtype, is_value_model)
    merged = build_hf_model(
        state_dict, config_dir, is_value_model=is_value_model, trust_remote_code=trust_remote_code
    ).state_dict()
    reference = load_reference_state_dict(
        test_hf_dir, is_value_model=is_value_model, trust_remote_code=trust_remote_code
    )
    return len(merged), compare_state_dicts(merged, reference, atol=atol)
