"""`DataProto`: the batch that moves between the driver and the workers.

A `DataProto` holds three things that always stay row-aligned:

- ``batch``: a ``TensorDict`` whose first dimension is the batch (``input_ids``, ``attention_mask``, ...);
- ``non_tensor_batch``: a dict of 1-D numpy object arrays, one entry per row (``uid``, ``data_source``, ...);
- ``meta_info``: a plain dict of per-batch values (``temperature``, ``metrics`` returned by workers, ...).

Every operation (indexing, chunk, concat, repeat, union, ...) applies the same row selection to tensors and
non-tensors. The public names and semantics follow veRL's ``verl.protocol``: the types live in
:mod:`verl.protocol.core`, the helpers over them in :mod:`verl.protocol.ops` and the future of a worker group's
output in :mod:`verl.protocol.future` (both import ``core``; ``core`` imports neither), and this package re-exports
them. A pickle naming ``verl.protocol.DataProto`` (written before the split) still loads: the name resolves to the
same class. Refused inputs (conflicting values, uneven chunks, ...) raise `InvalidDataError`, a ``ValueError`` that
is also an ``AssertionError`` (what veRL raises there).
"""

from verl.protocol.core import DataProto, DataProtoConfig, DataProtoItem
from verl.protocol.future import DataProtoFuture
from verl.protocol.ops import (
    all_gather_data_proto,
    collate_fn,
    deserialize_single_tensor,
    deserialize_tensordict,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    numpy_dict_to_tensor_dict,
    pad_dataproto_to_divisor,
    serialize_single_tensor,
    serialize_tensordict,
    unfold_batch_dim,
    unpad_dataproto,
)
from verl.utils.errors import InvalidDataError
from verl.utils.tensordict_utils import union_numpy_dict, union_tensor_dict

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "InvalidDataError",
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
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]
