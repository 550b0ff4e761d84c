"""Helpers over TensorDicts and numpy object arrays that `DataProto` is built on.

Unions that refuse to overwrite conflicting values, a numpy object-array builder that never broadcasts nested
lists, and a compact serialization of a TensorDict into one contiguous byte buffer (fast to pickle, and zero-copy
for Ray's object store, which ships numpy buffers out of band).
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

_ALIGN = 16  # byte alignment of every tensor in a packed buffer (enough for any dtype, complex128 included)


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
    """Serialize a TensorDict's leaves into one contiguous uint8 numpy buffer plus a small index.

    Returns a dict with ``buffer`` (np.uint8 array), ``index`` (key, dtype, shape, offset per leaf), ``batch_size``
    and ``device``. Tensors are moved to CPU; each starts at a 16-byte-aligned offset.
    """
    leaves = [(k, v) for k, v in td.items(include_nested=True, leaves_only=True) if isinstance(v, torch.Tensor)]
    index, chunks, offset = [], [], 0
    for key, tensor in leaves:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.element_size() > 0 and flat.numel() > 0 else flat.new_empty(0).byte()
        pad = (-offset) % _ALIGN
        if pad:
            chunks.append(torch.zeros(pad, dtype=torch.uint8))
            offset += pad
        index.append((key, tensor.dtype, tuple(tensor.shape), offset))
        chunks.append(raw)
        offset += raw.numel()
    buffer = torch.cat(chunks).numpy() if chunks else np.empty(0, dtype=np.uint8)
    return {
        "buffer": buffer,
        "index": index,
        "batch_size": tuple(td.batch_size),
        "device": None if td.device is None else str(td.device),
    }


def unpack_tensordict(packed: Mapping[str, Any]) -> TensorDict:
    """Inverse of :func:`pack_tensordict`. The tensors are views into one buffer (copied once if read-only)."""
    buffer = packed["buffer"]
    if not buffer.flags.writeable:  # e.g. a zero-copy buffer from Ray's object store
        buffer = buffer.copy()
    storage = torch.from_numpy(buffer)
    out = TensorDict({}, batch_size=packed["batch_size"])
    for key, dtype, shape, offset in packed["index"]:
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        out[key] = storage[offset : offset + nbytes].view(dtype).reshape(shape)
    if packed["device"] is not None:
        out = out.to(packed["device"])
    return out
