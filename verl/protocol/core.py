"""`DataProto` and its row (`DataProtoItem`) and the auto-padding switch (`DataProtoConfig`).

The helpers over these types are in :mod:`verl.protocol.ops` and the future of a worker group's output in
:mod:`verl.protocol.future` (both import this module, never the other way);
:mod:`verl.protocol` re-exports both under veRL's names.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.utils.errors import InvalidDataError
from verl.utils.tensordict_import import NonTensorData, NonTensorStack, TensorDict
from verl.utils.tensordict_utils import (
    as_object_array,
    deep_equal,
    pack_tensordict,
    union_numpy_dict,
    union_tensor_dict,
    unpack_tensordict,
)

__all__ = ["DataProto", "DataProtoConfig", "DataProtoItem"]

logger = logging.getLogger(__name__)


class _DataProtoConfigMeta(type):
    """Holds the process-wide auto-padding switch (env ``VERL_AUTO_PADDING`` sets its initial value)."""

    _config: dict[str, bool] = {}
    auto_padding_key = "_verl_auto_padding"

    @property
    def auto_padding(cls) -> bool:
        env = os.getenv("VERL_AUTO_PADDING", "FALSE").upper() in ("TRUE", "1")
        return env or cls._config.get(cls.auto_padding_key, False)

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._config[cls.auto_padding_key] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """``DataProtoConfig.auto_padding = True`` lets every DataProto be padded when split unevenly across workers."""


def _merge_metrics(parts: list[dict | list[dict] | None]) -> dict[str, list]:
    """Per-worker metrics → one dict of lists. A worker's metrics are a dict (of scalars or lists), a list of such
    dicts, or None (no metrics); a scalar counts as a one-element list."""
    merged: dict[str, list] = {}
    for part in parts:
        if part is None:
            continue
        for metrics in part if isinstance(part, list | tuple) else [part]:
            if not isinstance(metrics, Mapping):
                raise InvalidDataError(
                    f"meta_info['metrics'] must be a dict or a list of dicts, got an entry of type "
                    f"{type(metrics).__name__}"
                )
            for name, value in metrics.items():
                merged.setdefault(name, []).extend(value if isinstance(value, list) else [value])
    return merged


def _merge_meta(parts: list[dict]) -> dict:
    """The meta_info of joined DataProtos: ``metrics`` merged (:func:`_merge_metrics`), every other key kept once;
    a key present in several parts must hold equal values (`InvalidDataError` naming it)."""
    merged: dict = {}
    for part in parts:
        for key, value in part.items():
            if key == "metrics":
                continue
            if key in merged and not deep_equal(merged[key], value):
                raise InvalidDataError(
                    f"Conflicting values for meta_info key {key!r}: {merged[key]!r} vs {value!r}; the parts must "
                    "agree on every meta_info key except 'metrics'"
                )
            merged.setdefault(key, value)
    metrics = _merge_metrics([part.get("metrics") for part in parts])
    if metrics:
        merged["metrics"] = metrics
    return merged


def _chunk_sizes(total: int, chunks: int) -> list[int]:
    """Sizes of ``torch.chunk``: ceil-sized pieces, the last one smaller, possibly fewer than ``chunks`` pieces."""
    if chunks <= 0:
        raise ValueError(f"chunks must be positive, got {chunks}")
    if total == 0:
        return [0] * chunks
    size = -(-total // chunks)
    sizes = [size] * (total // size)
    if total % size:
        sizes.append(total % size)
    return sizes


def _as_index_tensor(idxs: Any, length: int) -> torch.Tensor:
    """Normalize an int list / ndarray / tensor / bool mask to a 1-D int64 index tensor, checking bounds."""
    if isinstance(idxs, torch.Tensor):
        idx = idxs.detach().cpu()
    else:
        idx = torch.as_tensor(np.asarray(idxs))
    if idx.dim() == 0:
        idx = idx.reshape(1)
    if idx.dim() != 1:
        raise ValueError(f"row index must be 1-D, got shape {tuple(idx.shape)}")
    if idx.dtype == torch.bool:
        if idx.numel() != length:
            raise ValueError(f"boolean mask has {idx.numel()} entries but the DataProto has {length} rows")
        return idx.nonzero(as_tuple=True)[0]
    if idx.numel() == 0:
        return idx.to(torch.int64)
    if idx.is_floating_point():
        raise TypeError(f"row index must hold integers or booleans, got dtype {idx.dtype}")
    idx = idx.to(torch.int64)
    if int(idx.max()) >= length or int(idx.min()) < -length:
        raise IndexError(f"row index out of range for a DataProto of {length} rows: {idx.tolist()[:16]}")
    return torch.where(idx < 0, idx + length, idx)


def _split_columns(key: str, value: Any, n_split: int) -> Any:
    """``value`` of shape ``(rows, cols, ...)`` as ``(rows * n_split, cols // n_split, ...)`` (tensor or array)."""
    if value.ndim < 2 or value.shape[1] % n_split:
        raise InvalidDataError(
            f"unfold_column_chunks: {key!r} of shape {tuple(value.shape)} has no dim 1 that splits into {n_split} "
            "equal chunks"
        )
    return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])


