"""Reading the FSDP checkpoints written by veRL's ``FSDPCheckpointManager``, in one process, without a process group.

veRL's layout (``global_step_<N>/actor``)::

    model_world_size_{W}_rank_{R}.pt        torch.save of rank R's sharded model state dict (parameter names as in the
                                            Hugging Face model; DTensor values for FSDP2 and for FSDP1 with a device
                                            mesh, plain tensors for buffers)
    optim_world_size_{W}_rank_{R}.pt        optimizer state (never read here)
    extra_state_world_size_{W}_rank_{R}.pt  lr scheduler and random states (never read here)
    fsdp_config.json                        {"FSDP_version": 1 or 2, "world_size": W}
    huggingface/                            config.json, tokenizer files (and the full weights with ``hf_model``)

The rank files are pickles (``weights_only=False`` is needed for DTensors): load only checkpoints you trust. A
DTensor unpickles without a process group (its DeviceMesh keeps the rank layout as a tensor and its ProcessGroups
are not pickled), so each one is read as its local shard, its placements and its mesh, and the full tensor is built
by concatenating the shards of the ranks along the mesh dimensions they are sharded on (``Shard(d)``) and taking one
replica where they are replicated (``Replicate()``, e.g. the ``ddp`` dimension of HSDP).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard

__all__ = [
    "FSDP_CONFIG_FILE",
    "assemble_dtensor",
    "check_verl_checkpoint_files",
    "is_verl_fsdp_checkpoint",
    "load_verl_fsdp_state_dict",
    "verl_model_file",
]

logger = logging.getLogger(__name__)

FSDP_CONFIG_FILE = "fsdp_config.json"
MODEL_FILE_PATTERN = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
# Module wrappers whose names may be left in parameter names (FSDP1, activation checkpointing, torch.compile).
_WRAPPER_NAMES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_DCP_METADATA = ".metadata"


def verl_model_file(local_dir: str, world_size: int, rank: int) -> str:
    """The path of rank ``rank``'s model file in a veRL FSDP checkpoint of ``world_size`` ranks."""
    return os.path.join(local_dir, f"model_world_size_{world_size}_rank_{rank}.pt")


def _model_files(local_dir: str) -> dict[int, set[int]]:
    """``{world size: {ranks}}`` of the ``model_world_size_*_rank_*.pt`` files in ``local_dir``."""
    found: dict[int, set[int]] = {}
    for name in os.listdir(local_dir):
        match = MODEL_FILE_PATTERN.match(name)
        if match:
            found.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    return found


def is_verl_fsdp_checkpoint(local_dir: str) -> bool:
    """Whether ``local_dir`` is laid out as veRL's FSDP checkpoints (rank model files or ``fsdp_config.json``, and
    no DCP ``.metadata``)."""
    if not os.path.isdir(local_dir) or os.path.isfile(os.path.join(local_dir, _DCP_METADATA)):
        return False
    return bool(_model_files(local_dir)) or os.path.isfile(os.path.join(local_dir, FSDP_CONFIG_FILE))


def _read_fsdp_config(local_dir: str) -> dict[str, Any] | None:
    """The contents of ``fsdp_config.json`` (None when absent: older veRL versions did not write it)."""
    path = os.path.join(local_dir, FSDP_CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not readable JSON ({type(e).__name__}: {e})") from e
    world_size = config.get("world_size") if isinstance(config, dict) else None
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"{path} has no positive integer 'world_size' (veRL writes {{'FSDP_version', 'world_size'}})")
    return config


def check_verl_checkpoint_files(local_dir: str) -> int:
    """Check the model files of the veRL FSDP checkpoint ``local_dir`` and return its world size.

    The world size comes from the file names (``model_world_size_{W}_rank_{R}.pt``) and must agree with
    ``fsdp_config.json`` when that exists. Raises FileNotFoundError naming the first missing rank file, ValueError
    naming ``fsdp_config.json`` when it disagrees or the files when several world sizes are mixed.
    """
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"checkpoint folder {local_dir} does not exist")
    found = _model_files(local_dir)
    config = _read_fsdp_config(local_dir)
    config_file = os.path.join(local_dir, FSDP_CONFIG_FILE)
    if config is not None:
        world_size = config["world_size"]
        if found and world_size not in found:
            names = ", ".join(f"model_world_size_{w}_rank_*.pt" for w in sorted(found))
            raise ValueError(
                f"{config_file} says world_size={world_size}, but the model files of {local_dir} are {names}"
            )
        if len(found) > 1:
            logger.warning(
                "%s: ignoring the model files of world sizes %s", local_dir, sorted(set(found) - {world_size})
            )
    elif len(found) == 1:
        (world_size,) = found
    elif found:
        raise ValueError(
            f"{local_dir} holds model files of several world sizes ({', '.join(map(str, sorted(found)))}) and no "
            f"{FSDP_CONFIG_FILE} to choose one: remove the stale files"
        )
    else:
        raise FileNotFoundError(f"{local_dir} holds no veRL model files (model_world_size_<W>_rank_<R>.pt)")
    for rank in range(world_size):
        path = verl_model_file(local_dir, world_size, rank)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"checkpoint file {path} is missing (rank {rank} of world size {world_size}; every rank saves one)"
            )
    return world_size


