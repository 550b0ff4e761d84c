"""Gathering full (unsharded) tensors from FSDP2 shards, one parameter or one bucket of parameters at a time.

Used to push weights to a rollout engine and to export a Hugging Face checkpoint. Every rank of the mesh must
iterate to the end: each gather is a collective.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from verl.utils.dtensor import is_dtensor
from verl.workers.engine.sharding import to_mesh_device

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["WRAPPER_PREFIXES", "hf_name", "iter_full_tensors"]

# Module-name components that wrappers add and Hugging Face names do not have (activation-checkpoint wrapper,
# torch.compile, FSDP1).
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def hf_name(name: str) -> str:
    """The state-dict key with wrapper components removed (``model._orig_mod.layers.0...`` → ``model.layers.0...``)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


# torch >= 2.13 renames all_gather_into_tensor (and warns on the old name).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is None or not tensor.is_floating_point():
        return tensor
    return tensor.to(dtype)


def _rows_per_rank(rows: int, world: int) -> list[int]:
    """Rows of each rank when ``rows`` are split like ``torch.chunk`` (FSDP2's dim-0 sharding)."""
    chunk = -(-rows // world)
    return [max(0, min(chunk, rows - r * chunk)) for r in range(world)]


def _bucketable(tensor: torch.Tensor) -> bool:
    """A DTensor sharded on dim 0 over a 1-D mesh (``Shard(0)`` splits like ``torch.chunk``: same answer on every
    rank, so every rank takes the same path)."""
    if not is_dtensor(tensor) or tensor.device_mesh.ndim != 1:
        return False
    from torch.distributed.tensor import Shard  # loaded: a DTensor exists

    return tuple(tensor.placements) == (Shard(0),)


def _gather_bucket(bucket: list[tuple[str, DTensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """One all-gather for all tensors of the bucket (same dtype; each local shard padded to the
    largest one)."""
    mesh = bucket[0][1].device_mesh
    world = mesh.size()
    out_dtype = bucket[0][1].dtype
    layout = []  # (name, global shape, rows per rank, row numel, offset in the flat per-rank buffer)
    offset = 0
    for name, tensor in bucket:
        rows = _rows_per_rank(tensor.shape[0], world)
        row_numel = math.prod(tensor.shape[1:])
        layout.append((name, tensor.shape, rows, row_numel, offset))
        offset += rows[0] * row_numel
    # On the mesh's device: CPU-offloaded shards (FSDP2's CPUOffloadPolicy) are gathered over nccl on the GPU.
    local = torch.zeros(offset, dtype=out_dtype, device=mesh.device_type)
    for (_, _, _, _, start), (_, tensor) in zip(layout, bucket, strict=True):
        shard = tensor.to_local().reshape(-1)
        local[start : start + shard.numel()].copy_(shard)
    gathered = torch.empty(world * offset, dtype=out_dtype, device=local.device)
    _all_gather_single(gathered, local, group=mesh.get_group())
    gathered = gathered.view(world, offset)
    for name, shape, rows, row_numel, start in layout:
        pieces = [gathered[r, start : start + rows[r] * row_numel] for r in range(world)]
        yield name, torch.cat(pieces).view(shape)


def iter_full_tensors(
    state_dict: dict[str, torch.Tensor], dtype: torch.dtype | None = None, bucket_bytes: int | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name(key), full tensor)`` for each entry of a sharded ``state_dict``, in its order.

    Floating-point tensors are cast to ``dtype`` (before the gather, so less is sent). Without ``bucket_bytes`` each
    DTensor is gathered on its own (``full_tensor``); with it, consecutive dim-0 shards are packed into buckets of
    about ``bucket_bytes`` (gathered bytes, a larger tensor gets a bucket of its own) and gathered with one
    collective each. Other tensors (unsharded buffers) are yielded as they are; so are the shards of a one-rank mesh,
    which hold the whole tensors: those may be views of the live parameters, so copy what you keep.
    """
    bucket: list[tuple[str, DTensor]] = []
    bucket_size = 0
    for key, tensor in state_dict.items():
        name = hf_name(key)
        if is_dtensor(tensor) and tensor.device_mesh.size() == 1 and tensor.to_local().shape == tensor.shape:
            if bucket:
                yield from _gather_bucket(bucket)
                bucket, bucket_size = [], 0
            local = tensor.to_local()  # one rank holds it all: no gather, no copy (a view of the parameter)
            if local.device.type != tensor.device_mesh.device_type:  # CPU-offloaded shards
                local = local.to(tensor.device_mesh.device_type)
            yield name, _cast(local, dtype)
            continue
        if bucket_bytes is not None and _bucketable(tensor):
            tensor = _cast(tensor, dtype)
            size = tensor.numel() * tensor.element_size()
            if bucket and (bucket_size + size > bucket_bytes or tensor.dtype != bucket[0][1].dtype):
                yield from _gather_bucket(bucket)
                bucket, bucket_size = [], 0
            bucket.append((name, tensor))
            bucket_size += size
            continue
        if bucket:
            yield from _gather_bucket(bucket)
            bucket, bucket_size = [], 0
        if is_dtensor(tensor):
            yield name, to_mesh_device(_cast(tensor, dtype)).full_tensor()
        else:
            yield name, _cast(tensor, dtype)
    if bucket:
        yield from _gather_bucket(bucket)
