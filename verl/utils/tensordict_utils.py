"""Helpers over TensorDicts and numpy object arrays that `DataProto` is built on.

Unions that refuse to overwrite conflicting values, a numpy object-array builder that never broadcasts nested
lists, and a serialization of a TensorDict into raw numpy byte buffers (fast to pickle, and out-of-band, so
zero-copy on the way into Ray's object store).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = [
    "as_object_array",
    "deep_equal",
    "pack_tensordict",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpack_tensordict",
]


def as_object_array(values: Iterable[Any] | np.ndarray) -> np.ndarray:
    """A 1-D numpy array of dtype object with one entry per element of ``values``.

    ``np.array(list_of_equal_length_lists, dtype=object)`` silently builds a 2-D array; this never does.
    An ndarray that is already 1-D is kept as it is (whatever its dtype).
    """
    if isinstance(values, np.ndarray) and values.ndim >= 1:
        return values
    items = list(values)
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def deep_equal(a: Any, b: Any) -> bool:
    """Structural equality that understands tensors and numpy arrays nested in dicts, lists and tuples."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a.cpu(), b.cpu()))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        return all(deep_equal(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b))
    try:
        result = a == b
        return bool(result)
    except Exception:  # objects whose == is ambiguous or raises are unequal unless identical
        return False


def union_two_dict(dict1: dict, dict2: Mapping) -> dict:
    """Add ``dict2``'s entries to ``dict1`` (in place, returned); a key present in both must hold equal values."""
    for key, value in dict2.items():
        if key in dict1 and not deep_equal(dict1[key], value):
            raise ValueError(f"cannot union: key {key!r} holds different values ({dict1[key]!r} vs {value!r})")
        dict1[key] = value
    return dict1


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add ``tensor_dict2``'s tensors to ``tensor_dict1`` (in place, returned).

    Both must have the same batch size; a key present in both must hold equal tensors.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(
            f"cannot union TensorDicts of batch sizes {list(tensor_dict1.batch_size)} and "
            f"{list(tensor_dict2.batch_size)}"
        )
    for key in tensor_dict2.keys():
        value = tensor_dict2[key]
        if key in tensor_dict1.keys():
            if not deep_equal(tensor_dict1[key], value):
                raise ValueError(f"cannot union: batch key {key!r} holds different tensors in the two batches")
            continue
        tensor_dict1[key] = value
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: Mapping[str, np.ndarray]) -> dict:
    """Add ``tensor_dict2``'s arrays to ``tensor_dict1`` (in place, returned); shared keys must hold equal arrays."""
    for key, value in tensor_dict2.items():
        if key in tensor_dict1:
            if len(tensor_dict1[key]) != len(value) or not deep_equal(tensor_dict1[key], value):
                raise ValueError(f"cannot union: non-tensor key {key!r} holds different values in the two batches")
            continue
        tensor_dict1[key] = value
    return tensor_dict1


def pack_tensordict(td: TensorDict) -> dict[str, Any]:
    """Serialize a TensorDict's tensor leaves as raw uint8 numpy buffers plus a small index.

    Each buffer is a zero-copy view of a (CPU, contiguous) tensor, so ``pickle`` copies the bytes once and Ray
    ships them out of band. Measured on a 224 MiB batch this is ~1.8x faster than first consolidating all leaves
    into one buffer (which costs an extra full copy) and faster than ``torch.save`` (docs/benchmarks.md).

    Returns a dict with ``leaves`` (key, dtype, shape, buffer per leaf), ``batch_size`` and ``device``.
    """
    leaves = []
    for key, tensor in td.items(include_nested=True, leaves_only=True):
        if not isinstance(tensor, torch.Tensor):
            continue
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        leaves.append((key, tensor.dtype, tuple(tensor.shape), flat.view(torch.uint8).numpy()))
    return {
        "leaves": leaves,
        "batch_size": tuple(td.batch_size),
        "device": None if td.device is None else str(td.device),
    }


def unpack_tensordict(packed: Mapping[str, Any]) -> TensorDict:
    """Inverse of :func:`pack_tensordict`; tensors share memory with the buffers (copied once if read-only)."""
    out = TensorDict({}, batch_size=packed["batch_size"])
    for key, dtype, shape, buffer in packed["leaves"]:
        if not buffer.flags.writeable:  # e.g. a zero-copy buffer from Ray's object store
            buffer = buffer.copy()
        out[key] = torch.from_numpy(buffer).view(dtype).reshape(shape)
    if packed["device"] is not None:
        out = out.to(packed["device"])
    return out