def _as_table(key: str, value: np.ndarray) -> np.ndarray:
    """A non-tensor column as an array of at least 2 dims: kept when it has them, else one row per sequence."""
    if value.ndim >= 2:
        return value
    lengths = {len(row) if isinstance(row, Sequence | np.ndarray) and not isinstance(row, str) else -1 for row in value}
    if -1 in lengths or len(lengths) > 1:
        raise InvalidDataError(
            f"unfold_column_chunks: non-tensor {key!r} needs one sequence of the same length per row to split its "
            "columns"
        )
    table = np.empty((len(value), lengths.pop() if lengths else 0), dtype=object)
    for i, row in enumerate(value):
        table[i, :] = list(row)
    return table


@dataclass
class DataProtoItem:
    """One row of a `DataProto` (``DataProto[i]``)."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    """A batch of rows: tensors in ``batch``, per-row Python objects in ``non_tensor_batch``, and ``meta_info``."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.non_tensor_batch is None:
            self.non_tensor_batch = {}
        if self.meta_info is None:
            self.meta_info = {}
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from a dict of tensors sharing their leading ``num_batch_dims`` dims, plus per-row non-tensors."""
        tensors = tensors or {}
        non_tensors = non_tensors or {}
        if num_batch_dims != 1:
            raise InvalidDataError(
                f"DataProto has exactly one batch dimension, got num_batch_dims={num_batch_dims}; keep the extra "
                "dimensions inside the tensors (fold_batch_dim does that)"
            )
        if not tensors and not non_tensors:
            raise ValueError("DataProto.from_dict needs at least one tensor or non-tensor entry")
        batch = None
        if tensors:
            shapes = {k: tuple(v.shape[:num_batch_dims]) for k, v in tensors.items()}
            if len(set(shapes.values())) > 1:
                raise InvalidDataError(f"tensors disagree on their leading 1 batch dim: {shapes}")
            batch = TensorDict(source=dict(tensors), batch_size=next(iter(shapes.values())))
        meta_info = dict(meta_info or {})
        if auto_padding:
            meta_info[DataProtoConfig.auto_padding_key] = True
        non_tensor_batch = {k: as_object_array(v) for k, v in non_tensors.items()}
        return cls(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=meta_info)

    @classmethod
    def from_single_dict(
        cls, data: dict[str, torch.Tensor | np.ndarray], meta_info: dict | None = None, auto_padding: bool = False
    ) -> DataProto:
        """Build from one flat dict: tensors go to ``batch``, numpy arrays to ``non_tensor_batch``."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise TypeError(
                    f"from_single_dict: value of {key!r} must be a torch.Tensor or np.ndarray, got "
                    f"{type(value).__name__}"
                )
        return cls.from_dict(tensors, non_tensors, meta_info=meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDict, meta_info: dict | None = None, num_batch_dims: int = 1
    ) -> DataProto:
        """Build from a TensorDict: tensors → batch, ``NonTensorStack`` → non_tensor_batch, ``NonTensorData`` →
        meta_info."""
        tensors, non_tensors, meta = {}, {}, dict(meta_info or {})
        for key, value in tensor_dict.items():
            if isinstance(value, NonTensorStack):
                non_tensors[key] = as_object_array(value.tolist())
            elif isinstance(value, NonTensorData):
                meta[key] = value.data
            else:
                tensors[key] = value
        if not tensors:
            batch_size = tuple(tensor_dict.batch_size[:num_batch_dims])
            data = cls(batch=None, non_tensor_batch=non_tensors, meta_info=meta)
            if non_tensors and len(data) != batch_size[0]:
                raise ValueError(f"non-tensor rows ({len(data)}) do not match the TensorDict batch {batch_size}")
            return data
        return cls.from_dict(tensors, non_tensors, meta, num_batch_dims=num_batch_dims)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding tensors, non-tensors (as ``NonTensorStack``) and meta_info (``NonTensorData``)."""
        out = self.batch.clone(recurse=False) if self.batch is not None else TensorDict({}, batch_size=[len(self)])
        for key, value in self.non_tensor_batch.items():
            out[key] = NonTensorStack.from_list(list(value))
        for key, value in self.meta_info.items():
            out.set_non_tensor(key, value)
        return out

    # ------------------------------------------------------------------ invariants
    def check_consistency(self) -> None:
        """Raise if the batch has other than one batch dimension, non-tensors are not numpy arrays (of at least one
        dimension, the row), or tensors and non-tensors disagree on the number of rows."""
        if self.batch is not None and len(self.batch.batch_size) != 1:
            raise InvalidDataError(
                f"DataProto.batch must have exactly one batch dimension (the row), got batch_size "
                f"{list(self.batch.batch_size)}"
            )
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                raise TypeError(
                    f"non_tensor_batch[{key!r}] must be a numpy array with one entry per row (e.g. "
                    f"np.array(values, dtype=object)), got {type(value).__name__}"
                )
        if not self.non_tensor_batch:
            return
        lengths = {key: len(value) for key, value in self.non_tensor_batch.items()}
        expected = self.batch.batch_size[0] if self.batch is not None else next(iter(lengths.values()))
        wrong = {k: n for k, n in lengths.items() if n != expected}
        if wrong:
            raise InvalidDataError(f"non_tensor_batch lengths {wrong} do not match the batch size {expected}")

    def __len__(self) -> int:
        if self.batch is not None:
            return self.batch.batch_size[0]
        if self.non_tensor_batch:
            return len(next(iter(self.non_tensor_batch.values())))
        return 0

    def is_padding_enabled(self) -> bool:
        """True when this batch (meta flag) or the process (``DataProtoConfig.auto_padding``) allows padding."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding

    # ------------------------------------------------------------------ row selection
    def __getitem__(self, item: Any) -> DataProto | DataProtoItem:
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, int | np.integer):
            index = int(item)
            if not -len(self) <= index < len(self):
                raise IndexError(f"row {index} out of range for a DataProto of {len(self)} rows")
            return DataProtoItem(
                batch=self.batch[index] if self.batch is not None else None,
                non_tensor_batch={k: v[index] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(item, list | tuple | np.ndarray | torch.Tensor):
            return self.select_idxs(item)
        raise TypeError(f"DataProto indices must be int, slice, list, ndarray or tensor, not {type(item).__name__}")

    def select_idxs(self, idxs: Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor) -> DataProto:
        """Rows at ``idxs`` (ints, negatives allowed, or a boolean mask), in that order."""
        index = _as_index_tensor(idxs, len(self))
        return self._take(index)

    def _take(self, index: torch.Tensor) -> DataProto:
        batch = None
        if self.batch is not None:
            batch = self.batch[index.to(self.batch.device) if self.batch.device is not None else index]
        index_np = index.numpy()
        non_tensor = {k: v[index_np] for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step`` as a new DataProto (tensors are views)."""
        sl = slice(start, end, step)
        batch = self.batch[sl] if self.batch is not None else None
        non_tensor = {k: v[sl] for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    # ------------------------------------------------------------------ key selection
    @staticmethod
    def _check_keys(kind: str, wanted: Sequence[str] | None, available) -> None:
        missing = [k for k in (wanted or []) if k not in available]
        if missing:
            raise KeyError(f"{kind} keys {missing} not found; available: {sorted(map(str, available))}")

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto holding only the named keys (``None`` keeps all of that kind). Tensors are shared."""
        if batch_keys is None:
            batch = self.batch
        else:
            self._check_keys("batch", batch_keys, self.batch.keys() if self.batch is not None else [])
            batch = self.batch.select(*batch_keys)
        if non_tensor_batch_keys is None:
            non_tensor = dict(self.non_tensor_batch)
        else:
            self._check_keys("non_tensor_batch", non_tensor_batch_keys, self.non_tensor_batch)
            non_tensor = {k: self.non_tensor_batch[k] for k in non_tensor_batch_keys}
        if meta_info_keys is None:
            meta = dict(self.meta_info)
        else:
            self._check_keys("meta_info", meta_info_keys, self.meta_info)
            meta = {k: self.meta_info[k] for k in meta_info_keys}
        if deepcopy:
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
            batch = batch.clone() if batch is not None else None
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from self (in place) and return them as a new DataProto."""
        batch_keys, non_tensor_batch_keys, meta_info_keys = (
            list(batch_keys or []),
            list(non_tensor_batch_keys or []),
            list(meta_info_keys or []),
        )
        self._check_keys("batch", batch_keys, self.batch.keys() if self.batch is not None else [])
        self._check_keys("non_tensor_batch", non_tensor_batch_keys, self.non_tensor_batch)
        self._check_keys("meta_info", meta_info_keys, self.meta_info)
        tensors = {k: self.batch.pop(k) for k in batch_keys}
        non_tensors = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
        meta = {k: self.meta_info.pop(k) for k in meta_info_keys}
        if not tensors:
            return type(self)(batch=None, non_tensor_batch=non_tensors, meta_info=meta)
        return type(self).from_dict(tensors, non_tensors, meta)

    def rename(self, old_keys: str | Sequence[str] | None = None, new_keys: str | Sequence[str] | None = None):
        """Rename batch (tensor) keys in place; returns self."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys or [])
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys or [])
        if len(old) != len(new):
            raise ValueError(f"rename needs as many new keys as old ones: {old} vs {new}")
        self._check_keys("batch", old, self.batch.keys() if self.batch is not None else [])
        for old_key, new_key in zip(old, new):
            self.batch.rename_key_(old_key, new_key)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other``'s keys into self (in place; returns self). Keys present in both must be equal, except
        ``meta_info["metrics"]``, whose dicts of lists are merged as in :meth:`concat`."""
        if len(self) != len(other) and (self.batch is not None or self.non_tensor_batch):
            raise InvalidDataError(f"cannot union DataProtos of {len(self)} and {len(other)} rows")
        if other.batch is not None:
            self.batch = other.batch if self.batch is None else union_tensor_dict(self.batch, other.batch)
        self.non_tensor_batch = union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        self.meta_info = _merge_meta([self.meta_info, other.meta_info])
        return self

    # ------------------------------------------------------------------ splitting and joining
    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` pieces along the rows (all pieces share meta_info).

        Without auto-padding the row count must divide evenly; with it, pieces follow ``torch.chunk``'s sizes.
        """
        if not self.is_padding_enabled() and len(self) % chunks != 0:
            raise InvalidDataError(
                f"cannot chunk a DataProto of {len(self)} rows into {chunks} equal parts; pad it first "
                "(pad_dataproto_to_divisor) or enable auto-padding (DataProtoConfig.auto_padding = True)"
            )
        out, start = [], 0
        for size in _chunk_sizes(len(self), chunks):
            piece = self.slice(start, start + size)
            piece.meta_info = self.meta_info
            out.append(piece)
            start += size
        return out

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive pieces of ``split_size`` rows (the last one may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: list[DataProto]) -> DataProto:
        """Join DataProtos row-wise. Their ``meta_info["metrics"]`` (each a dict or a list of dicts) are merged into
        one dict of lists; every other meta_info key is kept, and one present in several parts must hold equal
        values there (`InvalidDataError` naming it)."""
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto")
        kinds = {d.batch is None for d in data}
        if len(kinds) > 1:
            raise ValueError("cannot concat DataProtos where some have a tensor batch and others do not")
        key_sets = {tuple(sorted(d.non_tensor_batch)) for d in data}
        if len(key_sets) > 1:
            raise ValueError(f"cannot concat DataProtos with different non-tensor keys: {sorted(key_sets)}")
        batch = None if data[0].batch is None else torch.cat([d.batch for d in data], dim=0)
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in data[0].non_tensor_batch}
        meta = _merge_meta([d.meta_info for d in data])
        return type(data[0])(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def reorder(self, indices: torch.Tensor) -> None:
        """Permute the rows in place: row ``i`` becomes old row ``indices[i]``."""
        taken = self.select_idxs(indices)
        self.batch, self.non_tensor_batch = taken.batch, taken.non_tensor_batch

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Each row ``repeat_times`` times: ``aabb`` when ``interleave`` else ``abab``."""
        if repeat_times < 1:
            raise ValueError(f"repeat_times must be >= 1, got {repeat_times}")
        rows = torch.arange(len(self))
        index = rows.repeat_interleave(repeat_times) if interleave else rows.repeat(repeat_times)
        return self._take(index)

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Row ``i`` repeated ``repeat_times[i]`` times (consecutively)."""
        counts = torch.as_tensor(np.asarray(repeat_times), dtype=torch.int64).reshape(-1)
        if counts.numel() != len(self):
            raise ValueError(f"sample_level_repeat got {counts.numel()} counts for {len(self)} rows")
        if counts.numel() and int(counts.min()) < 0:
            raise ValueError("sample_level_repeat counts must be non-negative")
        return self._take(torch.arange(len(self)).repeat_interleave(counts))

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
        """Cut dim 1 of each ``split_keys`` entry into ``n_split`` column chunks moved into the row dimension
        (row ``i`` becomes rows ``i*n_split ... i*n_split + n_split - 1``); every other key is repeated to match.

        A split non-tensor key is read as a table: a numpy array of at least 2 dims, or one sequence per row, all of
        one length; the result is an object array of shape ``(rows * n_split, columns // n_split, ...)``.
        """
        split_keys = list(split_keys or [])
        if n_split <= 0:
            raise InvalidDataError(f"unfold_column_chunks: n_split must be positive, got {n_split}")
        known = set(self.batch.keys() if self.batch is not None else []) | set(self.non_tensor_batch)
        self._check_keys("split", split_keys, known)
        batch = None
        if self.batch is not None:
            tensors = {}
            for key, value in self.batch.items():
                if key in split_keys:
                    tensors[key] = _split_columns(key, value, n_split)
                else:
                    tensors[key] = value.repeat_interleave(n_split, dim=0)
            batch = TensorDict(tensors, batch_size=[len(self) * n_split], device=self.batch.device)
        non_tensor = {}
        for key, value in self.non_tensor_batch.items():
            if key in split_keys:
                non_tensor[key] = _split_columns(key, _as_table(key, value), n_split)
            else:
                non_tensor[key] = np.repeat(value, n_split, axis=0)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first (``"first"``) or last (default) row, in place."""
        if padding_size == 0:
            return
        if len(self) == 0:
            raise ValueError("cannot pad an empty DataProto")
        candidate = self.slice(0, 1) if padding_candidate == "first" else self.slice(len(self) - 1, len(self))
        padded = DataProto.concat([self, candidate.repeat(padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[DataProto]:
        """Iterate ``epochs`` times over mini-batches of ``mini_batch_size`` rows.

        ``dataloader_kwargs={"shuffle": True}`` shuffles each epoch with a generator seeded by ``seed``.
        """
        if mini_batch_size <= 0 or len(self) % mini_batch_size != 0:
            raise ValueError(f"make_iterator: {len(self)} rows do not divide into mini-batches of {mini_batch_size}")
        kwargs = dict(dataloader_kwargs or {})
        shuffle = bool(kwargs.pop("shuffle", False))
        kwargs.pop("drop_last", None)
        if kwargs:
            logger.warning("make_iterator ignores dataloader_kwargs %s", sorted(kwargs))
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)

        def _iterate() -> Iterator[DataProto]:
            for _ in range(epochs):
                order = torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
                for start in range(0, len(self), mini_batch_size):
                    piece = self._take(order[start : start + mini_batch_size])
                    piece.meta_info = self.meta_info
                    yield piece

        return _iterate()

    # ------------------------------------------------------------------ devices, persistence, debugging
    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensor batch to ``device`` (in place); returns self."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def __getstate__(self) -> dict[str, Any]:
        # Tensors travel as raw numpy byte buffers: one copy in pickle, out of band (zero-copy) into Ray.
        batch = None
        if self.batch is not None:
            batch = pack_tensordict(self.batch)
        return {"batch": batch, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch = None if state["batch"] is None else unpack_tensordict(state["batch"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, filepath: str | os.PathLike) -> None:
        """Pickle to ``filepath`` (written to a temp file, then renamed into place)."""
        tmp = f"{os.fspath(filepath)}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, filepath)

    @staticmethod
    def load_from_disk(filepath: str | os.PathLike) -> DataProto:
        """Load a DataProto written by :meth:`save_to_disk`."""
        with open(filepath, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, DataProto):
            raise TypeError(f"{os.fspath(filepath)} does not hold a DataProto (found {type(data).__name__})")
        return data

    def get_data_info(self) -> str:
        """A readable summary of the keys, shapes and dtypes."""
        lines = [f"DataProto with {len(self)} rows"]
        for key, value in self.batch.items() if self.batch is not None else []:
            lines.append(f"  batch[{key!r}]: {tuple(value.shape)} {value.dtype}")
        for key, value in self.non_tensor_batch.items():
            lines.append(f"  non_tensor_batch[{key!r}]: {value.shape} {value.dtype}")
        lines.append(f"  meta_info keys: {sorted(map(str, self.meta_info))}")
        return "\n".join(lines)

    def print_size(self, prefix: str = "") -> None:
        """Log the memory the tensors and non-tensors take (in MB)."""
        tensor_bytes = sum(v.numel() * v.element_size() for v in self.batch.values()) if self.batch is not None else 0
        numpy_bytes = sum(v.nbytes for v in self.non_tensor_batch.values())
        logger.info(
            "%sDataProto size: batch %.3f MB, non_tensor_batch %.3f MB",
            prefix,
            tensor_bytes / 2**20,
            numpy_bytes / 2**20,
        )
