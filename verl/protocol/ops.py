"""Helpers over `DataProto`: padding to a divisor, folding the batch dimension, collating single rows, all-gathering
across a process group, and veRL's tensor / TensorDict serialization into ``(dtype, shape, uint8 numpy buffer)``
tuples. Re-exported from :mod:`verl.protocol` (veRL's import path)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl.protocol.core import DataProto, DataProtoItem
from verl.utils.errors import InvalidDataError
from verl.utils.tensordict_import import TensorDict
from verl.utils.tensordict_utils import as_object_array

__all__ = [
    "all_gather_data_proto",
    "collate_fn",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "numpy_dict_to_tensor_dict",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "unpad_dataproto",
]


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` with copies of its first rows until its length divides ``size_divisor``.

    Returns:
        ``(padded, pad_size)``; ``unpad_dataproto(padded, pad_size)`` recovers ``data``.
    """
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be positive, got {size_divisor}")
    if len(data) % size_divisor == 0:
        return data, 0
    if len(data) == 0:
        raise ValueError("cannot pad an empty DataProto")
    pad_size = size_divisor - len(data) % size_divisor
    pieces, remaining = [data], pad_size
    while remaining > 0:
        take = min(remaining, len(data))
        pieces.append(data[:take])
        remaining -= take
    return DataProto.concat(pieces), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    return data[:-pad_size] if pad_size else data


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Group consecutive rows: ``[B, ...]`` becomes ``new_batch_size`` rows of ``[B // new_batch_size, ...]``
    (tensors and non-tensors alike; the batch keeps its one batch dimension)."""
    total = len(data)
    if new_batch_size <= 0 or total % new_batch_size:
        raise InvalidDataError(f"fold_batch_dim: {total} rows do not fold into a first dim of {new_batch_size}")
    inner = total // new_batch_size
    batch = None
    if data.batch is not None:
        tensors = {k: v.reshape(new_batch_size, inner, *v.shape[1:]) for k, v in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[new_batch_size], device=data.batch.device)
    non_tensor = {k: v.reshape(new_batch_size, inner, *v.shape[1:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Inverse of :func:`fold_batch_dim`: the first ``batch_dims`` dims of every entry become the rows."""
    if batch_dims < 1:
        raise InvalidDataError(f"unfold_batch_dim: batch_dims must be >= 1, got {batch_dims}")
    batch = None
    if data.batch is not None:
        leading = {k: tuple(v.shape[:batch_dims]) for k, v in data.batch.items()}
        if len(set(leading.values())) > 1:
            raise InvalidDataError(f"unfold_batch_dim: tensors disagree on their first {batch_dims} dims: {leading}")
        rows = int(np.prod(next(iter(leading.values())))) if leading else len(data)
        tensors = {k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[rows], device=data.batch.device)
    non_tensor = {}
    for key, value in data.non_tensor_batch.items():
        flat = value.reshape(-1, *value.shape[batch_dims:])
        non_tensor[key] = as_object_array(list(flat)) if flat.ndim > 1 else flat
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def collate_fn(x: list[DataProtoItem]) -> DataProto:
    """Stack a list of `DataProtoItem` rows back into a `DataProto` (the meta_info of the first row is kept)."""
    if not x:
        raise ValueError("collate_fn needs at least one DataProtoItem")
    batch = None
    if x[0].batch is not None:
        batch = torch.stack([item.batch for item in x]).contiguous()
    non_tensor = {k: as_object_array([item.non_tensor_batch[k] for item in x]) for k in x[0].non_tensor_batch}
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=x[0].meta_info)


def all_gather_data_proto(data: DataProto, process_group=None) -> None:
    """All-gather ``data`` across ``process_group`` in place: afterwards every rank holds all ranks' rows,
    ordered by rank. Every rank must hold the same number of rows."""
    import torch.distributed as dist

    world = dist.get_world_size(group=process_group)
    sizes: list[int] = [0] * world
    dist.all_gather_object(sizes, len(data), group=process_group)
    if len(set(sizes)) > 1:
        raise ValueError(f"all_gather_data_proto needs equal row counts on every rank, got {sizes}")
    if data.batch is not None:
        gathered = {}
        for key, value in data.batch.items():
            parts = [torch.empty_like(value) for _ in range(world)]
            dist.all_gather(parts, value.contiguous(), group=process_group)
            gathered[key] = torch.cat(parts, dim=0)
        data.batch = TensorDict(gathered, batch_size=[len(data) * world], device=data.batch.device)
    objects: list[Any] = [None] * world
    dist.all_gather_object(objects, data.non_tensor_batch, group=process_group)
    data.non_tensor_batch = {k: np.concatenate([o[k] for o in objects]) for k in data.non_tensor_batch}