class _SilenceMeshUnpickling(logging.Filter):
    """Drops DeviceMesh's warning that its process groups do not exist when it is unpickled: expected here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "unpickling of the DeviceMesh" not in record.getMessage()


def _load_rank_file(path: str) -> dict[str, Any]:
    """``torch.load`` of one rank file on the CPU (memory-mapped), or ValueError naming it."""
    mesh_logger = logging.getLogger("torch.distributed.device_mesh")
    quiet = _SilenceMeshUnpickling()
    mesh_logger.addFilter(quiet)
    try:
        try:
            state_dict = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            state_dict = torch.load(path, map_location="cpu", weights_only=False)  # the legacy (non-zip) format
    except Exception as e:
        if "ShardedTensor" in str(e):
            raise ValueError(
                f"{path} holds ShardedTensor values (FSDP1 without a device mesh), which cannot be read without the "
                "training's process group: not supported (veRL's FSDP1 workers save DTensors)"
            ) from e
        raise ValueError(f"checkpoint file {path} is truncated or corrupt ({type(e).__name__}: {e})") from e
    finally:
        mesh_logger.removeFilter(quiet)
    if not isinstance(state_dict, dict):
        raise ValueError(f"checkpoint file {path} holds a {type(state_dict).__name__}, not a model state dict")
    return state_dict


def assemble_dtensor(
    name: str,
    mesh: torch.Tensor,
    placements: Sequence[Any],
    local_tensor: Callable[[int, tuple[int, ...]], torch.Tensor],
) -> torch.Tensor:
    """The full tensor of a DTensor from its shards: ``local_tensor(rank, coordinate)`` gives the local tensor of
    the rank at that mesh coordinate; ``mesh`` holds the ranks (one dimension per mesh dimension).

    Mesh dimension ``i`` with ``Shard(d)`` concatenates its ranks' pieces along tensor dimension ``d`` (in order,
    so uneven ``torch.chunk`` shards work); with ``Replicate()`` the first replica is taken. Raises ValueError
    naming ``name`` for other placements (``Partial``, the strided shards of FSDP + TP).
    """
    if len(placements) != mesh.ndim:
        raise ValueError(f"{name}: {len(placements)} placements for a {mesh.ndim}-dimensional device mesh")

    def build(coordinate: tuple[int, ...]) -> torch.Tensor:
        dim = len(coordinate)
        if dim == mesh.ndim:
            return local_tensor(int(mesh[coordinate]), coordinate)
        placement = placements[dim]
        if placement.is_replicate():
            return build((*coordinate, 0))
        if type(placement) is not Shard:
            raise ValueError(f"{name}: placement {placement} is not supported (only Shard(d) and Replicate())")
        return torch.cat([build((*coordinate, i)) for i in range(mesh.shape[dim])], dim=placement.dim)

    return build(())


def _hf_name(key: str) -> str:
    for wrapper in _WRAPPER_NAMES:
        key = key.replace(wrapper, "")
    return key


class _RankFiles:
    """The rank files of one checkpoint, each loaded on first use."""

    def __init__(self, local_dir: str, world_size: int):
        self.local_dir, self.world_size = local_dir, world_size
        self._loaded: dict[int, dict[str, Any]] = {}

    def path(self, rank: int) -> str:
        return verl_model_file(self.local_dir, self.world_size, rank)

    def __getitem__(self, rank: int) -> dict[str, Any]:
        if rank not in self._loaded:
            self._loaded[rank] = _load_rank_file(self.path(rank))
        return self._loaded[rank]

    def value(self, rank: int, key: str) -> Any:
        state_dict = self[rank]
        if key not in state_dict:
            raise ValueError(f"checkpoint file {self.path(rank)} has no entry {key} (rank 0's file has it)")
        return state_dict[key]


def _merge_dtensor(files: _RankFiles, key: str, first: DTensor) -> torch.Tensor:
    mesh, placements = first.device_mesh.mesh, tuple(first.placements)
    if mesh.numel() != files.world_size:
        raise ValueError(
            f"{files.path(0)}: the device mesh of {key} spans {mesh.numel()} ranks, but the checkpoint has "
            f"{files.world_size} (world size of the file names)"
        )

    def local_tensor(rank: int, coordinate: tuple[int, ...]) -> torch.Tensor:
        value = files.value(rank, key)
        if not isinstance(value, DTensor) or tuple(value.placements) != placements or value.shape != first.shape:
            raise ValueError(
                f"checkpoint file {files.path(rank)}: {key} is not sharded like in rank 0's file "
                f"(placements {placements}, global shape {tuple(first.shape)})"
            )
        try:
            saved_at = value.device_mesh.get_coordinate()
        except Exception:  # other torch versions may need the process group for it: skip the check
            saved_at = None
        if saved_at is not None and tuple(saved_at) != coordinate:
            raise ValueError(
                f"checkpoint file {files.path(rank)} was saved by the rank at mesh coordinate {tuple(saved_at)}, "
                f"not {coordinate} (renamed or mixed-up rank files?)"
            )
        return value._local_tensor

    full = assemble_dtensor(key, mesh, placements, local_tensor)
    if all(p.is_replicate() for p in placements):
        full = full.clone()  # not a view of the memory-mapped file
    if full.shape != first.shape:
        raise ValueError(f"{files.local_dir}: the shards of {key} make {tuple(full.shape)}, not {tuple(first.shape)}")
    return full


def _merge_plain(files: _RankFiles, key: str, first: torch.Tensor) -> torch.Tensor:
    """A tensor that is not a DTensor: the same on every rank (a buffer, which FSDP does not shard; or world size
    1) is taken once; otherwise the ranks' pieces are concatenated along dim 0 (local shards, veRL's rule)."""
    pieces = [first] + [files.value(rank, key) for rank in range(1, files.world_size)]
    for rank, piece in enumerate(pieces):
        if not isinstance(piece, torch.Tensor) or isinstance(piece, DTensor):
            raise ValueError(f"checkpoint file {files.path(rank)}: {key} is a {type(piece).__name__}, unlike rank 0's")
    if all(p.shape == first.shape and p.dtype == first.dtype and torch.equal(p, first) for p in pieces[1:]):
        return first.clone()
    if first.ndim == 0:
        raise ValueError(f"{files.local_dir}: the scalar {key} differs between the ranks' files")
    return torch.cat(pieces, dim=0)


def load_verl_fsdp_state_dict(local_dir: str, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full model state dict (Hugging Face names, CPU tensors) of veRL's FSDP checkpoint at ``local_dir``.

    Needs no process group: each rank file is memory-mapped, and every DTensor is rebuilt from the local shards
    of all ranks (``assemble_dtensor``). Tensors keep the checkpoint's dtype unless ``dtype`` is given (veRL's own
    merger always writes bfloat16). Raises FileNotFoundError / ValueError naming the missing or damaged file, or
    the entry whose shards do not fit together.
    """
    world_size = check_verl_checkpoint_files(local_dir)
    files = _RankFiles(local_dir, world_size)
    reference = files[0]
    for rank in range(1, world_size):
        extra = sorted(set(files[rank]) - set(reference))
        if extra:
            raise ValueError(f"checkpoint file {files.path(rank)} has entries rank 0's file lacks: {extra[:5]}")
    merged: dict[str, torch.Tensor] = {}
    for key, first in reference.items():
        name = _hf_name(key)
        if name in merged:
            raise ValueError(f"checkpoint file {files.path(0)}: two entries are named {name} once unwrapped")
        if isinstance(first, DTensor):
            tensor = _merge_dtensor(files, key, first)
        elif isinstance(first, torch.Tensor):
            tensor = _merge_plain(files, key, first)
        else:
            raise ValueError(f"checkpoint file {files.path(0)}: {key} is a {type(first).__name__}, not a tensor")
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        merged[name] = tensor.contiguous()
    if not merged:
        raise ValueError(f"checkpoint file {files.path(0)} holds an empty state dict")
    config = _read_fsdp_config(local_dir) or {}
    kinds = sorted({type(v).__name__ for v in reference.values()})
    logger.info(
        "read %d tensors of %d rank files (FSDP_version %s, %s) from %s",
        len(merged),
        world_size,
        config.get("FSDP_version", "unknown"),
        "/".join(kinds),
        local_dir,
    )
    return merged
