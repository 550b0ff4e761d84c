"""`DataProtoFuture`: the not-yet-fetched output of a worker group (DataProtos or TensorDicts behind Ray object
refs), passed as the input of another call without a round trip through the driver."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.protocol.core import DataProto
from verl.utils.tensordict_import import TensorDict
from verl.utils.tensordict_utils import chunk_tensordict, concat_tensordict

__all__ = ["DataProtoFuture"]


def _concat_results(parts: list) -> Any:
    """Join the outputs of the ranks: DataProtos with `DataProto.concat`, TensorDicts with `concat_tensordict`."""
    if parts and all(isinstance(p, DataProto) for p in parts):
        return DataProto.concat(parts)
    if parts and all(isinstance(p, TensorDict) for p in parts):
        return concat_tensordict(parts)
    kinds = sorted({type(p).__name__ for p in parts})
    raise TypeError(f"cannot join worker outputs of types {kinds}: expected all DataProto or all TensorDict")


@dataclass
class DataProtoFuture:
    """A not-yet-materialized DataProto made of Ray object refs (output of one worker group, input of another).

    ``get()`` fetches the refs, joins them with ``collect_fn`` and applies ``dispatch_fn`` (e.g. take chunk ``i``).
    """

    collect_fn: Callable
    futures: list
    dispatch_fn: Callable | None = None

    @staticmethod
    def concat(data: list) -> DataProtoFuture:
        """A future that concatenates the DataProtos (or TensorDicts) behind ``data`` (a list of Ray ObjectRefs)."""
        return DataProtoFuture(collect_fn=_concat_results, futures=list(data))

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """``chunks`` futures; future ``i`` materializes to ``self.get().chunk(chunks)[i]``."""
        return [
            DataProtoFuture(
                collect_fn=self.collect_fn,
                futures=self.futures,
                dispatch_fn=_ChunkSelector(chunks, i, self.dispatch_fn),
            )
            for i in range(chunks)
        ]

    def get(self) -> DataProto:
        """Fetch, join and select."""
        import ray

        output = self.collect_fn(ray.get(self.futures))
        if self.dispatch_fn is not None:
            output = self.dispatch_fn(output)
        return output


@dataclass(frozen=True)
class _ChunkSelector:
    """Picklable ``lambda x: x.chunk(chunks)[index]`` (after an optional earlier selection)."""

    chunks: int
    index: int
    previous: Callable | None = None

    def __call__(self, data: DataProto) -> DataProto:
        if self.previous is not None:
            data = self.previous(data)
        if isinstance(data, TensorDict):
            return chunk_tensordict(data, self.chunks)[self.index]
        return data.chunk(self.chunks)[self.index]