def list_of_dict_to_dict_of_list(list_of_dict: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """``[{"a": 1, "b": 2}, {"a": 3, "b": 4}]`` → ``{"a": [1, 3], "b": [2, 4]}``. Every dict must have the keys of
    the first (``KeyError`` naming the row and key otherwise); an empty list gives ``{}``."""
    if not list_of_dict:
        return {}
    output: dict[str, list] = {key: [] for key in list_of_dict[0]}
    for i, row in enumerate(list_of_dict):
        if row.keys() != output.keys():
            extra = sorted(set(row) - set(output))
            missing = sorted(set(output) - set(row))
            raise KeyError(
                f"list_of_dict[{i}] has keys differing from the first dict: extra {extra}, missing {missing}"
            )
        for key, value in row.items():
            output[key].append(value)
    return output


def numpy_dict_to_tensor_dict(numpy_dict: Mapping[str, np.ndarray]) -> TensorDict:
    """A TensorDict of ``torch.from_numpy`` views of the (numeric) arrays; the batch size is their common first
    dimension."""
    tensors = {key: torch.from_numpy(np.asarray(value)) for key, value in numpy_dict.items()}
    sizes = {t.shape[0] for t in tensors.values() if t.dim() > 0}
    return TensorDict(tensors, batch_size=[sizes.pop()] if len(sizes) == 1 else [])


def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """``(dtype name, shape, bytes as a uint8 numpy array)`` of a dense tensor (copied to CPU and made contiguous
    when needed; otherwise the array shares the tensor's memory)."""
    if not isinstance(obj, torch.Tensor) or obj.is_nested:
        raise TypeError(f"serialize_single_tensor needs a dense tensor, got {type(obj).__name__}")
    flat = obj.detach().to("cpu").contiguous().reshape(-1)
    return str(obj.dtype).removeprefix("torch."), tuple(obj.shape), flat.view(torch.uint8).numpy()


def deserialize_single_tensor(arr: tuple[str, Sequence[int], Any]) -> torch.Tensor:
    """Inverse of :func:`serialize_single_tensor` (the buffer is copied when it is read-only)."""
    dtype_name, shape, data = arr
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"deserialize_single_tensor: unknown dtype {dtype_name!r}")
    buffer = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if not buffer.flags.writeable:
        buffer = buffer.copy()
    return torch.from_numpy(buffer).view(dtype).reshape(tuple(shape))


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, tuple]]:
    """``(batch_size, device, {key: encoded})`` of a TensorDict of tensors: a dense tensor is encoded by
    :func:`serialize_single_tensor`, a nested tensor as ``(layout name, [encoded row, ...])``."""
    encoded: dict[str, tuple] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"serialize_tensordict: {key!r} is a {type(value).__name__}, only tensors are supported")
        if value.is_nested:
            layout = str(value.layout).removeprefix("torch.")
            encoded[key] = (layout, [serialize_single_tensor(row) for row in value.unbind(0)])
        else:
            encoded[key] = serialize_single_tensor(value)
    device = None if batch.device is None else str(batch.device)
    return tuple(batch.batch_size), device, encoded


def deserialize_tensordict(arr: tuple[Sequence[int], str | None, Mapping[str, tuple]]) -> TensorDict:
    """Inverse of :func:`serialize_tensordict`."""
    batch_size, device, encoded = arr
    decoded = {}
    for key, value in encoded.items():
        if len(value) == 2:  # (layout, rows): a nested tensor
            layout, rows = value
            decoded[key] = torch.nested.as_nested_tensor(
                [deserialize_single_tensor(row) for row in rows], layout=getattr(torch, layout)
            )
        else:
            decoded[key] = deserialize_single_tensor(value)
    return TensorDict(decoded, batch_size=tuple(batch_size), device=device)
