"""Weight sync from the trainer to the rollout engine, and its bit-exact verification.

A checkpoint engine takes the trainer's full tensors (gathered from its shards by the training engine, one at a
time) and loads them into the rollout engine in size-bounded buckets, cast to the rollout dtype. With
``verify=True`` it digests every tensor as it streams past and afterwards checks the engine's weights against
those digests, bit for bit — a corrupted, missing or extra tensor raises `WeightSyncError` naming it.

Backends are registered by name (``actor_rollout_ref.rollout.checkpoint_engine.backend``); ``naive`` is the
colocated, in-process one; ``shm`` (:mod:`verl.checkpoint_engine.shm`) pushes into an engine of another process of
the node through shared memory.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch

from verl.utils.torch_dtypes import to_torch_dtype

__all__ = [
    "CheckpointEngine",
    "CheckpointEngineRegistry",
    "ColocatedCheckpointEngine",
    "WeightSyncError",
    "get_checkpoint_engine",
    "register_checkpoint_engine",
    "tensor_digest",
]

logger = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """The rollout engine's weights do not equal the trainer's after a sync."""


class SupportsWeights(Protocol):
    """What a checkpoint engine needs of a rollout engine."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...


def tensor_digest(tensor: torch.Tensor) -> str:
    """A digest of a tensor's dtype, shape and exact bytes."""
    data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    digest = hashlib.blake2b(data.tobytes(), digest_size=16)
    digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    return digest.hexdigest()


def _to_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None:
        return None
    try:
        return to_torch_dtype(dtype)
    except ValueError as exc:
        raise ValueError(f"rollout dtype: {exc}") from None


class CheckpointEngine:
    """Base class: stream named tensors into a rollout engine; optionally verify the result."""

    def __init__(self, bucket_megabytes: float = 2048, dtype: torch.dtype | str | None = None, **kwargs: Any):
        if bucket_megabytes <= 0:
            raise ValueError(
                f"rollout.checkpoint_engine.update_weights_bucket_megabytes must be positive, got {bucket_megabytes}"
            )
        self.bucket_bytes = int(bucket_megabytes * 2**20)
        self.dtype = _to_dtype(dtype)

    def send_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], rollout: SupportsWeights, verify: bool = False
    ) -> dict[str, float]:
        raise NotImplementedError

    def bucket_limit(self, rollout: Any) -> int:
        """The most bytes one bucket may take for ``rollout`` (``update_weights_bucket_megabytes``; a backend with a
        fixed buffer may allow less)."""
        return self.bucket_bytes

    @staticmethod
    def footprint(nbytes: int) -> int:
        """The room a tensor of ``nbytes`` takes in a bucket (a backend that aligns tensors rounds it up)."""
        return nbytes

    @staticmethod
    def verify(rollout: SupportsWeights, expected: dict[str, str]) -> None:
        """Check the engine's weights against ``expected`` digests; raise `WeightSyncError` naming mismatches. An
        engine in another process digests its own tensors (``weight_digests()``)."""
        if hasattr(rollout, "weight_digests"):
            actual = rollout.weight_digests()
        else:
            actual = {name: tensor_digest(t) for name, t in rollout.named_weights()}
        missing = sorted(set(expected) - set(actual))
        differ = sorted(n for n in expected if n in actual and actual[n] != expected[n])
        extra = sorted(set(actual) - set(expected))
        if missing or differ:
            raise WeightSyncError(
                "rollout weights differ from the trainer's after sync: "
                + "; ".join(
                    part
                    for part in (
                        f"{len(differ)} tensor(s) differ: {differ[:8]}" if differ else "",
                        f"{len(missing)} not in the engine: {missing[:8]}" if missing else "",
                    )
                    if part
                )
            )
        if extra:
            logger.debug("rollout holds %d tensors the trainer did not send (e.g. %s)", len(extra), extra[:4])


class ColocatedCheckpointEngine(CheckpointEngine):
    """``naive``: trainer and rollout share the process; tensors go straight into the engine, bucket by bucket."""

    def send_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], rollout: SupportsWeights, verify: bool = False
    ) -> dict[str, float]:
        """Load ``named_tensors`` into ``rollout``. Returns ``{"bytes", "tensors", "buckets", "seconds"}``."""
        start = time.perf_counter()
        limit = self.bucket_limit(rollout)
        digests: dict[str, str] = {}
        bucket: list[tuple[str, torch.Tensor]] = []
        bucket_bytes = total_bytes = tensors = buckets = 0
        for name, tensor in named_tensors:
            tensor = tensor.detach()
            if self.dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(self.dtype)
            if verify:
                digests[name] = tensor_digest(tensor)
            size = tensor.numel() * tensor.element_size()
            footprint = self.footprint(size)
            if bucket and bucket_bytes + footprint > limit:
                rollout.update_weights(bucket)
                bucket, bucket_bytes, buckets = [], 0, buckets + 1
            bucket.append((name, tensor))
            bucket_bytes += footprint
            total_bytes += size
            tensors += 1
        if bucket:
            rollout.update_weights(bucket)
            buckets += 1
        if verify:
            self.verify(rollout, digests)
        return {
            "bytes": float(total_bytes),
            "tensors": float(tensors),
            "buckets": float(buckets),
            "seconds": time.perf_counter() - start,
        }


class CheckpointEngineRegistry:
    """Name → checkpoint-engine class (``rollout.checkpoint_engine.backend``)."""

    _registry: dict[str, type[CheckpointEngine]] = {}

    @classmethod
    def register(cls, name: str) -> Callable[[type[CheckpointEngine]], type[CheckpointEngine]]:
        def decorator(engine_cls: type[CheckpointEngine]) -> type[CheckpointEngine]:
            existing = cls._registry.get(name)
            if existing is not None and existing is not engine_cls:
                raise ValueError(f"checkpoint engine {name!r} is already registered to {existing.__name__}")
            cls._registry[name] = engine_cls
            return engine_cls

        return decorator

    @classmethod
    def get(cls, name: str) -> type[CheckpointEngine]:
        if name not in cls._registry:
            raise ValueError(f"unknown rollout.checkpoint_engine.backend {name!r}; registered: {sorted(cls._registry)}")
        return cls._registry[name]


register_checkpoint_engine = CheckpointEngineRegistry.register
register_checkpoint_engine("naive")(ColocatedCheckpointEngine)


def __getattr__(name: str) -> Any:
    """veRL 0.10's path ``verl.checkpoint_engine.base.CheckpointEngineManager`` (it lives in
    :mod:`verl.checkpoint_engine.manager`, which imports this module)."""
    if name == "CheckpointEngineManager":
        from verl.checkpoint_engine.manager import CheckpointEngineManager

        return CheckpointEngineManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_checkpoint_engine(config: Any = None, dtype: torch.dtype | str | None = None) -> CheckpointEngine:
    """Build the checkpoint engine named by ``config.backend`` (a mapping or config object; default ``naive``)."""
    get = config.get if hasattr(config, "get") else (lambda key, default=None: getattr(config, key, default))
    backend = get("backend", "naive") if config is not None else "naive"
    bucket = get("update_weights_bucket_megabytes", 2048) if config is not None else 2048
    kwargs = dict(get("engine_kwargs", {}) or {}) if config is not None else {}
    return CheckpointEngineRegistry.get(backend)(bucket_megabytes=bucket, dtype=dtype, **kwargs)
